"""/v1/rerank and /rerank (pyggml/serve/rerank.py) on random-weight reranker files: each pair's tokens as
llama.cpp's server builds them and its score as llama.cpp computes it (committed references,
data/llamacpp_rerank.json), the order, top_n, TEI's shape with return_text, usage, and errors."""

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from pyggml.models import load_model
from pyggml.serve.app import create_app
from pyggml.serve.rerank import pair_tokens

from tests.support.embedding_cases import F32_SCORE, N_CTX
from tests.support.parity_cases import sha256
from tests.support.rerank_cases import CASES, DOCUMENTS, QUERY, write_case
from tests.support.serve import ServerThread, make_state, write_chat_model

LOGIT_TOL = 2e-3   # F32 logits of pyggml and llama.cpp differ by about 1e-3 after 55 to 73 tokens
REFS = json.loads((Path(__file__).parent / "data" / "llamacpp_rerank.json").read_text())


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    path = write_case(request.param, tmp_path_factory.mktemp("rerank"))
    ref = REFS["cases"][request.param]
    assert sha256(path) == ref["sha256"], f"{request.param}: the file differs from llama.cpp's; rerun the refs"
    with ServerThread(create_app(make_state(path, n_ctx=N_CTX))) as srv:
        yield srv, path, ref


def test_pairs_are_built_as_llamacpps_server_builds_them(case):
    _, path, ref = case
    model = load_model(path, n_ctx=N_CTX)
    assert [pair_tokens(model, QUERY, d) for d in DOCUMENTS] == ref["tokens"]


def test_scores_and_order_are_llamacpps(case):
    srv, _, ref = case
    r = httpx.post(srv.base_url + "/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}, timeout=60).json()
    expected = np.asarray(ref["scores"])
    got = np.full(len(DOCUMENTS), np.nan)
    for result in r["results"]:
        got[result["index"]] = result["relevance_score"]
    # Qwen3's scores are probabilities: one near 0 carries the logits' float differences relatively
    # (dp / p = (1 - p) d logit), hence the rtol beside the embedding tests' bound relative to the largest score
    np.testing.assert_allclose(got, expected, rtol=LOGIT_TOL, atol=F32_SCORE * np.abs(expected).max())
    assert [x["index"] for x in r["results"]] == np.argsort(-got, kind="stable").tolist()
    n = sum(map(len, ref["tokens"]))
    assert r["usage"] == {"prompt_tokens": n, "total_tokens": n} and r["object"] == "list"


@pytest.mark.parametrize("top_n, expected", [(None, 4), (2, 2), (4, 4), (99, 4)])
def test_top_n_and_the_tei_shape(case, top_n, expected):
    srv, _, _ = case
    extra = {} if top_n is None else {"top_n": top_n}
    jina = httpx.post(srv.base_url + "/rerank", json={"query": QUERY, "documents": DOCUMENTS, **extra}, timeout=60)
    tei = httpx.post(srv.base_url + "/rerank", timeout=60,
                     json={"query": QUERY, "texts": DOCUMENTS, "return_text": True, **extra}).json()
    results = jina.json()["results"]
    assert len(results) == expected == len(tei)
    assert [(t["index"], t["score"], t["text"]) for t in tei] == [
        (x["index"], x["relevance_score"], DOCUMENTS[x["index"]]) for x in results]


@pytest.mark.parametrize("body, field", [
    ({"query": QUERY, "documents": []}, "documents"), ({"query": QUERY, "documents": None}, "documents"),
    ({"query": QUERY, "documents": 123}, "documents"), ({"query": QUERY, "documents": [1, 2, 3]}, "documents"),
    ({"documents": DOCUMENTS}, "query"), ({"query": QUERY, "documents": DOCUMENTS, "top_n": -1}, "top_n"),
])
def test_bad_requests_name_the_field(case, body, field):
    srv, _, _ = case
    r = httpx.post(srv.base_url + "/v1/rerank", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_a_model_without_a_head_cannot_rerank(tmp_path):
    with ServerThread(create_app(make_state(write_chat_model(tmp_path / "m.gguf")))) as srv:
        r = httpx.post(srv.base_url + "/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}, timeout=60)
    assert r.status_code == 501 and "no reranker" in r.json()["error"]["message"]
