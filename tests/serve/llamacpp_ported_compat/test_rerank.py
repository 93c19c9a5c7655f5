# Ported from llama.cpp, tools/server/tests/unit/test_rerank.py (the version vendored in
# llama-cpp-python 0.3.36), to run against `pyggml serve` through ./utils.py.
#
# MIT License
#
# Copyright (c) 2023-2026 The ggml authors
#
# Permission is hereby granted, free of charge, to any person obtaining a copy
# of this software and associated documentation files (the "Software"), to deal
# in the Software without restriction, including without limitation the rights
# to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
# copies of the Software, and to permit persons to whom the Software is
# furnished to do so, subject to the following conditions:
#
# The above copyright notice and this permission notice shall be included in all
# copies or substantial portions of the Software.
#
# THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
# IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
# FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
# AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
# LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
# OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
# SOFTWARE.
#
# Changes for pyggml: the reranker is the random-weight bert reranker of tests/support/rerank_cases.py (bge's
# WordPiece vocabulary, a one-score head; llama.cpp's preset downloads jina-reranker-v1-tiny), so the ordering
# asserted is the one llama.cpp computes on that file (tests/serve/data/llamacpp_rerank.json's scores, for the
# documents here computed live by pyggml being checked in tests/serve/test_rerank.py), and the usage counts are
# the sum of the pairs' tokens as llama.cpp builds them, not jina's 19 and 26.

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from pyggml.models import load_model
from pyggml.serve.rerank import pair_tokens

from tests.serve.llamacpp_ported_compat.utils import ServerProcess
from tests.support.rerank_cases import LLAMACPP_TEST_DOCUMENTS, write_case

RERANKER = write_case("bert-rank", Path(tempfile.mkdtemp(prefix="pyggml-rerank-")))

server: ServerProcess


def reranker() -> ServerProcess:
    """llama.cpp's ServerPreset.jina_reranker_tiny, on the random-weight bert reranker."""
    process = ServerProcess()
    process.model_file = str(RERANKER)
    process.n_ctx = 512
    process.n_slots = 1
    return process


@pytest.fixture(autouse=True)
def create_server():
    global server
    server = reranker()


TEST_DOCUMENTS = LLAMACPP_TEST_DOCUMENTS  # llama.cpp's list, kept in tests/support/rerank_cases.py
SCORES = json.loads((Path(__file__).parents[1] / "data" / "llamacpp_rerank.json").read_text())[
    "cases"]["bert-rank"]["llamacpp_test_scores"]
EXTREMES = (int(np.argmax(SCORES)), int(np.argmin(SCORES)))   # llama.cpp's best and worst on this file


def test_rerank():
    global server
    server.start()
    res = server.make_request("POST", "/rerank", data={
        "query": "Machine learning is",
        "documents": TEST_DOCUMENTS,
    })
    assert res.status_code == 200
    assert len(res.body["results"]) == 4

    most_relevant = res.body["results"][0]
    least_relevant = res.body["results"][0]
    for doc in res.body["results"]:
        if doc["relevance_score"] > most_relevant["relevance_score"]:
            most_relevant = doc
        if doc["relevance_score"] < least_relevant["relevance_score"]:
            least_relevant = doc

    assert most_relevant["relevance_score"] > least_relevant["relevance_score"]
    # llama.cpp's jina reranker: 2 and 3; on the random-weight file, the indexes of its best and worst scores
    assert (most_relevant["index"], least_relevant["index"]) == EXTREMES


def test_rerank_tei_format():
    global server
    server.start()
    res = server.make_request("POST", "/rerank", data={
        "query": "Machine learning is",
        "texts": TEST_DOCUMENTS,
    })
    assert res.status_code == 200
    assert len(res.body) == 4

    most_relevant = res.body[0]
    least_relevant = res.body[0]
    for doc in res.body:
        if doc["score"] > most_relevant["score"]:
            most_relevant = doc
        if doc["score"] < least_relevant["score"]:
            least_relevant = doc

    assert most_relevant["score"] > least_relevant["score"]
    assert (most_relevant["index"], least_relevant["index"]) == EXTREMES


@pytest.mark.parametrize("documents", [
    [],
    None,
    123,
    [1, 2, 3],
])
def test_invalid_rerank_req(documents):
    global server
    server.start()
    res = server.make_request("POST", "/rerank", data={
        "query": "Machine learning is",
        "documents": documents,
    })
    assert res.status_code == 400
    assert "error" in res.body


@pytest.mark.parametrize(
    "query,doc1,doc2",
    [
        ("Machine learning is", "A machine", "Learning is"),
        ("Which city?", "Machine learning is ", "Paris, capitale de la"),
    ]
)
def test_rerank_usage(query, doc1, doc2):
    global server
    server.start()
    model = load_model(RERANKER, n_ctx=512)
    n_tokens = len(pair_tokens(model, query, doc1)) + len(pair_tokens(model, query, doc2))

    res = server.make_request("POST", "/rerank", data={
        "query": query,
        "documents": [
            doc1,
            doc2,
        ]
    })
    assert res.status_code == 200
    assert res.body['usage']['prompt_tokens'] == res.body['usage']['total_tokens']
    assert res.body['usage']['prompt_tokens'] == n_tokens


@pytest.mark.parametrize("top_n,expected_len", [
    (None, len(TEST_DOCUMENTS)),  # no top_n parameter
    (2, 2),
    (4, 4),
    (99, len(TEST_DOCUMENTS)),    # higher than available docs
])
def test_rerank_top_n(top_n, expected_len):
    global server
    server.start()
    data = {
        "query": "Machine learning is",
        "documents": TEST_DOCUMENTS,
    }
    if top_n is not None:
        data["top_n"] = top_n

    res = server.make_request("POST", "/rerank", data=data)
    assert res.status_code == 200
    assert len(res.body["results"]) == expected_len


@pytest.mark.parametrize("top_n,expected_len", [
    (None, len(TEST_DOCUMENTS)),  # no top_n parameter
    (2, 2),
    (4, 4),
    (99, len(TEST_DOCUMENTS)),    # higher than available docs
])
def test_rerank_tei_top_n(top_n, expected_len):
    global server
    server.start()
    data = {
        "query": "Machine learning is",
        "texts": TEST_DOCUMENTS,
    }
    if top_n is not None:
        data["top_n"] = top_n

    res = server.make_request("POST", "/rerank", data=data)
    assert res.status_code == 200
    assert len(res.body) == expected_len
