"""Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4 and the K-quants Q2_K .. Q6_K, IQ4_XS interleaved 16 rows at a time
(CPU_INTERLEAVED), matrices and MoE expert stacks, and their integer products against Q8_0 (Q8_K) activations."""

import threading

import numpy as np
import pytest

from pyggml.alloc import alloc_ctx_tensors_from_buft
from pyggml.backend import init_by_name, tensor_get, tensor_set
from pyggml.backend.cpu import interleave, kernels
from pyggml.backend.cpu.interleave import has_int8_products
from pyggml.backend.cpu.jit.mul_mat import dequantize_rows
from pyggml.backend.cpu.jit.ir.vnni_ir import ROWS
from pyggml.backend.cpu.jit.ir.vnni_k_ir import (MINUS_8_SUMS_OF_32, MINUS_32_SUMS_OF_8, PAIRS_OF_32, Q8K_WORDS,
                                                 SUMS_OF_16)
from pyggml.backend.cpu.jit.repack import (fields, gemm_16x4_q8_0, gemm_16x4_q8_K, groups_per_task, quantize_q8_0,
                                           quantize_q8_K, repack_16x4, repack_16x4_into)
from pyggml.backend.cpu.kernels._common import INTERLEAVED
from pyggml.core import Context, GGMLType, ops
from pyggml.core.graph import Graph
from pyggml.core import types as T
from pyggml.core.tensor import host_ndarray
from pyggml.errors import BackendError, UnsupportedOpError

from tests.support.blocks import random_rows
from tests.support.opcheck import nmse

Q = GGMLType.Q4_0
TYPES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.IQ4_NL, GGMLType.MXFP4]
K_TYPES = [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_XS]
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])  # ggml's
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12])  # ggml's kvalues_mxfp4
pytestmark = pytest.mark.skipif(not has_int8_products(), reason="the integer products need AVX-512 VNNI or AVX2")


@pytest.fixture
def cpu():
    return init_by_name("CPU")


def _q_rows(rows: int, cols: int, seed: int = 0, qtype=Q) -> np.ndarray:
    if qtype in K_TYPES + [GGMLType.IQ4_NL, GGMLType.MXFP4]:  # no quantizer here: random quants, scales, minimums
        return random_rows(qtype, rows, cols, np.random.default_rng(seed))
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) + 1  # Q4_1/Q5_1: m != 0
    return np.ascontiguousarray(T.from_float(qtype, values)).view(np.uint8).reshape(rows, -1)


def _q8_0_reference(x: np.ndarray):
    """ggml's quantize_row_q8_0 / q8_1 as its AVX path computes them (q = round(x·127/max) to nearest even):
    quants, fp16-rounded scales, and Q8_1's s = fp16(d·Σq)."""
    blocks = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=-1)
    d = amax / np.float32(127)
    inv = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, 1), np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inv[..., None]).astype(np.int8)
    s = (d * q.astype(np.int32).sum(axis=-1).astype(np.float32)).astype(np.float16).astype(np.float32)
    return q, d.astype(np.float16).astype(np.float32), s


def _one_segment(n_tokens: int):
    """(firsts, starts) of a product of one matrix at byte 0 with all the tokens."""
    return np.zeros(1, np.int64), np.array([0, n_tokens], np.int64)


def _quantized(x: np.ndarray):
    n, k = x.shape
    xq, xd, xs, xm = (np.empty(n * k, np.uint8), np.empty(n * k // 32, np.float32), np.empty(n * k // 32, np.int32),
                      np.empty(n * k // 32, np.float32))
    quantize_q8_0(x, xq, xd, xs, xm)
    return xq, xd, xs, xm


@pytest.mark.parametrize("qtype", TYPES + K_TYPES, ids=lambda t: t.name)
def test_the_compiled_repack_equals_the_numpy_layout(qtype):
    """repack_16x4_into (the loader's path, a thread per 16-row group) writes exactly repack_16x4's bytes, over
    3 groups of 2 blocks (Q8_0's quants flipped to uint8 + 128 as well)."""
    rows = _q_rows(48, 2 * T.blck_size(qtype) if T.blck_size(qtype) > 32 else 64, seed=5, qtype=qtype)
    out = np.full(rows.size, 0xAA, np.uint8)
    repack_16x4_into(int(qtype), rows, out)
    np.testing.assert_array_equal(out, repack_16x4(int(qtype), rows).reshape(-1))


@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.MXFP4, GGMLType.Q4_K, GGMLType.Q6_K],
                         ids=lambda t: t.name)
def test_a_write_is_repacked_in_pieces_shared_over_the_threads(cpu, qtype, monkeypatch):
    """A write into CPU_INTERLEAVED is repacked a few groups at a time, the kernel threads taking the pieces in
    turn: the buffer holds repack_16x4's bytes of the whole matrix, for a write at an offset and a last piece
    shorter than the others too."""
    cols = 2 * T.blck_size(qtype) if T.blck_size(qtype) > 32 else 64
    raw = _q_rows(16 * 7, cols, seed=2, qtype=qtype)
    group = 16 * raw.shape[1]
    monkeypatch.setattr(interleave, "PIECE_BYTES", 2 * group)
    _, interleaved = cpu.device.extra_buffer_types()
    w, buffer = _placed(raw[:32], interleaved, cols, qtype, rows=raw.shape[0])
    tensor_set(w, raw[32:].reshape(-1), 2 * group, raw[32:].nbytes)
    np.testing.assert_array_equal(buffer.quant_bytes(w), repack_16x4(int(qtype), raw).reshape(-1))


def test_the_repack_makes_its_own_pieces_resident_and_the_allocation_starts_no_thread(cpu, monkeypatch):
    """Fresh memory is made resident by the repack threads, each piece before it is written; no thread of the
    buffer's own pages it in beside them (on a virtual machine that slowed an 8B file's load 1.3-2.3x)."""
    raw = _q_rows(16 * 4, 64, seed=3)
    group = 16 * raw.shape[1]
    monkeypatch.setattr(interleave, "PIECE_BYTES", group)
    made_resident = []
    monkeypatch.setattr(interleave, "populate", lambda address, length: made_resident.append(length) or True)
    _, interleaved = cpu.device.extra_buffer_types()
    threads = threading.active_count()
    w, buffer = _placed(raw, interleaved, 64)
    assert threading.active_count() == threads
    assert sorted(made_resident) == [group] * 4
    np.testing.assert_array_equal(buffer.quant_bytes(w), repack_16x4(int(Q), raw).reshape(-1))


@pytest.mark.parametrize("qtype", TYPES)
def test_the_layout_moves_each_rows_bytes_to_its_lane(qtype):
    rows = _q_rows(32, 96, qtype=qtype)
    block_bytes, fields = {Q: (18, [2]), GGMLType.Q4_1: (20, [2, 2]), GGMLType.Q5_0: (22, [2, 4]),
                           GGMLType.Q5_1: (24, [2, 2, 4]), GGMLType.Q8_0: (34, [2]),
                           GGMLType.IQ4_NL: (18, [2]), GGMLType.MXFP4: (17, [1])}[qtype]  # d (e), m, qh: bytes
    packed = repack_16x4(int(qtype), rows).reshape(32 // ROWS, 3, ROWS * block_bytes)   # (group, block, bytes)
    blocks = rows.reshape(32, 3, block_bytes)
    for g, b, r in [(0, 0, 0), (1, 2, ROWS - 1), (0, 1, 7)]:
        block = blocks[ROWS * g + r, b]
        offset = at = 0
        for size in fields:                                                    # its d (m, qh) among the group's
            assert packed[g, b, at + size * r: at + size * (r + 1)].tobytes() == block[offset: offset + size].tobytes()
            offset, at = offset + size, at + ROWS * size
        quants = block[offset:]
        for m in range(quants.size // 4):                                      # quant bytes 4m..4m+3
            at = ROWS * sum(fields) + 4 * ROWS * m + 4 * r
            want = quants[4 * m: 4 * m + 4] ^ (0x80 if qtype == GGMLType.Q8_0 else 0)
            assert packed[g, b, at: at + 4].tobytes() == want.tobytes()
    assert packed.nbytes == rows.nbytes


def test_activations_are_quantized_as_ggml_quantizes_q8_0():
    x = np.random.default_rng(1).standard_normal((5, 96)).astype(np.float32) * 3
    x[2, :32] = 0                                                   # an all-zero block: scale 0, quants 0
    x[3, :32] = 0
    x[3, :4] = [127, 0.5, 1.5, -2.5]                                # scale 1: halves round to even
    xq, xd, xs, xm = _quantized(x)
    q, d, s = _q8_0_reference(x)
    np.testing.assert_array_equal(xq.view(np.int8).reshape(q.shape), q)
    np.testing.assert_array_equal(xd.reshape(d.shape), d)
    np.testing.assert_array_equal(xs.reshape(d.shape), q.astype(np.int32).sum(axis=-1))
    np.testing.assert_array_equal(xm.reshape(d.shape), s)
    assert list(q[3, 0, :4]) == [127, 0, 2, -2] and d[2, 0] == 0 and not q[2, 0].any()


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("n_tokens", [1, 3, 4, 9])
@pytest.mark.parametrize("cols", [32, 96, 576])
def test_tile_products_equal_the_dequantized_product_of_both_sides(qtype, n_tokens, cols):
    """Exact integer dots, then float32 per block: the float64 product of the dequantized weights and
    Q8_0 activations, to float32 rounding (full 4-token tiles and the 1-token tail)."""
    rows = _q_rows(48, cols, qtype=qtype)
    x = np.random.default_rng(2).standard_normal((n_tokens, cols)).astype(np.float32)
    xq, xd, xs, xm = _quantized(x)
    y = np.full((n_tokens, 48), np.nan, np.float32)
    firsts, starts = _one_segment(n_tokens)
    gemm_16x4_q8_0(int(qtype), repack_16x4(int(qtype), rows).reshape(-1), firsts, cols // 32, 48 // ROWS, xq, xd, xs,
                   xm, starts, y)
    weights = T.to_float(qtype, rows).reshape(48, cols).astype(np.float64)
    acts = (xq.view(np.int8).reshape(n_tokens, -1, 32) * xd.reshape(n_tokens, -1, 1)).reshape(n_tokens, cols)
    expected = acts.astype(np.float64) @ weights.T
    if qtype in (GGMLType.Q4_1, GGMLType.Q5_1):  # ggml takes the activations' sum from Q8_1's fp16 s
        block_bytes = 20 if qtype == GGMLType.Q4_1 else 24
        m = rows.reshape(48, -1, block_bytes)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        sums = xm.reshape(n_tokens, -1).astype(np.float64) - (xd * xs).reshape(n_tokens, -1)
        expected += sums @ m.T
    np.testing.assert_allclose(y, expected, rtol=0, atol=2e-6 * np.abs(expected).max())


@pytest.mark.parametrize("qtype, quants, fill", [
    (GGMLType.Q4_0, slice(2, 18), 0xFF), (GGMLType.Q5_0, slice(2, 22), 0xFF), (GGMLType.Q8_0, slice(2, 34), 0x7F),
    (GGMLType.Q8_0, slice(2, 34), 0x81), (GGMLType.IQ4_NL, slice(2, 18), 0xFF), (GGMLType.IQ4_NL, slice(2, 18), 0x00),
    (GGMLType.MXFP4, slice(1, 17), 0x77)])
def test_tile_sums_hold_at_the_extreme_quants_and_activations(qtype, quants, fill):
    """Every quant at its top or bottom (Q8_0's ±127, bytes 255 and 1 once moved to unsigned; a code book's
    largest and smallest entries) against activations of ±127: AVX2's int16 sums (ir/int8_ir.py) neither saturate
    nor wrap, and the products equal the dequantized ones."""
    cols, n_tokens = 96, 5
    rows = _q_rows(32, cols, qtype=qtype).reshape(32, cols // 32, -1)
    rows[:, :, quants] = fill
    rows = rows.reshape(32, -1)
    x = np.ones((n_tokens, cols), np.float32)
    x[1::2, ::2] = -1
    xq, xd, xs, xm = _quantized(x)
    assert set(np.unique(xq.view(np.int8))) <= {-127, 127}
    y = np.empty((n_tokens, 32), np.float32)
    firsts, starts = _one_segment(n_tokens)
    gemm_16x4_q8_0(int(qtype), repack_16x4(int(qtype), rows).reshape(-1), firsts, cols // 32, 32 // ROWS, xq, xd, xs,
                   xm, starts, y)
    acts = (xq.view(np.int8).reshape(n_tokens, -1, 32) * xd.reshape(n_tokens, -1, 1)).reshape(n_tokens, cols)
    expected = acts.astype(np.float64) @ T.to_float(qtype, rows).reshape(32, cols).astype(np.float64).T
    np.testing.assert_allclose(y, expected, rtol=0, atol=2e-6 * np.abs(expected).max())


def _q8_K_reference(x: np.ndarray):
    """ggml's quantize_row_q8_K_ref: iscale = -127/max (max: the value of largest magnitude), q = min(127,
    nearest_int(iscale·x)) rounded to nearest even, d = 1/iscale, bsums = the sums of each 16 q."""
    blocks = x.reshape(x.shape[0], -1, 256).astype(np.float32)
    at = np.abs(blocks).argmax(axis=-1)
    vmax = np.take_along_axis(blocks, at[..., None], -1)[..., 0]
    safe = np.where(vmax != 0, vmax, np.float32(1))
    iscale = np.where(vmax != 0, np.float32(-127) / safe, np.float32(0)).astype(np.float32)
    q = np.minimum(127, np.rint(blocks * iscale[..., None])).astype(np.int8)
    d = np.where(vmax != 0, np.float32(1) / np.where(vmax != 0, iscale, 1), 0).astype(np.float32)
    return q, d, q.reshape(*q.shape[:2], 16, 16).astype(np.int32).sum(-1)


def _quantized_k(x: np.ndarray):
    n, k = x.shape
    xq, xd, xb = (np.empty(n * k, np.uint8), np.empty(n * k // 256, np.float32),
                  np.empty(n * k // 256 * Q8K_WORDS, np.int32))
    quantize_q8_K(x, xq, xd, xb)
    return xq, xd, xb


@pytest.mark.parametrize("qtype", K_TYPES)
def test_the_k_layout_moves_each_rows_fields_to_its_lane(qtype):
    """Per group and block: fp16 fields row after row, the others in 4-byte pieces, piece j of the 16 rows
    side by side (what one int32 lane per row reads); nothing added."""
    rows = _q_rows(32, 512, qtype=qtype)
    block_bytes, layout = fields(int(qtype))
    # fields in any order, each byte of the block once:
    assert sorted(b for o, n in layout for b in range(o, o + n)) == list(range(block_bytes))
    packed = repack_16x4(int(qtype), rows).reshape(32 // ROWS, 2, ROWS * block_bytes)
    blocks = rows.reshape(32, 2, block_bytes)
    for g, b, r in [(0, 0, 0), (1, 1, ROWS - 1), (0, 1, 7)]:
        block, at = blocks[ROWS * g + r, b], 0
        for offset, size in layout:
            piece = 2 if size == 2 else 4
            for j in range(size // piece):
                got = packed[g, b, at + ROWS * piece * j + piece * r: at + ROWS * piece * j + piece * (r + 1)]
                assert got.tobytes() == block[offset + piece * j: offset + piece * (j + 1)].tobytes()
            at += ROWS * size
    assert packed.nbytes == rows.nbytes


def test_activations_are_quantized_as_ggml_quantizes_q8_K():
    x = np.random.default_rng(1).standard_normal((3, 768)).astype(np.float32) * 3
    x[1, :256] = 0                                                   # an all-zero block: scale 0, quants 0
    x[2, 256:512] = 0
    x[2, 256:260] = [-127, 0.5, 1.5, -2.5]                           # max negative: iscale 1, halves to even
    xq, xd, xb = _quantized_k(x)
    q, d, bsums = _q8_K_reference(x)
    np.testing.assert_array_equal(xq.view(np.int8).reshape(q.shape), q)
    np.testing.assert_array_equal(xd.reshape(d.shape), d)
    words = xb.reshape(*bsums.shape[:2], Q8K_WORDS)
    np.testing.assert_array_equal(words[..., SUMS_OF_16:SUMS_OF_16 + 16], bsums)
    sums_of_32 = q.reshape(*q.shape[:2], 8, 32).astype(np.int32).sum(-1)
    pairs = words[..., PAIRS_OF_32:PAIRS_OF_32 + 4].view(np.int16).reshape(*q.shape[:2], 8)  # little-endian: lo first
    np.testing.assert_array_equal(pairs, sums_of_32)
    np.testing.assert_array_equal(words[..., MINUS_8_SUMS_OF_32:MINUS_8_SUMS_OF_32 + 8], -8 * sums_of_32)
    sums_of_8 = q.reshape(*q.shape[:2], 32, 8).astype(np.int32).sum(-1)
    np.testing.assert_array_equal(words[..., MINUS_32_SUMS_OF_8:MINUS_32_SUMS_OF_8 + 32], -32 * sums_of_8)
    assert list(q[2, 1, :4]) == [-127, 0, 2, -2] and d[2, 1] == 1 and d[1, 0] == 0 and not q[1, 0].any()


@pytest.mark.parametrize("at, tie", [(0, 17), (0, 255), (16, 1), (255, 240)])
def test_q8_K_finds_the_first_largest_value_in_any_lane(at, tie):
    """The largest magnitude at the block's first or last value, or in a lane after its tie's: the first of the two
    sets the scale's sign (the 16 lanes each keep the first index of their own maximum)."""
    x = np.zeros((1, 256), np.float32)
    x[0, :] = np.linspace(-1, 1, 256)
    x[0, at], x[0, tie] = 5, -5
    xq, xd, _ = _quantized_k(x)
    q, d, _ = _q8_K_reference(x)
    assert xd[0] == d[0, 0] and (xd[0] < 0) == (min(at, tie) == at)
    np.testing.assert_array_equal(xq.view(np.int8), q.reshape(-1))


def test_q8_K_takes_the_first_value_of_the_largest_magnitude():
    """Ties of magnitude in other lanes of the 16 running maxima: the first such value sets the scale's sign, as
    ggml's loop keeps it (+5 first: iscale -127/5; -5 first: +127/5), and a NaN never becomes the maximum."""
    x = np.zeros((1, 768), np.float32)
    x[0, :256] = np.linspace(-1, 1, 256)
    x[0, [7, 24, 250]] = [5, -5, 5]
    x[0, 256 + 3], x[0, 256 + 200] = -5, 5
    x[0, 512:] = np.linspace(-2, 2, 256)
    x[0, 512 + 9] = np.nan
    xq, xd, _ = _quantized_k(x)
    q, d, _ = _q8_K_reference(np.nan_to_num(x, nan=0.0))
    assert xd[0] == d[0, 0] == np.float32(1) / (np.float32(-127) / np.float32(5)) and xd[1] == -xd[0]
    np.testing.assert_array_equal(xq[:512].view(np.int8), q[0, :2].reshape(-1))
    assert xd[2] == d[0, 2]


def _two_bit_values(blocks: np.ndarray, qs: int) -> np.ndarray:
    """Q2_K's and Q3_K's 2-bit quants (rows, nb, 256): value 128n + 32j + l is bits 2j of qs byte 32n + l."""
    q = blocks[:, :, qs:qs + 64].astype(np.int64).reshape(*blocks.shape[:2], 2, 1, 32)
    return ((q >> (2 * np.arange(4))[:, None]) & 3).reshape(*blocks.shape[:2], 256)


def _sub_block_values_and_scales(qtype, blocks: np.ndarray):
    """ggml's integer view of a K-quant block: (values (rows, nb, 256), integer scales (rows, nb, sub-blocks),
    integer minimums or None, offset of fp16 d, of fp16 dmin or None), from its dequantize_row_<type>."""
    n_rows, nb = blocks.shape[:2]
    b = blocks.astype(np.int64)
    if qtype == GGMLType.Q6_K:
        ql, qh = b[:, :, :128], b[:, :, 128:192]
        values = np.empty((n_rows, nb, 256), np.int64)
        for h in range(2):
            low, bits = ql[:, :, 64 * h: 64 * h + 64], qh[:, :, 32 * h: 32 * h + 32]
            for g in range(4):
                nib = (low[:, :, 32 * (g % 2): 32 * (g % 2) + 32] >> (4 * (g // 2))) & 15
                values[:, :, 128 * h + 32 * g: 128 * h + 32 * g + 32] = (nib | (((bits >> (2 * g)) & 3) << 4)) - 32
        return values, blocks[:, :, 192:208].view(np.int8).astype(np.int64), None, 208, None
    if qtype == GGMLType.Q2_K:
        return _two_bit_values(blocks, 16), b[:, :, :16] & 15, b[:, :, :16] >> 4, 80, 82
    if qtype == GGMLType.Q3_K:
        hmask = b[:, :, :32]
        high = (hmask[:, :, None, :] >> np.arange(8)[:, None]) & 1                     # value 32i + l: bit i of l
        values = _two_bit_values(blocks, 32) - 4 * (1 - high.reshape(n_rows, nb, 256))
        aux = blocks[:, :, 96:108].copy().view(np.uint32).astype(np.int64)             # ggml's kmask shuffle
        a0, a1, tmp = aux[..., 0], aux[..., 1], aux[..., 2]
        words = [(a0 & 0x0F0F0F0F) | (((tmp >> 0) & 0x03030303) << 4),
                 (a1 & 0x0F0F0F0F) | (((tmp >> 2) & 0x03030303) << 4),
                 ((a0 >> 4) & 0x0F0F0F0F) | (((tmp >> 4) & 0x03030303) << 4),
                 ((a1 >> 4) & 0x0F0F0F0F) | (((tmp >> 6) & 0x03030303) << 4)]
        scales = np.stack([(w >> (8 * i)) & 0xFF for w in words for i in range(4)], -1) - 32
        return values, scales, None, 108, None
    if qtype == GGMLType.IQ4_XS:
        qs = b[:, :, 8:].reshape(n_rows, nb, 8, 16)
        values = KVALUES_IQ4NL[np.concatenate([qs & 15, qs >> 4], -1)].reshape(n_rows, nb, 256)
        low = (b[:, :, 4:8, None] >> np.array([0, 4])) & 15                            # sub-block 2i + k: byte i
        high = (blocks[:, :, 2:4].copy().view(np.uint16).astype(np.int64) >> (2 * np.arange(8))) & 3
        return values, (low.reshape(n_rows, nb, 8) | (high << 4)) - 32, None, 0, None
    sc = b[:, :, 4:16]
    scales = np.concatenate([sc[..., :4] & 63, (sc[..., 8:] & 15) | ((sc[..., :4] >> 6) << 4)], -1)
    mins = np.concatenate([sc[..., 4:8] & 63, (sc[..., 8:] >> 4) | ((sc[..., 4:8] >> 6) << 4)], -1)
    qs = b[:, :, -128:].reshape(n_rows, nb, 4, 32)
    values = np.stack([qs & 15, qs >> 4], 3).reshape(n_rows, nb, 256)   # sub-block 2c: low nibbles, 2c+1: high
    if qtype == GGMLType.Q5_K:
        qh = b[:, :, 16:48]
        values = values | (((qh[:, :, None, :] >> np.arange(8)[:, None]) & 1) << 4).reshape(n_rows, nb, 256)
    return values, scales, mins, 0, 2


def _integer_reference(qtype, rows: np.ndarray, q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """ggml's vec_dot_<type>_q8_K in NumPy: per block, integer sums of quants times Q8_K quants times the
    sub-blocks' integer scales (and minimums times the activations' sums), then float32 d·dx and dmin·dx, summed
    in float64."""
    n_rows, nb = rows.shape[0], q.shape[1]
    blocks = rows.reshape(n_rows, nb, -1)
    values, scales, mins, d_at, dmin_at = _sub_block_values_and_scales(qtype, blocks)
    f16 = lambda at: blocks[:, :, at:at + 2].copy().view(np.float16)[..., 0].astype(np.float32)  # noqa: E731
    subs = scales.shape[-1]
    xq = q.astype(np.int64).reshape(-1, nb, subs, 256 // subs)
    sums = np.einsum("rbsv,tbsv->trbs", values.reshape(n_rows, nb, subs, -1), xq)
    result = (sums * scales).sum(-1) * (f16(d_at)[None] * d[:, None, :])
    if mins is not None:
        min_ints = np.einsum("rbs,tbs->trb", mins, xq.sum(-1))
        result = result - min_ints * (f16(dmin_at)[None] * d[:, None, :])
    return result.sum(-1)


@pytest.mark.parametrize("qtype", K_TYPES)
@pytest.mark.parametrize("n_tokens", [1, 6])
def test_k_tile_products_follow_ggml_integer_dots_and_the_dequantized_product(qtype, n_tokens):
    """Against ggml's integer arithmetic (per-sub-block integer sums and scales) and against the float64
    product of the dequantized weights and the Q8_K activations, to float32 rounding (4-token tiles and the
    1-token tail)."""
    cols = 512
    rows = _q_rows(48, cols, qtype=qtype)
    x = np.random.default_rng(2).standard_normal((n_tokens, cols)).astype(np.float32)
    xq, xd, xb = _quantized_k(x)
    y = np.full((n_tokens, 48), np.nan, np.float32)
    firsts, starts = _one_segment(n_tokens)
    gemm_16x4_q8_K(int(qtype), repack_16x4(int(qtype), rows).reshape(-1), firsts, cols // 256, 48 // ROWS, xq, xd, xb,
                   starts, y)
    q = xq.view(np.int8).reshape(n_tokens, -1, 256)
    acts = (q * xd.reshape(n_tokens, -1, 1)).reshape(n_tokens, cols).astype(np.float64)
    expected = acts @ T.to_float(qtype, rows).reshape(48, cols).astype(np.float64).T
    np.testing.assert_allclose(y, expected, rtol=0, atol=2e-6 * np.abs(expected).max())
    integer = _integer_reference(qtype, rows, q, xd.reshape(n_tokens, -1))
    np.testing.assert_allclose(y, integer, rtol=0, atol=2e-6 * np.abs(integer).max())


@pytest.mark.parametrize("qtype, quants", [(GGMLType.Q4_K, slice(16, 144)), (GGMLType.Q6_K, slice(0, 192)),
                                           (GGMLType.Q2_K, slice(16, 80)), (GGMLType.Q3_K, slice(0, 96)),
                                           (GGMLType.Q5_K, slice(16, 176)), (GGMLType.IQ4_XS, slice(8, 136))],
                         ids=lambda v: v.name if isinstance(v, GGMLType) else None)
@pytest.mark.parametrize("fill", [0x00, 0xFF])
def test_int16_sums_hold_at_the_extreme_quants_and_activations(qtype, quants, fill):
    """Q4_K's and Q6_K's pieces of products (ir/vnni_k_ir.py's NARROW) reach their largest magnitude, 32512, with
    every quant at 0 (nibble - 8 = -8, q - 32 = -32) or at its top and every activation at ±127, and so do the
    int16 sums of AVX2's vpmaddubsw (ir/int8_ir.py) for every K type: the sums still equal ggml's integer
    arithmetic."""
    cols, n_tokens = 512, 5
    rows = _q_rows(32, cols, qtype=qtype).reshape(32, cols // 256, -1)
    rows[:, :, quants] = fill
    rows = rows.reshape(32, -1)
    x = np.ones((n_tokens, cols), np.float32)
    x[1::2, ::256] = -1                       # a block whose first value is -1: its other values quantize to +127
    x[2] = -x[2]
    xq, xd, xb = _quantized_k(x)
    assert set(np.unique(xq.view(np.int8))) <= {-127, 127}
    y = np.empty((n_tokens, 32), np.float32)
    gemm_16x4_q8_K(int(qtype), repack_16x4(int(qtype), rows).reshape(-1), *_one_segment(n_tokens)[:1], cols // 256,
                   32 // ROWS, xq, xd, xb, _one_segment(n_tokens)[1], y)
    integer = _integer_reference(qtype, rows, xq.view(np.int8).reshape(n_tokens, -1, 256), xd.reshape(n_tokens, -1))
    np.testing.assert_allclose(y, integer, rtol=0, atol=2e-6 * np.abs(integer).max())


@pytest.mark.parametrize("scale", [0x80, 0x7F])
@pytest.mark.parametrize("fill", [0x00, 0xFF])
def test_q6_k_sums_hold_at_the_extreme_scales(scale, fill):
    """Q6_K's signed scales at -128 and 127 times the largest sums of their sub-blocks: AVX2 multiplies each sum by
    its scale in the vpmaddwd that widens it (the scale sign-extended into both int16 halves of a lane) and the
    zero point's term by int16 pairs of scales; the sums still equal ggml's integer arithmetic."""
    cols, n_tokens = 512, 5
    rows = _q_rows(32, cols, qtype=GGMLType.Q6_K).reshape(32, cols // 256, -1)
    rows[:, :, 0:192], rows[:, :, 192:208] = fill, scale
    rows[::3, :, 192:208:3] = 0xFF - scale             # both signs within a row, and across rows
    rows = rows.reshape(32, -1)
    x = np.ones((n_tokens, cols), np.float32)
    x[1::2, ::256] = -1
    x[2] = -x[2]
    xq, xd, xb = _quantized_k(x)
    y = np.empty((n_tokens, 32), np.float32)
    gemm_16x4_q8_K(int(GGMLType.Q6_K), repack_16x4(int(GGMLType.Q6_K), rows).reshape(-1),
                   *_one_segment(n_tokens)[:1], cols // 256, 32 // ROWS, xq, xd, xb, _one_segment(n_tokens)[1], y)
    integer = _integer_reference(GGMLType.Q6_K, rows, xq.view(np.int8).reshape(n_tokens, -1, 256),
                                 xd.reshape(n_tokens, -1))
    np.testing.assert_allclose(y, integer, rtol=0, atol=2e-6 * np.abs(integer).max())


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q6_K])
def test_a_long_prompt_in_runs_of_row_groups_gets_the_bits_of_short_ones(qtype):
    """Tokens whose activations outgrow L2 go STEP_TOKENS at a time through runs of row groups (groups_per_task),
    in two segments of one launch; each token's row is what a product of that token's short batch gives."""
    cols, n_rows, n_tokens = 4096, 256, 160
    nb = cols // 256
    sizes = (n_rows // ROWS, nb * ROWS * fields(int(qtype))[0], nb, np.array([0, 80, n_tokens]))
    assert groups_per_task(int(GGMLType.Q4_K), *sizes) > 1   # activations that outgrow L2 (Q6_K: runs in 8-row groups)
    w = repack_16x4(int(qtype), _q_rows(n_rows, cols, qtype=qtype)).reshape(-1)
    x = np.random.default_rng(6).standard_normal((n_tokens, cols)).astype(np.float32)
    long = np.empty((n_tokens, n_rows), np.float32)
    gemm_16x4_q8_K(int(qtype), w, np.zeros(2, np.int64), nb, n_rows // ROWS, *_quantized_k(x),
                   np.array([0, 80, n_tokens], np.int64), long)
    for t0 in range(0, n_tokens, 10):
        short = np.empty((10, n_rows), np.float32)
        gemm_16x4_q8_K(int(qtype), w, *_one_segment(10)[:1], nb, n_rows // ROWS, *_quantized_k(x[t0:t0 + 10]),
                       _one_segment(10)[1], short)
        np.testing.assert_array_equal(long[t0:t0 + 10], short)


@pytest.mark.parametrize("qtype", K_TYPES)
def test_a_token_alone_gets_the_same_bits_as_in_a_tile_of_four(qtype):
    """A generation step's token (the 1-token loop) and the same token among others (the 4-token loop, a batch
    of sequences) are summed alike to the last bit: a sequence's logits must not depend on its neighbours."""
    cols = 1024
    w = repack_16x4(int(qtype), _q_rows(32, cols, qtype=qtype)).reshape(-1)
    x = np.random.default_rng(3).standard_normal((5, cols)).astype(np.float32)
    alone, batch = np.empty((1, 32), np.float32), np.empty((5, 32), np.float32)
    for rows, y in ((x[:1], alone), (x, batch)):
        firsts, starts = _one_segment(len(rows))
        gemm_16x4_q8_K(int(qtype), w, firsts, cols // 256, 32 // ROWS, *_quantized_k(rows), starts, y)
    np.testing.assert_array_equal(alone[0], batch[0])


def _placed(raw: np.ndarray, buft, cols: int, qtype=Q, n_expert: int = 1, rows: int | None = None):
    """raw's rows as a matrix (or a stack of n_expert matrices) of qtype in buft: the first rows of one of `rows`
    rows (default: all of it)."""
    rows = raw.shape[0] if rows is None else rows
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor(qtype, (cols, rows // n_expert, n_expert) if n_expert > 1 else (cols, rows), "w")
    buffer = alloc_ctx_tensors_from_buft(ctx, buft)
    tensor_set(w, raw.reshape(-1), 0, raw.nbytes)
    return w, buffer


@pytest.mark.parametrize("qtype", TYPES + K_TYPES)
@pytest.mark.parametrize("shape", [(256, 1), (256, 7), (256, 64), (256, 5, 3)])
def test_mul_mat_on_it_is_within_test_backend_ops_nmse_of_the_file_layout(cpu, shape, qtype):
    """Prompt batches, a generation step's one column and a 3-D b: within 5e-4 NMSE of the float product
    on the same Q4_0 bytes (test-backend-ops' bound for quantized mul_mat), with bound calls and without."""
    _, interleaved = cpu.device.extra_buffer_types()
    raw = _q_rows(64, 256, qtype=qtype)
    packed, _ = _placed(raw, interleaved, 256, qtype)
    plain, _ = _placed(raw, cpu.default_buffer_type, 256, qtype)
    assert packed.extra is INTERLEAVED
    ctx = Context()
    x = ctx.new_tensor(GGMLType.F32, shape, "x")
    host_ndarray(x)[...] = np.random.default_rng(3).standard_normal(host_ndarray(x).shape)
    a, b = ops.mul_mat(ctx, packed, x), ops.mul_mat(ctx, plain, x)
    kernels.compute(b)
    kernels.compute(a)
    assert nmse(host_ndarray(b), host_ndarray(a)) < 5e-4
    host_ndarray(a)[...] = np.nan
    kernels.bound(a, kernels.KERNELS[a.op])()
    assert nmse(host_ndarray(b), host_ndarray(a)) < 5e-4


def test_only_mul_mat_and_get_rows_read_it_and_the_backend_gives_blas_one_thread(cpu):
    _, interleaved = cpu.device.extra_buffer_types()
    w, _ = _placed(_q_rows(16, 64), interleaved, 64)
    ctx = Context()
    copy = ops.cont(ctx, w)
    assert not kernels.supports(copy)
    with pytest.raises(UnsupportedOpError, match="CONT"):
        cpu._plan(_graph(copy))
    x = ctx.new_tensor_2d(GGMLType.F32, 64, 2, "x")
    assert cpu._plan(_graph(ops.mul_mat(ctx, w, x))).blas_on_one_thread
    assert not cpu._plan(_graph(ops.mul_mat(ctx, x, x))).blas_on_one_thread


@pytest.mark.parametrize("qtype", TYPES + K_TYPES)
def test_get_rows_reads_rows_back_out_of_their_groups(cpu, qtype):
    """A tied token embedding is interleaved with the layers (it is the output head too): GET_ROWS gathers each
    row's bytes back and decodes them, the same values as from the file's layout."""
    _, interleaved = cpu.device.extra_buffer_types()
    raw = _q_rows(48, 512, qtype=qtype)
    packed, _ = _placed(raw, interleaved, 512, qtype)
    plain, _ = _placed(raw, cpu.default_buffer_type, 512, qtype)
    ctx = Context()
    ids = ctx.new_tensor_1d(GGMLType.I32, 10, "ids")
    host_ndarray(ids)[...] = [0, 47, 16, 16, 31, 5, 15, 32, 0, 1]
    got, want = ops.get_rows(ctx, packed, ids), ops.get_rows(ctx, plain, ids)
    assert kernels.supports(got)
    kernels.compute(got)
    kernels.compute(want)
    np.testing.assert_array_equal(host_ndarray(got), host_ndarray(want))


def _graph(t):
    return Graph().build_forward_expand(t)


def _mxfp4_values(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's integer view of MXFP4 rows (n, nb·17): (the code book values kvalues_mxfp4[q] (n, nb, 32), low
    nibbles first, and the block scales 2^(e - 128) as GGML_E8M0_TO_FP32_HALF computes them (n, nb))."""
    blocks = rows.reshape(rows.shape[0], -1, 17)
    qs = blocks[:, :, 1:]
    values = KVALUES_MXFP4[np.concatenate([qs & 15, qs >> 4], -1)]
    e = blocks[:, :, 0].astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
    return values, bits.view(np.float32)


def test_mxfp4_is_decoded_as_ggml_decodes_it():
    """dequantize_row_mxfp4: kvalues_mxfp4[q]·2^(e - 128), the subnormal scales e = 0, 1 and e = 255 (read as
    2^127, no NaN, as ggml) included; gguf's NumPy decoder agrees."""
    rows = _q_rows(4, 256, qtype=GGMLType.MXFP4)
    rows.reshape(4, 8, 17)[0, :4, 0] = [0, 1, 2, 255]
    rows.reshape(4, 8, 17)[0, 3, 1:] &= 0x11                     # e = 255 with values 0 and 1: finite
    values, scales = _mxfp4_values(rows)
    expected = (values * scales[..., None].astype(np.float64)).astype(np.float32).reshape(4, 256)
    got = np.empty((4, 256), np.float32)
    dequantize_rows(int(GGMLType.MXFP4), rows.reshape(-1), np.arange(4, dtype=np.uint64) * 136, 8, got)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(T.to_float(GGMLType.MXFP4, rows).reshape(4, 256), expected)
    assert scales[0, 0] == 2.0 ** -128 and scales[0, 1] == 2.0 ** -127 and scales[0, 3] == 2.0 ** 127


@pytest.mark.parametrize("n_tokens", [1, 6])
def test_mxfp4_tiles_follow_ggml_vec_dot_mxfp4_q8_0(n_tokens):
    """Per block the exact integer Σ kvalue·q8, times e8m0_half(e)·d8 in float32, summed (ggml's order)."""
    rows = _q_rows(32, 256, qtype=GGMLType.MXFP4)
    x = np.random.default_rng(5).standard_normal((n_tokens, 256)).astype(np.float32)
    xq, xd, xs, xm = _quantized(x)
    y = np.full((n_tokens, 32), np.nan, np.float32)
    firsts, starts = _one_segment(n_tokens)
    gemm_16x4_q8_0(int(GGMLType.MXFP4), repack_16x4(int(GGMLType.MXFP4), rows).reshape(-1), firsts, 8, 32 // ROWS, xq,
                   xd, xs, xm, starts, y)
    values, scales = _mxfp4_values(rows)
    q = xq.view(np.int8).reshape(n_tokens, 8, 32).astype(np.int64)
    sums = np.einsum("rbv,tbv->trb", values.astype(np.int64), q)
    expected = (sums * (scales[None] * xd.reshape(n_tokens, 1, 8)).astype(np.float32)).sum(-1)
    np.testing.assert_allclose(y, expected, rtol=0, atol=2e-6 * np.abs(expected).max())


def _expert_stacks(cpu, qtype, cols: int, rows: int, n_expert: int):
    """The same random expert stack of qtype interleaved and in the file's layout."""
    _, interleaved = cpu.device.extra_buffer_types()
    raw = _q_rows(rows * n_expert, cols, seed=4, qtype=qtype)
    packed, keep = _placed(raw, interleaved, cols, qtype, n_expert)
    plain, keep_plain = _placed(raw, cpu.default_buffer_type, cols, qtype, n_expert)
    assert packed.extra is INTERLEAVED and packed.buffer.quant_bytes(packed).nbytes == raw.nbytes  # 1.00x the file
    return packed, plain, (keep, keep_plain)


@pytest.mark.parametrize("qtype", TYPES + K_TYPES)
@pytest.mark.parametrize("n_tokens, n_b", [(1, 1), (1, 3), (9, 1), (20, 3)])
def test_mul_mat_id_on_interleaved_experts_is_within_test_backend_ops_nmse_of_the_file_layout(cpu, qtype, n_tokens,
                                                                                               n_b):
    """A MoE layer's experts interleaved: a generation step (one token) and a prompt's batch, b broadcast over the
    slots (gate/up) or one row per slot (down); experts used by none, one or many rows; the integer products
    within test-backend-ops' 5e-4 NMSE of the float product on the same bytes."""
    packed, plain, _ = _expert_stacks(cpu, qtype, 256, 32, 6)
    ctx = Context()
    x = ctx.new_tensor(GGMLType.F32, (256, n_b, n_tokens), "x")
    host_ndarray(x)[...] = np.random.default_rng(6).standard_normal(host_ndarray(x).shape)
    ids = ctx.new_tensor(GGMLType.I32, (3, n_tokens), "ids")
    rng = np.random.default_rng(7)
    host_ndarray(ids)[0, 0] = [rng.permutation(5)[:3] for _ in range(n_tokens)]  # expert 5 never chosen
    got, want = ops.mul_mat_id(ctx, packed, x, ids), ops.mul_mat_id(ctx, plain, x, ids)
    assert kernels.supports(got)
    kernels.compute(want)
    kernels.compute(got)
    assert nmse(host_ndarray(want), host_ndarray(got)) < 5e-4


@pytest.mark.parametrize("qtype", [GGMLType.MXFP4, GGMLType.Q4_K])
def test_stacks_multiply_plane_by_plane_and_give_their_rows_back(cpu, qtype):
    """MUL_MAT with a stack (b's planes broadcast onto its matrices as ggml does) and GET_ROWS of each plane's rows
    (ids[i11] of matrix i11) read the interleaved stack as the file's."""
    packed, plain, _ = _expert_stacks(cpu, qtype, 256, 32, 2)
    ctx = Context()
    x = ctx.new_tensor(GGMLType.F32, (256, 5, 4), "x")
    host_ndarray(x)[...] = np.random.default_rng(8).standard_normal(host_ndarray(x).shape)
    got, want = ops.mul_mat(ctx, packed, x), ops.mul_mat(ctx, plain, x)
    kernels.compute(want)
    kernels.compute(got)
    assert nmse(host_ndarray(want), host_ndarray(got)) < 5e-4
    ids = ctx.new_tensor(GGMLType.I32, (5, 2), "ids")
    host_ndarray(ids)[...] = [[0, 31, 16, 15, 3], [1, 17, 30, 0, 0]]
    got, want = ops.get_rows(ctx, packed, ids), ops.get_rows(ctx, plain, ids)
    kernels.compute(want)
    kernels.compute(got)
    np.testing.assert_array_equal(host_ndarray(got), host_ndarray(want))


def test_it_refuses_reads_partial_groups_and_tensors_it_cannot_hold(cpu):
    _, interleaved = cpu.device.extra_buffer_types()
    raw = _q_rows(32, 64)
    w, _ = _placed(raw, interleaved, 64)
    with pytest.raises(BackendError, match="cannot be read back"):
        tensor_get(w)
    with pytest.raises(BackendError, match=f"whole groups of {ROWS} rows"):
        tensor_set(w, raw[:4].reshape(-1), 0, raw[:4].nbytes)
    for type_, ne in ((GGMLType.F16, (256, 16)), (GGMLType.Q4_K, (256, 4)), (Q, (64, 4)), (Q, (64, 16, 2, 2)),
                      (GGMLType.MXFP4, (64, 16, 2, 2)), (GGMLType.IQ4_XS, (256, 4, 3))):
        ctx = Context(no_alloc=True)
        ctx.new_tensor(type_, ne, "w")
        with pytest.raises(BackendError, match=r"holds whole matrices \(or 3-D stacks of them\) of Q4_0, Q4_1, Q5_0, "
                                               r".* IQ4_XS, MXFP4"):
            alloc_ctx_tensors_from_buft(ctx, interleaved)


def test_products_of_one_b_in_a_row_quantize_it_once_per_compute(cpu, monkeypatch):
    """A layer's q, k and v (gate and up) read one b: it becomes Q8_K once per graph compute, not once per
    product; another b of the same shape, and the next compute's new values of the same b, are quantized
    afresh (each product equals it computed alone)."""
    from pyggml.backend.cpu.kernels import mul_mat as mul_mat_kernels

    quantized = []
    real = mul_mat_kernels.quantize_q8_K
    monkeypatch.setattr(mul_mat_kernels, "quantize_q8_K", lambda x, *out: (quantized.append(x.copy()), real(x, *out)))
    _, interleaved = cpu.device.extra_buffer_types()
    w1, _ = _placed(_q_rows(32, 256, seed=1, qtype=GGMLType.Q4_K), interleaved, 256, GGMLType.Q4_K)
    w2, _ = _placed(_q_rows(16, 256, seed=2, qtype=GGMLType.Q6_K), interleaved, 256, GGMLType.Q6_K)
    ctx = Context()
    x, x2 = (ctx.new_tensor_2d(GGMLType.F32, 256, 9, name) for name in ("x", "x2"))
    products = [ops.mul_mat(ctx, w1, x), ops.mul_mat(ctx, w2, x), ops.mul_mat(ctx, w1, x2)]
    graph = Graph()
    for p in products:
        graph.build_forward_expand(p)
    rng = np.random.default_rng(4)
    for _ in range(2):
        for t in (x, x2):
            host_ndarray(t)[...] = rng.standard_normal(host_ndarray(t).shape)
        quantized.clear()
        cpu.graph_compute(graph)
        assert [q.tobytes() for q in quantized] == [host_ndarray(t).tobytes() for t in (x, x2)]
        for p in products:
            alone = ops.mul_mat(Context(), *p.src[:2])
            kernels.compute(alone)
            np.testing.assert_array_equal(host_ndarray(p), host_ndarray(alone))
