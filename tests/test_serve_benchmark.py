"""The serving benchmark's client against an in-process server on a small random model: its figures exist and
are consistent (every request's tokens counted, percentiles ordered)."""

import asyncio
import os
import random
from types import SimpleNamespace

from benchmarks.serve_vs_llamacpp import EngineSide, engine_level, level, random_prompts
from pyggml.serve.app import create_app
from pyggml.serve.state import Limits
from tests.support.serve import ServerThread, make_state, write_chat_model


def test_client_measures_a_level(tmp_path):
    path = str(write_chat_model(tmp_path / "tiny.gguf"))
    prompts, eog = random_prompts(path, 6, 12, random.Random(0))
    assert len(prompts) == 6 and eog
    args = SimpleNamespace(output_len=6)
    with ServerThread(create_app(make_state(path, Limits(parallel=2)))) as srv:
        server = SimpleNamespace(url=srv.base_url, proc=SimpleNamespace(pid=os.getpid()))  # the server is here
        row = asyncio.run(level("pyggml", 2, prompts, args, eog, server))
    assert row["requests"] == 4 and row["concurrency"] == 2  # after a warm-up of 2 and row["output_tok_s"] > 0
    assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] and 0 < row["tpot_p50_ms"] <= row["tpot_p99_ms"]
    assert row["itl_p50_ms"] <= row["itl_p99_ms"]
    assert 0 < row["engine_busy_s"] <= row["wall_s"] and row["client_cpu_s"] > 0 and row["server_cpu_s"] > 0


def test_engine_side_measures_the_same_requests_without_http(tmp_path):
    path = str(write_chat_model(tmp_path / "tiny.gguf"))
    prompts, _ = random_prompts(path, 6, 12, random.Random(0))
    args = SimpleNamespace(model=path, output_len=6, ctx=256, batch=64, threads=1, concurrency=[2])
    with EngineSide(args) as side:
        row = asyncio.run(engine_level(2, prompts, args, side))
        assert side.engine.stats().requests_finished == 6 and side.model.cells.used > 0  # warm-up 2, then 4
    assert row["side"] == "engine" and row["requests"] == 4 and row["output_tok_s"] > 0
    assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] and 0 < row["tpot_p50_ms"] <= row["tpot_p99_ms"]
    assert 0 < row["engine_busy_s"] <= row["wall_s"]


def test_prompts_re_tokenize_to_at_most_their_length(tmp_path):
    """On the padded GPT-2 vocabulary of the random-weight 1B files, random tokens' text re-tokenized ran ~10x
    longer; the prompts are cut until they hold."""
    from pyggml.models.gguf.gguf_file import GGUFFile
    from pyggml.models.text.load import load_tokenizer
    from pyggml.testing.synthetic import Vocab, write_llama

    vocab = Vocab.from_gguf("tests/models/data/bpe_vocabs/gpt-2.gguf")
    path = tmp_path / "padded.gguf"
    write_llama(path, vocab=vocab, n_vocab=60000)
    prompts, _ = random_prompts(str(path), 4, 64, random.Random(0))
    tok = load_tokenizer(GGUFFile.open(str(path)))
    lengths = [len(tok.encode(p, add_special=False)) for p in prompts]
    assert all(32 <= n <= 64 for n in lengths), lengths
