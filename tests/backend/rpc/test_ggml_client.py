"""ggml's own RPC client (libggml-rpc.so through ctypes) driving `pyggml rpc-server` in a subprocess.

The ggml side runs in a spawned child process: ggml's client aborts its process on a malformed
reply, and that must fail this test, not kill the pytest run.
"""

import ctypes as C
import multiprocessing
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ggml", reason="ggml-python (ggml's RPC client) is not installed")

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1]
CASES = ["mul_mat_f32_2d", "mul_mat_q4_k", "mul_mat_q8_0", "rms_norm_eps1e-06_64x5x3x2_cont", "soft_max_ext_f32_mask",
         "rope_normal", "get_rows_Q4_K_cont", "silu_F32_F32_16x5x3x2_cont", "geglu_split_F32_16x5x3_cont",
         "add_F32_F32_F32_16x6x4x2_by_4x3x2x1_cont_cont", "flash_attn_f16_kv", "cpy_F32_to_F16_64x3x2_cont_perm",
         "conv_2d"]
BIG = (10 * 1024 * 1024) // 4 + 256  # floats: above ggml's 10 MiB hash threshold


def _pick_cases(names):
    from tests.support import opcheck
    from tests.support.all_opcases import all_cases

    cases = {c.name: c for c in all_cases()}
    return opcheck, [cases[n] for n in names]


def ggml_client_checks(endpoint: str) -> dict:
    """Everything the ggml client does against endpoint; runs in a child process, returns plain results."""
    import pyggml as gg
    from tests.support.ggml_rpc import rpc_library
    from tests.support.ggml_peer import InitParams, PreparedGraph
    from pyggml.core.tensor import host_ndarray

    lib = rpc_library()
    ep = endpoint.encode()
    out = {}
    free, total = C.c_size_t(), C.c_size_t()
    lib.ggml_backend_rpc_get_device_memory(ep, 0, C.byref(free), C.byref(total))
    out["memory"] = (free.value, total.value)
    buft = lib.ggml_backend_rpc_buffer_type(ep, 0)
    out["alignment"] = lib.ggml_backend_buft_get_alignment(buft)
    out["max_size"] = lib.ggml_backend_buft_get_max_size(buft)

    # buffers and tensors through ggml's API
    ctx = lib.ggml_init(InitParams(8 * lib.ggml_tensor_overhead(), None, True))
    buffer = lib.ggml_backend_buft_alloc_buffer(buft, 4096 + BIG * 4)
    out["buffer_size"] = lib.ggml_backend_buffer_get_size(buffer)
    base = lib.ggml_backend_buffer_get_base(buffer)
    t1, t2 = lib.ggml_new_tensor_1d(ctx, 0, 64), lib.ggml_new_tensor_1d(ctx, 0, 64)
    lib.ggml_backend_tensor_alloc(buffer, t1, base)
    lib.ggml_backend_tensor_alloc(buffer, t2, base + 1024)
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    lib.ggml_backend_tensor_set(t1, x.ctypes.data, 0, 256)
    lib.ggml_backend_tensor_get(t1, y.ctypes.data, 0, 256)
    out["set_get"] = y.tolist()
    lib.ggml_backend_tensor_copy(t1, t2)
    lib.ggml_backend_tensor_get(t2, y.ctypes.data, 0, 256)
    out["copy"] = y.tolist()
    lib.ggml_backend_buffer_clear(buffer, 0)
    lib.ggml_backend_tensor_get(t1, y.ctypes.data, 0, 256)
    out["cleared"] = y.tolist()

    # a tensor above the hash threshold, twice: SET_TENSOR_HASH against the server's cache
    big = lib.ggml_new_tensor_1d(ctx, 0, BIG)
    lib.ggml_backend_tensor_alloc(buffer, big, base + 4096)
    data = np.random.default_rng(3).standard_normal(BIG).astype(np.float32)
    back = np.zeros_like(data)
    for _ in range(2):
        lib.ggml_backend_tensor_set(big, data.ctypes.data, 0, data.nbytes)
    lib.ggml_backend_tensor_get(big, back.ctypes.data, 0, data.nbytes)
    out["big_equal"] = bool(np.array_equal(back, data))
    out["big_hash"] = __import__("pyggml.backend.rpc.protocol", fromlist=["x"]).fnv1a_64(data.tobytes())
    lib.ggml_backend_buffer_free(buffer)
    lib.ggml_free(ctx)

    # graphs: ggml builds, allocates (gallocr on the RPC buffer type) and computes them on the pyggml server
    class RemotePeer:
        _backend = lib.ggml_backend_rpc_init(ep, 0)

        def _forget(self, p):
            pass

    opcheck, cases = _pick_cases(CASES)
    out["cases"] = {}
    for case in cases:
        result, graph = opcheck.prepare(case, 0)
        inputs = {t: host_ndarray(t) for t in graph.leafs if t.view_src is None}
        with PreparedGraph(RemotePeer(), graph) as prepared:
            prepared.set_inputs(inputs)
            prepared.run()
            first = prepared.get(result)
            prepared.set_inputs(inputs)  # in-place ops may have overwritten them
            prepared.run()  # the same graph again (GRAPH_RECOMPUTE when ggml reuses it)
            second = prepared.get(result)
        expected = opcheck.values(opcheck.compute(result, graph))
        host = gg.Context().add(gg.Tensor(result.type, result.ne, result.nb))
        host_ndarray(host)[...] = first
        actual = opcheck.values(host)
        finite = np.isfinite(expected)
        out["cases"][case.name] = (opcheck.nmse(expected[finite], actual[finite]),
                                   bool(np.array_equal(first, second, equal_nan=True)), case.tol)
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tests.support.ggml_rpc import pyggml_server

    cache = tmp_path_factory.mktemp("cache")
    with pyggml_server("--cache", str(cache)) as server:
        yield server, cache


def test_ggml_client_drives_pyggml_server(served):
    server, cache = served
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        r = pool.apply_async(ggml_client_checks, (server.endpoint,)).get(timeout=120)
    assert r["memory"][0] > 0 and r["memory"][1] >= r["memory"][0]
    assert r["alignment"] == 32 and r["max_size"] == 2**64 - 1
    assert r["buffer_size"] >= 4096 + BIG * 4
    assert r["set_get"] == list(range(64)) and r["copy"] == list(range(64)) and r["cleared"] == [0] * 64
    assert r["big_equal"]
    assert (cache / f"{r['big_hash']:016x}").stat().st_size == BIG * 4  # ggml's FNV-1a == pyggml's
    assert sorted(r["cases"]) == sorted(CASES)
    for name, (err, repeatable, tol) in r["cases"].items():
        assert err <= tol and repeatable, (name, err)
    assert server.proc.poll() is None  # still serving
