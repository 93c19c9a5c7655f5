"""Element-wise kernels: add/sub/mul/div with ggml's repeat broadcasting, add1, add_id, scale, clamp,
sqr/sqrt/log/sin/cos, fill, leaky_relu. Values are computed in float32 and stored in dst's type."""

from __future__ import annotations

import functools
from functools import cache

import numpy as np

from pyggml.backend.cpu.kernels import kernel
from pyggml.backend.cpu.kernels._common import SPLIT_VALUES, as_f32, banded, overlap, store, view
from pyggml.backend.cpu.kernels._dequant_cache import dequantizable
from pyggml.core import types as T
from pyggml.core.tensor import Op, Tensor
from pyggml.core.types import GGMLType as G
from pyggml.errors import OutOfBoundsError, UnsupportedTypeError

# (src0, dst) pairs ggml's CPU unary template accepts; the binary template adds src1 (same type or F32).
UNARY_TYPES = frozenset({(G.F32, G.F32), (G.F16, G.F16), (G.BF16, G.BF16), (G.BF16, G.F32), (G.F16, G.F32)})
BINARY_TYPES = frozenset({(G.F32, G.F32, G.F32), (G.F16, G.F16, G.F16), (G.BF16, G.BF16, G.BF16),
                          (G.BF16, G.F32, G.BF16), (G.BF16, G.F32, G.F32), (G.F16, G.F32, G.F16),
                          (G.F16, G.F32, G.F32)})


def unary_types_ok(t: Tensor) -> bool:
    return (t.src[0].type, t.type) in UNARY_TYPES


def binary_types_ok(t: Tensor) -> bool:
    return (t.src[0].type, t.src[1].type, t.type) in BINARY_TYPES or (t.op == Op.ADD and quantized_add_ok(t))


@cache
def can_quantize(t: G) -> bool:
    """Whether rows of type t can be produced from float (gguf.quants has a quantizer for it)."""
    try:
        T.from_float(t, np.zeros((1, T.blck_size(t)), np.float32))
    except UnsupportedTypeError:
        return False
    return True


def quantized_add_ok(t: Tensor) -> bool:
    """ggml's add_q_f32 (and add1_q_f32): a quantized src0 plus F32, same shape, into src0's type (or F32)."""
    a, b = t.src[0], t.src[1]
    if not (T.is_quantized(a.type) and dequantizable(a.type) and b.type == G.F32):
        return False
    if t.op == Op.ADD and not a.same_shape(b):
        return False
    return t.type == G.F32 or (t.type == a.type and can_quantize(a.type))


def f32_or_f16(t: Tensor) -> bool:
    return t.src[0].type in (G.F32, G.F16) and t.type == t.src[0].type


def split_for_repeat(big: np.ndarray, small_shape) -> np.ndarray:
    """View `big` as (n3/m3, m3, n2/m2, m2, ...) so that a (1, m3, 1, m2, ...) array broadcasts over it as
    ggml's repeat does (element i of a dim reads element i % m). Never copies, so it works for outputs too."""
    shape, strides = [], []
    for n, m, st in zip(big.shape, small_shape, big.strides, strict=False):
        shape += [n // m, m]
        strides += [st * m, st]
    return np.lib.stride_tricks.as_strided(big, shape, strides, writeable=big.flags.writeable)


def as_repeated(small: np.ndarray) -> np.ndarray:
    """`small` with a unit axis before each dim, the partner of split_for_repeat."""
    return small[None, :, None, :, None, :, None, :]


_BINARY_UFUNCS = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide}


def _repeat_operands(dst: Tensor):
    """(src0, src1) as float32 arrays that broadcast as ggml's repeat does, and the function that gives dst
    (or any array of src0's shape) the same layout."""
    a, b = dst.src[0], dst.src[1]
    plain = all(m == n or m == 1 for m, n in zip(b.ne, a.ne, strict=True))  # then NumPy's broadcasting is ggml's repeat

    def split(x: np.ndarray) -> np.ndarray:
        return x if plain else split_for_repeat(x, b.ne[::-1])

    return split(as_f32(a)), as_f32(b) if plain else as_repeated(as_f32(b)), split


def _bind_binary(dst: Tensor):
    """All F32: the ufunc bound to the views (as_f32 of F32 is a view, so the call reads current values); many
    values without repeats and without partial overlaps: in bands of rows over the threads."""
    if not dst.type == dst.src[0].type == dst.src[1].type == G.F32:
        return None
    a8, b8, split = _repeat_operands(dst)
    ufunc, out = _BINARY_UFUNCS[dst.op], split(view(dst))
    if out.ndim != 4 or out.size < SPLIT_VALUES or overlap(out, a8, b8):
        return functools.partial(ufunc, a8, b8, out=out)
    return banded(out.shape[2], out.size, functools.partial(_bands, ufunc, a8, b8, out))


def _bands(ufunc, a: np.ndarray, b: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
    """ufunc(a, b, out=out) over rows [lo, hi) of the third dimension (b's own when not broadcast along it)."""
    ufunc(a[:, :, lo:hi], b[:, :, lo:hi] if b.shape[2] > 1 else b, out=out[:, :, lo:hi])


@kernel(Op.ADD, Op.SUB, Op.MUL, Op.DIV, supports=binary_types_ok, bind=_bind_binary)
def binary(dst: Tensor) -> None:
    """dst = src0 (op) src1 repeated to src0's shape; F32 goes straight into dst's memory."""
    ufunc = _BINARY_UFUNCS[dst.op]
    a8, b8, split = _repeat_operands(dst)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # inf and NaN as C float arithmetic gives
        if dst.type == G.F32:
            ufunc(a8, b8, out=split(view(dst)))
        else:
            store(dst, ufunc(a8, b8).reshape(dst.ne[::-1]))


@kernel(Op.ADD1, supports=lambda t: t.type == t.src[0].type and (quantized_add_ok(t) or (
        (t.src[0].type, t.src[1].type) in {(G.F32, G.F32), (G.F16, G.F16), (G.F16, G.F32), (G.BF16, G.BF16),
                                           (G.BF16, G.F32)})))
def add1(dst: Tensor) -> None:
    store(dst, as_f32(dst.src[0]) + as_f32(dst.src[1]).reshape(()))


@kernel(Op.ADD_ID, supports=lambda t: (t.type, t.src[0].type, t.src[1].type, t.src[2].type) ==
        (G.F32, G.F32, G.F32, G.I32))
def add_id(dst: Tensor) -> None:
    """dst[i3, i2, i1] = src0[i3, i2, i1] + src1 row ids[i2, i1]."""
    a, b, ids = dst.src[0], dst.src[1], dst.src[2]
    rows = view(ids)[0, 0, : a.ne[2], : a.ne[1]]
    if rows.size and (rows.min() < 0 or rows.max() >= b.ne[1]):
        raise OutOfBoundsError(f"add_id {dst.name!r}: ids in {ids.name!r} must lie in [0, {b.ne[1]}), "
                               f"got [{rows.min()}, {rows.max()}]")
    np.add(view(a), view(b)[0, 0][rows][None], out=view(dst))


def _bind_scale(dst: Tensor):
    if dst.op_params_f32(1) != 0.0:
        return None
    return functools.partial(np.multiply, view(dst.src[0]), np.float32(dst.op_params_f32(0)), out=view(dst))


@kernel(Op.SCALE, supports=lambda t: t.type == t.src[0].type == G.F32, bind=_bind_scale)
def scale(dst: Tensor) -> None:
    s, bias = dst.op_params_f32(0), dst.op_params_f32(1)
    out = view(dst)
    np.multiply(view(dst.src[0]), np.float32(s), out=out)
    if bias != 0.0:
        out += np.float32(bias)


@kernel(Op.CLAMP, supports=f32_or_f16)
def clamp(dst: Tensor) -> None:
    lo, hi = np.float32(dst.op_params_f32(0)), np.float32(dst.op_params_f32(1))
    store(dst, np.maximum(np.minimum(as_f32(dst.src[0]), hi), lo))


@kernel(Op.FILL, supports=f32_or_f16)
def fill(dst: Tensor) -> None:
    store(dst, np.float32(dst.op_params_f32(0)))


@kernel(Op.LEAKY_RELU, supports=f32_or_f16)
def leaky_relu(dst: Tensor) -> None:
    x = as_f32(dst.src[0])
    store(dst, np.maximum(x, 0) + np.float32(dst.op_params_f32(0)) * np.minimum(x, 0))


def _sqr(x):
    return x * x


_MATH = {Op.SQR: _sqr, Op.SQRT: np.sqrt, Op.LOG: np.log, Op.SIN: np.sin, Op.COS: np.cos}


@kernel(Op.SQR, Op.SQRT, Op.LOG, Op.SIN, Op.COS, supports=unary_types_ok)
def math_op(dst: Tensor) -> None:
    with np.errstate(invalid="ignore", divide="ignore"):  # log/sqrt of negatives give NaN/-inf, as in C
        store(dst, _MATH[dst.op](as_f32(dst.src[0])))
