"""Kernels that move data: dup/cpy/cont (with type conversion and quantization), repeat, repeat_back,
concat, pad, get_rows, set_rows, diag, and the strided writes set and acc."""

from __future__ import annotations

import functools

import numpy as np

from pyggml.backend.cpu.jit import f16 as jit_f16
from pyggml.backend.cpu.jit import rows as jit_rows
from pyggml.backend.cpu.jit.mul_mat import dequantize_rows
from pyggml.backend.cpu.jit.repack import unpack_rows
from pyggml.backend.cpu.kernels import kernel
from pyggml.backend.cpu.kernels._blocks import blocks_per_row, in_blocks, memory_of
from pyggml.backend.cpu.kernels._common import (FLOAT_TYPES, INTERLEAVED, as_f32, banded, expanded_values, flat_rows,
                                                rows_2d, store, view)
from pyggml.backend.cpu.kernels._dequant_cache import dequantizable
from pyggml.backend.cpu.kernels.elementwise import as_repeated, can_quantize, split_for_repeat
from pyggml.core import types as T
from pyggml.core.tensor import Op, Tensor
from pyggml.core.types import GGMLType as G
from pyggml.errors import OutOfBoundsError


def copy_supported(src: G, dst: G) -> bool:
    """The (src, dst) type pairs of ggml_compute_forward_dup."""
    if src == dst:
        return True
    if src in FLOAT_TYPES:
        return dst in FLOAT_TYPES or (src == G.F32 and dst == G.I32) or (T.is_quantized(dst) and can_quantize(dst))
    if src == G.I32:
        return dst == G.F32
    return T.is_quantized(src) and dst == G.F32 and dequantizable(src)


def blocks(t: Tensor) -> np.ndarray:
    """A quantized tensor as an array of whole blocks, shape (ne3, ne2, ne1, blocks per row, block bytes)."""
    rows = view(t)
    ts = T.type_size(t.type)
    shape = (*rows.shape[:3], rows.shape[3] // ts, ts)
    return np.lib.stride_tricks.as_strided(rows, shape, (*rows.strides[:3], ts, 1))


def _bind_copy(dst: Tensor):
    """A copy between plain tensors of one type: np.copyto between views of one shape; F32 to F16: compiled."""
    src = dst.src[0]
    if src.type == G.F32 and dst.type == G.F16:
        return _bind_f32_to_f16(dst)
    if src.type != dst.type or T.is_quantized(src.type):
        return None
    a, out = view(src), view(dst)
    for shape in (out.shape, a.shape):  # src seen in dst's shape, or dst in src's, whichever is a view
        try:
            return functools.partial(np.copyto, np.reshape(out, shape, copy=False), np.reshape(a, shape, copy=False))
        except ValueError:
            continue
    return None


def _bind_f32_to_f16(dst: Tensor):
    """F32 rows of one shape as dst's, values contiguous (a permuted view: flash attention's K and V) into a
    contiguous F16 dst: the compiled rounding reads them in place, split over the threads by rows (NumPy's copy
    then the rounding ran on one thread, 15 ms of SmolVLM's encoder)."""
    src = dst.src[0]
    x, out = view(src), view(dst)
    if src.ne != dst.ne or not out.flags.c_contiguous or x.strides[3] != 4 or np.may_share_memory(x, out):
        return None
    flat, strides = flat_rows(x)
    layout = np.array([*x.shape[1:], *strides], np.int64)
    bits, n_rows = out.view(np.uint16).reshape(-1), x.shape[0] * x.shape[1] * x.shape[2]
    return banded(n_rows, out.size, lambda lo, hi: jit_f16.f32_to_f16_rows(flat, layout, bits, lo, hi))


@kernel(Op.DUP, Op.CPY, Op.CONT, supports=lambda t: copy_supported(t.src[0].type, t.type), bind=_bind_copy)
def copy(dst: Tensor) -> None:
    """dst's elements, in row-major order, are src0's elements in row-major order (shapes may differ)."""
    src = dst.src[0]
    if src.type == dst.type and T.is_quantized(src.type):
        out = blocks(dst)
        out[...] = blocks(src).reshape(out.shape)
    elif src.type == dst.type:
        out = view(dst)
        out[...] = view(src).reshape(out.shape)
    else:
        store(dst, as_f32(src).reshape(dst.ne[::-1]))


def plain_same_type(t: Tensor) -> bool:
    return t.type == t.src[0].type and not T.is_quantized(t.type)


@kernel(Op.REPEAT, supports=plain_same_type)
def repeat(dst: Tensor) -> None:
    src = dst.src[0]
    split_for_repeat(view(dst), src.ne[::-1])[...] = as_repeated(view(src))


@kernel(Op.REPEAT_BACK, supports=lambda t: t.type == t.src[0].type == G.F32)
def repeat_back(dst: Tensor) -> None:
    """Each element of dst is the sum of the src0 elements that a repeat would have copied from it."""
    np.sum(split_for_repeat(view(dst.src[0]), dst.ne[::-1]), axis=(0, 2, 4, 6), out=view(dst))


@kernel(Op.CONCAT, supports=lambda t: plain_same_type(t) and t.src[1].type == t.type)
def concat(dst: Tensor) -> None:
    a, b = dst.src[0], dst.src[1]
    axis = 3 - dst.op_params[0]
    out = view(dst)
    n = a.ne[dst.op_params[0]]
    np.copyto(out[(slice(None),) * axis + (slice(0, n),)], view(a))
    np.copyto(out[(slice(None),) * axis + (slice(n, None),)], view(b))


@kernel(Op.PAD, supports=lambda t: t.type == t.src[0].type == G.F32)
def pad(dst: Tensor) -> None:
    """op_params: [lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, circular]; zeros outside, or wrapped when circular."""
    src, out = view(dst.src[0]), view(dst)
    left = [dst.op_params[2 * d] for d in range(4)][::-1]  # in NumPy axis order
    if dst.op_params[8]:
        index = [(np.arange(n) - lp) % m for n, lp, m in zip(out.shape, left, src.shape, strict=True)]
        out[...] = src[np.ix_(*index)]
    else:
        out[...] = 0
        out[tuple(slice(lp, lp + m) for lp, m in zip(left, src.shape, strict=True))] = src


def _checked_ids(dst: Tensor, ids_tensor: Tensor, ids: np.ndarray, n_rows: int) -> np.ndarray:
    if ids.size and (ids.min() < 0 or ids.max() >= n_rows):
        raise OutOfBoundsError(f"{dst.op.name.lower()} {dst.name!r}: row ids in {ids_tensor.name!r} must lie in "
                               f"[0, {n_rows}), got [{ids.min()}, {ids.max()}]")
    return ids


def _get_rows_supported(t: Tensor) -> bool:
    src = t.src[0].type
    if src == G.I32:
        return t.type == G.I32
    return t.type == G.F32 and (src in FLOAT_TYPES or (T.is_quantized(src) and dequantizable(src)))


@kernel(Op.GET_ROWS, supports=_get_rows_supported, reads_interleaved=True)
def get_rows(dst: Tensor) -> None:
    """dst[i12, i11, i10] = src0 row ids[i12, i11, i10] of plane (i12, i11); quantized rows are dequantized."""
    a, b = dst.src[0], dst.src[1]
    ids = _checked_ids(dst, b, view(b)[0], a.ne[1])
    n12, n11 = ids.shape[:2]
    if a.extra is INTERLEAVED:
        _get_rows_interleaved(dst, ids)
        return
    if in_blocks(a):
        _get_rows_blocks(dst, ids)
        return
    expanded = expanded_values(a)  # a CPU_F32 matrix's rows are float32 values already
    rows = expanded if expanded is not None else view(a)
    picked = rows[np.arange(n12)[:, None, None], np.arange(n11)[None, :, None], ids]
    if expanded is not None:
        store(dst, picked)
    elif a.type == G.I32:
        view(dst)[...] = picked
    else:
        store(dst, T.to_float(a.type, picked))


def _get_rows_interleaved(dst: Tensor, ids: np.ndarray) -> None:
    """get_rows of a matrix in CPU_INTERLEAVED (a tied token embedding, also the output head), or of a stack of them
    (experts): the rows' bytes gathered back out of their groups, then decoded. Row ids[i12, i11] of plane
    (i12, i11) is row ids + ne1·(i11 + ne2·i12) of the whole tensor (its groups never straddle two planes)."""
    a = dst.src[0]
    i12, i11 = np.arange(ids.shape[0])[:, None, None], np.arange(ids.shape[1])[None, :, None]
    flat = ids.astype(np.int64) + a.ne[1] * (i11 + a.ne[2] * i12)
    rows = unpack_rows(int(a.type), a.buffer.quant_bytes(a), 0, a.nb[1], flat)
    src = rows.reshape(-1)
    src.flags.writeable = False  # the signature the kernel has for mapped weights
    values = np.empty((rows.shape[0], a.ne[0]), np.float32)
    dequantize_rows(int(a.type), src, np.arange(rows.shape[0], dtype=np.uint64) * np.uint64(a.nb[1]),
                    blocks_per_row(a), values)
    store(dst, values.reshape(ids.shape + (a.ne[0],)))


def _get_rows_blocks(dst: Tensor, ids: np.ndarray) -> None:
    """get_rows with src0 decoded in place by the compiled kernels (no float32 copy of the matrix)."""
    a = dst.src[0]
    src, first = memory_of(a)
    i12, i11 = np.arange(ids.shape[0])[:, None, None], np.arange(ids.shape[1])[None, :, None]
    rows = (first + ids.astype(np.int64) * a.nb[1] + i11 * a.nb[2] + i12 * a.nb[3]).reshape(-1).astype(np.uint64)
    out = view(dst)
    direct = out.flags.c_contiguous and out.dtype == np.float32
    values = out.reshape(-1, a.ne[0]) if direct else np.empty((rows.size, a.ne[0]), np.float32)
    dequantize_rows(int(a.type), src, rows, blocks_per_row(a), values)
    if not direct:
        store(dst, values.reshape(ids.shape + (a.ne[0],)))


def _bind_set_rows(dst: Tensor):
    """The compiled row scatter for one plane into F32, F16, Q8_0 or Q4_0 rows (a KV cache write)."""
    src, ids = dst.src[0], dst.src[1]
    scatter = _COMPILED_SET_ROWS.get(dst.type)
    if scatter is None or src.ne[2] != 1 or src.ne[3] != 1 or ids.ne[1] != 1 or ids.ne[2] != 1:
        return None
    rows, out = rows_2d(view(src)), rows_2d(view(dst))
    if rows is None or out is None or np.may_share_memory(out, rows):
        return None
    if dst.type == G.F16:
        out = out.view(np.uint16)
    row_ids = view(ids)[0, 0, 0]

    def call():
        if scatter(rows, row_ids, out) >= 0:
            set_rows(dst)  # reports the ids out of range

    return call


_COMPILED_SET_ROWS = {G.F32: jit_rows.set_rows_f32, G.F16: jit_rows.set_rows_f16, G.Q8_0: jit_rows.set_rows_q8_0,
                      G.Q4_0: jit_rows.set_rows_q4_0}


@kernel(Op.SET_ROWS, supports=lambda t: t.src[0].type == G.F32 and t.src[1].type in (G.I32, G.I64) and (
        t.type in FLOAT_TYPES or (T.is_quantized(t.type) and can_quantize(t.type))), bind=_bind_set_rows)
def set_rows(dst: Tensor) -> None:
    """dst row ids[i3 % n12, i2 % n11, i] of plane (i3, i2) = src0 row i of plane (i3, i2), converted."""
    rows, c = view(dst.src[0]), dst.src[1]
    ids3 = view(c)[0]
    n3, n2 = rows.shape[:2]
    values = rows if dst.type == G.F32 else T.from_float(dst.type, rows)
    if n3 == n2 == 1:  # one plane (a KV cache write): plain row indexing, of values for one-value rows
        ids = _checked_ids(dst, c, ids3[0, 0], dst.ne[1])
        if dst.ne[0] == 1:
            view(dst)[0, 0, :, 0][ids] = values[0, 0, :, 0]
        else:
            view(dst)[0, 0][ids] = values[0, 0]
        return
    ids = _checked_ids(dst, c, np.tile(ids3, (n3 // ids3.shape[0], n2 // ids3.shape[1], 1)), dst.ne[1])
    view(dst)[np.arange(n3)[:, None, None], np.arange(n2)[None, :, None], ids] = values


@kernel(Op.SET, Op.ACC, supports=lambda t: t.src[1].type == t.type
        and (t.type == G.F32 or (t.op == Op.SET and t.type == G.I32)))
def set_acc(dst: Tensor) -> None:
    """op_params [nb1, nb2, nb3, offset, inplace]: dst starts as a copy of a (inplace it is a), then the region
    of dst seen with b's shape at those byte strides and offset is overwritten with b (SET) or gets b added (ACC)."""
    a, b = dst.src[0], dst.src[1]
    nb1, nb2, nb3, offset, inplace = dst.op_params[:5]
    if not inplace:
        np.copyto(view(dst), view(a))
    flat = view(dst).reshape(-1)
    region = np.lib.stride_tricks.as_strided(flat[offset // flat.itemsize:], tuple(reversed(b.ne)),
                                             (nb3, nb2, nb1, flat.itemsize))
    if dst.op == Op.SET:
        region[...] = view(b)
    else:
        region += view(b)


@kernel(Op.DIAG, supports=lambda t: t.type == t.src[0].type == G.F32)
def diag(dst: Tensor) -> None:
    n = dst.ne[0]
    np.multiply(np.eye(n, dtype=np.float32), view(dst.src[0]), out=view(dst))
