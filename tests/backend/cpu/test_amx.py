"""Q4_K and Q6_K prompt products on the tile unit (jit/ir/amx_ir.py, jit/repack.py's gemm_amx) against the VNNI
tiles: every output the same to the last bit, whatever the number of tokens (16 at a time, the rest on the VNNI
tiles)."""

import numpy as np
import pytest

from pyggml.backend.cpu.jit.ir.amx_ir import amx_usable, tile_config
from pyggml.backend.cpu.jit.ir.vnni_k_ir import Q8K_WORDS
from pyggml.backend.cpu.jit.repack import gemm_16x4_q8_K, gemm_amx, quantize_q8_K, repack_16x4
from pyggml.backend.cpu.kernels.mul_mat import on_tile_unit
from pyggml.core import GGMLType
from tests.support.blocks import random_rows

Q4_K, Q6_K = int(GGMLType.Q4_K), int(GGMLType.Q6_K)
pytestmark = pytest.mark.skipif(not amx_usable(), reason="needs AMX-INT8, granted to the process")


def _products(qtype: int, rows: int, cols: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = repack_16x4(qtype, random_rows(GGMLType(qtype), rows, cols, rng)).reshape(-1)
    x = rng.standard_normal((n, cols)).astype(np.float32) * 2
    xq, xd, xb = (np.empty(n * cols, np.uint8), np.empty(n * cols // 256, np.float32),
                  np.empty(n * cols // 256 * Q8K_WORDS, np.int32))
    quantize_q8_K(x, xq, xd, xb)
    vnni, amx = np.full((n, rows), np.nan, np.float32), np.full((n, rows), np.nan, np.float32)
    gemm_16x4_q8_K(qtype, w, np.zeros(1, np.int64), cols // 256, rows // 16, xq, xd, xb, np.array([0, n], np.int64),
                   vnni)
    gemm_amx(qtype, w, 0, cols // 256, rows // 16, xq, xd, xb, amx, tile_config(qtype))
    return vnni, amx


@pytest.mark.parametrize("qtype", [Q4_K, Q6_K])
@pytest.mark.parametrize("rows, cols, n", [(32, 256, 16), (48, 512, 37), (64, 1024, 160), (16, 2048, 15)])
def test_tile_unit_products_are_the_vnni_tiles_bits(qtype, rows, cols, n):
    vnni, amx = _products(qtype, rows, cols, n)
    assert np.isfinite(vnni).all()
    np.testing.assert_array_equal(amx, vnni)


def test_a_second_matrix_in_the_buffer_is_read_at_its_byte():
    rng = np.random.default_rng(3)
    rows, cols, n = 32, 512, 32
    mats = [repack_16x4(Q4_K, random_rows(GGMLType.Q4_K, rows, cols, rng)).reshape(-1) for _ in range(2)]
    w = np.concatenate(mats)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    xq, xd, xb = (np.empty(n * cols, np.uint8), np.empty(n * cols // 256, np.float32),
                  np.empty(n * cols // 256 * Q8K_WORDS, np.int32))
    quantize_q8_K(x, xq, xd, xb)
    alone, second = np.empty((n, rows), np.float32), np.empty((n, rows), np.float32)
    gemm_amx(Q4_K, mats[1], 0, cols // 256, rows // 16, xq, xd, xb, alone, tile_config(Q4_K))
    gemm_amx(Q4_K, w, mats[0].size, cols // 256, rows // 16, xq, xd, xb, second, tile_config(Q4_K))
    np.testing.assert_array_equal(second, alone)


def test_only_long_prompts_of_one_q4_K_or_q6_K_matrix_go_to_the_tile_unit():
    assert on_tile_unit(Q4_K, 1, 512, 2048) and on_tile_unit(Q4_K, 1, 128, 4096) and on_tile_unit(Q6_K, 1, 512, 8192)
    assert not on_tile_unit(Q4_K, 1, 127, 14336)        # too few tokens: the unpacking costs more than it saves
    assert not on_tile_unit(Q4_K, 1, 128, 2048)         # too little work a row
    assert not on_tile_unit(Q4_K, 2, 512, 2048)         # a MoE layer's experts
    assert not on_tile_unit(int(GGMLType.Q5_K), 1, 512, 2048)


def test_pyggml_amx_0_leaves_the_tile_unit_alone(monkeypatch):
    monkeypatch.setenv("PYGGML_AMX", "0")
    amx_usable.cache_clear()
    try:
        assert not amx_usable() and not on_tile_unit(Q4_K, 1, 512, 2048)
    finally:
        monkeypatch.delenv("PYGGML_AMX")
        amx_usable.cache_clear()
    assert amx_usable()
