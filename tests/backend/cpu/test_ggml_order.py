"""The CPU kernels that follow ggml's CPU order on AVX-512 (jit/sgemm.py, softmax.py, norm.py, glu.py, rope.py,
the average pool), each against a NumPy reference written in that order, bit for bit.

The references fuse a multiply-add as float32(float64(a) * b + c): the float64 product is exact, the sum rounds
once to float64 and again to float32, which agrees with one rounding except in rare double-rounding cases (none
on these seeds)."""

import ctypes
import ctypes.util

import numpy as np
import pytest

from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.ops.attention import RopeType
from pyggml.core.ops.conv import PoolOp
from pyggml.core.tensor import GluOp, UnaryOp, host_ndarray
from pyggml.core.types import GGMLType as G

from tests.support.opcheck import compute

LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
for _name in ("expf", "cosf", "sinf"):
    getattr(LIBM, _name).restype, getattr(LIBM, _name).argtypes = ctypes.c_float, [ctypes.c_float]


def libm(name: str, x: np.ndarray) -> np.ndarray:
    """The C library's float32 function over x, value by value (as ggml calls it)."""
    return np.array([getattr(LIBM, name)(float(v)) for v in x.reshape(-1)], np.float32).reshape(x.shape)


def fma(a, b, c):
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + c).astype(np.float32)


def reduce_add(v: np.ndarray) -> np.ndarray:
    """_mm512_reduce_add_ps over the last axis (16): halves added lane by lane, down to one."""
    while v.shape[-1] > 1:
        half = v.shape[-1] // 2
        v = v[..., :half] + v[..., half:]
    return v[..., 0]


def tinyblas(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """out[j, i]: 16 lanes of FMAs over k (lane l takes k = l mod 16), then the lanes reduced."""
    acc = np.zeros((b.shape[0], a.shape[0], 16), np.float32)
    for k0 in range(0, a.shape[1], 16):
        acc = fma(b[:, None, k0:k0 + 16], a[None, :, k0:k0 + 16], acc)
    return reduce_add(acc)


def vec_dot(a: np.ndarray, b: np.ndarray, tail_f64: bool) -> np.ndarray:
    """ggml_vec_dot_f32 (ggml_vec_dot_f16 with tail_f64): 4 x 16 lanes over each 64 values, accumulators 0+2, 1+3,
    then those two, the lanes reduced; the last k mod 64 products added one by one (in float64 for F16)."""
    k = a.shape[1]
    whole = k // 64 * 64
    acc = np.zeros((4, b.shape[0], a.shape[0], 16), np.float32)
    for k0 in range(0, whole, 64):
        for j in range(4):
            at = slice(k0 + 16 * j, k0 + 16 * j + 16)
            acc[j] = fma(b[:, None, at], a[None, :, at], acc[j])
    total = reduce_add((acc[0] + acc[2]) + (acc[1] + acc[3]))
    total = total.astype(np.float64) if tail_f64 else total
    for i in range(whole, k):
        product = (b[:, None, i] * a[None, :, i]).astype(np.float32)
        total = total + (product.astype(np.float64) if tail_f64 else product)
    return total.astype(np.float32)


def v_expf(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf (vec.h, AVX-512) lane by lane (-inf: NaNs inside, 0 out, as in ggml)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _v_expf(x.astype(np.float32))


def _v_expf(x: np.ndarray) -> np.ndarray:
    h = lambda s: np.float32(float.fromhex(s))  # noqa: E731
    z = fma(x, h("0x1.715476p+0"), h("0x1.8p23"))
    n = z - h("0x1.8p23")
    b = fma(-n, h("0x1.7f7d1cp-20"), fma(-n, h("0x1.62e4p-1"), x))
    u = b * b
    j = fma(fma(fma(h("0x1.0e4020p-7"), b, h("0x1.573e2ep-5")), u, fma(h("0x1.555e66p-3"), b, h("0x1.fffdb6p-2"))),
            u, fma(h("0x1.ffffecp-1"), b, np.float32(1)))
    big = np.abs(n) > 192
    res = (j.astype(np.float64) * np.exp2(np.where(big, 0, n).astype(np.float64))).astype(np.float32)
    return np.where(big, np.where(n <= 0, np.float32(0), np.float32(np.inf)), res)


def vector_then_libm(x: np.ndarray, vector, scalar) -> np.ndarray:
    """ggml's row loops: vector() over each row's whole 16-value vectors, scalar() over the rest."""
    whole = x.shape[-1] // 16 * 16
    return np.concatenate([vector(x[..., :whole]), scalar(x[..., whole:])], axis=-1)


def tensor(ctx, values: np.ndarray, type_=G.F32):
    t = ctx.new_tensor(type_, list(reversed(values.shape)))
    host_ndarray(t)[...] = values
    return t


def assert_bits(out, expected: np.ndarray) -> None:
    """out, computed by the CPU kernels, holds exactly expected's values."""
    np.testing.assert_array_equal(np.asarray(host_ndarray(compute(out))).reshape(expected.shape), expected)


RNG = np.random.default_rng(11)


@pytest.mark.parametrize("m, k, n", [(20, 48, 7), (20, 48, 1), (8, 32, 21)])
def test_f32_products_in_tinyblas_order(m, k, n):
    """k a multiple of 16, rows of a a multiple of 4: tinyBLAS's order, one column too."""
    a, b = RNG.standard_normal((m, k)).astype(np.float32), RNG.standard_normal((n, k)).astype(np.float32)
    ctx = Context()
    assert_bits(ops.mul_mat(ctx, tensor(ctx, a), tensor(ctx, b)), tinyblas(a, b))


@pytest.mark.parametrize("m, k", [(6, 70), (7, 48), (8, 130)])
def test_f32_products_elsewhere_in_vec_dot_order(m, k):
    a, b = RNG.standard_normal((m, k)).astype(np.float32), RNG.standard_normal((5, k)).astype(np.float32)
    ctx = Context()
    expected = tinyblas(a, b) if k % 16 == 0 and m % 4 == 0 else vec_dot(a, b, tail_f64=False)
    assert_bits(ops.mul_mat(ctx, tensor(ctx, a), tensor(ctx, b)), expected)


def test_f32_product_with_a_permuted_b_in_vec_dot_order():
    """ggml's tinyBLAS needs b contiguous: attention's K·Q (q permuted) goes through ggml_vec_dot_f32."""
    k, q = RNG.standard_normal((3, 12, 16)).astype(np.float32), RNG.standard_normal((9, 3, 16)).astype(np.float32)
    ctx = Context()
    out = ops.mul_mat(ctx, tensor(ctx, k), ops.permute(ctx, tensor(ctx, q), 0, 2, 1, 3))
    expected = np.stack([vec_dot(k[h], q[:, h], tail_f64=False) for h in range(3)])
    assert_bits(out, expected)


@pytest.mark.parametrize("k", [48, 70])
def test_f16_by_f16_products_in_ggml_order(k):
    """The patch embedding's im2col by its kernel: tinyBLAS on the widened values, else ggml_vec_dot_f16."""
    a = RNG.standard_normal((8, k)).astype(np.float16)
    b = RNG.standard_normal((5, k)).astype(np.float16)
    ctx = Context()
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    assert_bits(ops.mul_mat(ctx, tensor(ctx, a, G.F16), tensor(ctx, b, G.F16)),
                tinyblas(a32, b32) if k % 16 == 0 else vec_dot(a32, b32, tail_f64=True))


def test_soft_max_in_ggml_order():
    """Rows without a mask: x * scale, exp by ggml_v_expf over 16-value vectors and the C library's expf past them,
    the sum of each vector's reduction in float64, 1 / sum in float64 rounded to float32."""
    x = (RNG.standard_normal((4, 37)) * 4).astype(np.float32)
    ctx = Context()
    out = ops.soft_max_ext(ctx, tensor(ctx, x), None, 0.7, 0.0)
    w = x * np.float32(0.7)
    e = vector_then_libm(w - w.max(-1, keepdims=True), v_expf, lambda t: libm("expf", t))
    sums = reduce_add(e[:, :32].reshape(4, 2, 16)).astype(np.float64).sum(-1)
    sums += e[:, 32:].astype(np.float64).sum(-1)
    assert_bits(out, e * (1.0 / sums).astype(np.float32)[:, None])


def test_masked_soft_max_rows_do_not_depend_on_where_their_values_sit():
    """A masked row's values give the same softmax wherever the unmasked ones lie among the masked (a sequence's
    cells alone or among other sequences' in a shared cache)."""
    values = (RNG.standard_normal(40) * 4).astype(np.float32)
    rows = np.zeros((3, 128), np.float32)
    mask = np.full((3, 128), -np.inf, np.float32)
    places = [np.arange(40), np.arange(40) + 37, np.arange(40) * 3 + 5]  # alone, further on, among others
    for r, at in enumerate(places):
        rows[r, at], mask[r, at] = values, 0
    ctx = Context()
    out = ops.soft_max_ext(ctx, tensor(ctx, rows), tensor(ctx, mask), 0.7, 0.0)
    got = host_ndarray(out)[0, 0]
    for r, at in enumerate(places):
        assert np.array_equal(got[r, at], got[0, places[0]])
        assert not np.delete(got[r], at).any()


def test_norm_in_ggml_order():
    """The mean summed value after value in float64; the variance 16 squares at a time (reduced in float32, added
    in float64), the tail one by one."""
    x = (RNG.standard_normal((3, 37)) * 3 + 1).astype(np.float32)
    ctx = Context()
    out = ops.norm(ctx, tensor(ctx, x), 1e-5)
    total = np.zeros(3)
    for i in range(37):
        total = total + x[:, i].astype(np.float64)
    centred = x - (total.astype(np.float32) / np.float32(37))[:, None]
    squares = centred * centred
    variance = reduce_add(squares[:, :32].reshape(3, 2, 16)).astype(np.float64).sum(-1)
    for i in range(32, 37):
        variance = variance + squares[:, i].astype(np.float64)
    scale = np.float32(1) / np.sqrt((variance / 37).astype(np.float32) + np.float32(1e-5))
    assert_bits(out, centred * scale[:, None])


def test_silu_and_swiglu_in_ggml_order():
    """x / (1 + ggml_v_expf(-x)) over each row's 16-value vectors, x / (1 + expf(-x)) past them."""
    x, g = (RNG.standard_normal((3, 37)) * 4).astype(np.float32), RNG.standard_normal((3, 37)).astype(np.float32)
    silu = vector_then_libm(x, lambda t: t / (np.float32(1) + v_expf(-t)),
                            lambda t: t / (np.float32(1) + libm("expf", -t)))
    ctx = Context()
    assert_bits(ops.unary(ctx, tensor(ctx, x), UnaryOp.SILU), silu)
    assert_bits(ops.glu_split(ctx, tensor(ctx, x), tensor(ctx, g), GluOp.SWIGLU), silu * g)


def test_rope_vision_in_ggml_order():
    """Angles p * theta_scale^k (each section restarting), cos and sin by the C library, each pair rotated as
    fma(x0, cos, -(x1 sin)) and fma(x0, sin, x1 cos)."""
    heads = RNG.standard_normal((5, 2, 16)).astype(np.float32)  # (tokens, heads, head dim)
    positions = (np.arange(20) % 7).astype(np.int32)
    ctx = Context()
    out = ops.rope_multi(ctx, tensor(ctx, heads), tensor(ctx, positions, G.I32), None, 8, (4, 4, 4, 4),
                         RopeType.VISION, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    theta_scale = np.float32(10000.0 ** (-2.0 / 8))
    theta = np.empty((5, 8), np.float32)
    for pair in range(8):
        stream, step = divmod(pair, 4)
        angle = positions.reshape(4, 5)[stream].astype(np.float32)
        for _ in range(step):
            angle = angle * theta_scale
        theta[:, pair] = angle
    cos, sin = libm("cosf", theta)[:, None], libm("sinf", theta)[:, None]
    x0, x1 = heads[..., :8], heads[..., 8:]
    expected = np.concatenate([fma(x0, cos, -(x1 * sin)), fma(x0, sin, x1 * cos)], axis=-1)
    assert_bits(out, expected)


def test_average_pool_sums_in_ggml_order():
    """Each window's values added value after value, row by row, in float32, then divided by k0 * k1."""
    x = RNG.standard_normal((2, 7, 9)).astype(np.float32)
    ctx = Context()
    out = ops.pool_2d(ctx, tensor(ctx, x), PoolOp.AVG, 3, 3, 2, 2, 0, 0)
    expected = np.zeros((2, 3, 4), np.float32)
    for ky in range(3):
        for kx in range(3):
            expected += x[:, ky:ky + 5:2, kx:kx + 7:2]
    assert_bits(out, expected / np.float32(9))
