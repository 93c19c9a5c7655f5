"""MUL_MAT, MUL_MAT_ID and OUT_PROD on the CPU.

A src0 in CPU_INTERLEAVED (a matrix, or a MoE layer's stack of experts, of a type with integer products:
pyggml.backend.cpu.interleave) is multiplied in int8 against src1 quantized to Q8_0 or Q8_K, as ggml's CPU
kernels do. A src0 in a block format the compiled kernels decode (F16, BF16, Q4_0 ... Q6_K, IQ4_NL/XS, MXFP4;
see pyggml.backend.cpu.jit) is read in place: a few columns go through `mul_mat_vec` (rows dequantized in
registers, threads over rows), many columns through row bands shared out over the threads, each band's
tiles of rows dequantized to float32 and multiplied by a one-thread BLAS sgemm on that thread; an F32
matrix (weight or KV cache) is read in place the same way up to GROUPED_COLUMNS columns.
Other sources (F32 beyond that, CPU_F32 values, or a cached dequantized copy) go to BLAS directly.
ggml converts src1 to src0's vec_dot type (F16, Q8_0, Q8_K) before its dot products; here src1 stays float32,
which is at least as accurate (within ggml's 5e-4 NMSE for these ops).
"""

from __future__ import annotations

import functools

import numpy as np

from pyggml.backend.cpu.jit import PARALLEL_LAUNCH, launched
from pyggml.backend.cpu.jit.mul_mat import dequantize_rows, mul_mat_float_columns, mul_mat_vec
from pyggml.backend.cpu.jit.ir.vnni_ir import ROWS
from pyggml.backend.cpu.jit.ir.vnni_k_ir import K_FORMATS, Q8K_WORDS
from pyggml.backend.cpu.jit.ir.amx_ir import SUB_BLOCKS, amx_usable, tile_config
from pyggml.backend.cpu.jit.repack import (gemm_16x4_q8_0, gemm_16x4_q8_K, gemm_amx, quantize_q8_0,
                                           quantize_q8_K)
from pyggml.backend.cpu.kernels import kernel
from pyggml.backend.cpu.kernels._blocks import THREADS_MAX, blocks_per_row, in_blocks, memory_of, threads
from pyggml.backend.cpu.kernels._common import (FLOAT_TYPES, INTERLEAVED, Scratch, as_f32, blas_threads,
                                                expanded_values, split_over_threads, view)
from pyggml.backend.cpu.kernels._dequant_cache import DEQUANT_CACHE, dequantizable
from pyggml.core import types as T
from pyggml.core.tensor import Op, Tensor, host_ndarray
from pyggml.errors import OutOfBoundsError


def src0_f32(t: Tensor) -> np.ndarray:
    """src0's values as float32, shape ne[::-1]: a view for F32 and CPU_F32 weights, else a (cached) dequantized
    copy."""
    if t.type == T.GGMLType.F32:
        return view(t)
    expanded = expanded_values(t)
    return expanded if expanded is not None else DEQUANT_CACHE.get(t)


def _blasable(m: np.ndarray) -> np.ndarray:
    """A stack of matrices whose rows are contiguous, so np.matmul hands them to BLAS (copy only if not)."""
    return m if m.strides[-1] == m.itemsize else np.ascontiguousarray(m)


def _out_view(dst: Tensor, shape) -> np.ndarray:
    """dst's memory reshaped without copying (raises rather than silently writing into a copy)."""
    return np.reshape(view(dst), shape, copy=False)


def _supports_product(dst: Tensor) -> bool:
    """Products that read src0's values (float32, or decoded from its blocks): not an interleaved src0."""
    a, b = dst.src[0], dst.src[1]
    return (dst.type == T.GGMLType.F32 and b.type in FLOAT_TYPES and dequantizable(a.type)
            and a.extra is not INTERLEAVED)


def _supports_mul_mat(dst: Tensor) -> bool:
    a, b = dst.src[0], dst.src[1]
    if a.extra is INTERLEAVED:  # matrices of whole 16-row groups (the buffer checked)
        return dst.type == T.GGMLType.F32 and b.type in FLOAT_TYPES
    return _supports_product(dst)


def _broadcast_split(dst: Tensor, wa: np.ndarray, wb: np.ndarray):
    """Split dims 3, 2 into (a3, r3, a2, r2) so that a's matrix i2 // r2, i3 // r3 broadcasts onto b's i2, i3."""
    a, b = dst.src[0], dst.src[1]
    split = (a.ne[3], b.ne[3] // a.ne[3], a.ne[2], b.ne[2] // a.ne[2])
    a_split = (split[0], 1, split[2], 1)
    return wa.reshape(*a_split, *wa.shape[2:]), wb.reshape(*split, *wb.shape[2:]), split


SMALL_BATCH = 32            # below this many rows of b a product is memory-bound, and ...
SMALL_MATRIX = 256 * 1024  # ... below this many elements of a, BLAS's threads only add synchronisation
VEC_COLUMNS = 4            # up to this many columns of b per plane, block rows are multiplied in registers
FEW_ROWS = 4 * VEC_COLUMNS  # mul_mat_id: an expert used by up to this many rows reads its blocks once per 4 rows
# Up to this many columns, VEC_COLUMNS at a time rather than dequantized tiles and sgemm: a step of several
# sequences' next tokens against the KV cache. Faster (Gemma 3 270M, 8 sequences: 78 -> 57 ms a step; the KV
# products 2-3x, docs/backends.md §7), and each column is summed in the order of that token decoded alone, so a
# batched sequence gets its logits alone exactly; sgemm's order differs by float32 rounding, which the next
# product's Q8 activations can turn into a flipped quant (0.9 on Gemma's logits, tests/models/test_batch.py).
# F32 weights and KV cache too: sgemm's column against the kernel's for one token differ by an ulp, which ggml's
# F16-table GELU can turn into a step of 2^-11 (random F32 GPT-2: KLD 2.5e-9 batched against alone, 6e-13 this
# way; random Gemma 3 4.1e-9 with the F32 KV cache still on sgemm).
GROUPED_COLUMNS = 4 * VEC_COLUMNS
# float32 scratch (one per thread, kept) for a tile of dequantized rows: a vision encoder's row bands whole, a
# prompt's in few tiles, so that each sgemm sees many rows (SigLIP's 768 x 768 F16 in 2 MiB tiles of 682 and 86
# rows took 2x the time of one sgemm, its 768 x 3072 in tiles of 170 rows 1.35x)
TILE_BYTES = 16 << 20
BANDS_PER_THREAD = 4       # row bands per thread in mul_mat_vec: a busy core delays only a small band
FLOAT_ROWS = (T.GGMLType.F32, T.GGMLType.F16)  # matrices of the float rows kernel (mul_mat_float_columns)


def _columns_of_one_product(a: Tensor, b: Tensor) -> bool:
    """Whether b holds one column per plane and consecutive planes of b share a plane of a (the query heads
    of one KV head in generation): then they are the columns of one product, and a's rows are read once."""
    return b.ne[1] == 1 and b.ne[3] == a.ne[3] and b.ne[2] > a.ne[2]


def _a_planes(dst: Tensor, first: int) -> np.ndarray:
    """Byte offsets of a's matrix for each of b's planes (i3, i2) in order, broadcasting as ggml does."""
    a, b = dst.src[0], dst.src[1]
    return _planes(first, b.ne[3], b.ne[2], a.ne[3], a.ne[2], a.nb[3], a.nb[2])


@functools.lru_cache(maxsize=4096)
def _planes(first: int, b3: int, b2: int, a3: int, a2: int, nb3: int, nb2: int) -> np.ndarray:
    """(cached: a token's products ask for the same few layouts every step; the array is never written)"""
    i3, i2 = np.divmod(np.arange(b3 * b2), b2)
    return (first + (i3 // (b3 // a3)) * nb3 + (i2 // (b2 // a2)) * nb2).astype(np.uint64)


def _columns_by_matrix(planes: np.ndarray, x: np.ndarray, y: np.ndarray):
    """(planes, x, y) with each run of b's planes over one matrix of a (the query heads of one KV head: GQA
    broadcasting) taken as the columns of one plane, where x and y allow it as views: the float rows kernel
    then reads each row of a once for all of them (Llama 3.2 1B's KV products at 16 sequences: each row read
    once, not 16 times), and every column is still summed as alone. Otherwise the arguments as they are."""
    group = len(planes) // len(np.unique(planes))
    if group == 1 or len(planes) % group or not (planes.reshape(-1, group) == planes[::group, None]).all():
        return planes, x, y
    try:
        shape = (len(planes) // group, group * x.shape[1])
        return planes[::group], np.reshape(x, (*shape, x.shape[2]), copy=False), np.reshape(
            y, (*shape, y.shape[2]), copy=False)
    except ValueError:  # not a view of b or dst: multiplied plane by plane
        return planes, x, y


def _matvec_call(a: Tensor, src: np.ndarray, planes: np.ndarray, x: np.ndarray, y: np.ndarray):
    """The compiled matrix-vector call with all its arguments bound (a step's products repeat it token after
    token), on Numba's threads whatever the size: the prange kernel is faster than the same loop compiled
    serially even on one thread (Q4_0 1536 x 576: 56 against 88 us), and two threads win from 164 Ki
    weights on (10 against 17 us). Float matrices (F32, F16: the KV cache) go through the float-rows
    kernel, the others through the blocks."""
    if a.type in FLOAT_ROWS:
        planes, x, y = _columns_by_matrix(planes, x, y)
        size = T.type_size(a.type)
        values = src[: src.size // size * size].view(np.float32 if a.type == T.GGMLType.F32 else np.uint16)
        kernel_, args = mul_mat_float_columns, (values, planes // size, a.nb[1] // size, a.ne[1], a.ne[0], x, y)
    else:
        kernel_, args = mul_mat_vec[int(a.type)], (src, planes, a.nb[1], a.ne[1], blocks_per_row(a), x, y)
    return launched(functools.partial(kernel_, *args, max(1, min(THREADS_MAX * BANDS_PER_THREAD, a.ne[1] // 16))))


class _Q8Scratch:
    """The quantized activations of the interleaved products: one buffer for all of them, grown to the largest
    (a prompt's 200 products would otherwise hold 70 MiB of it); used under PARALLEL_LAUNCH only. Q8_0: quants,
    scales, Σq and Q8_1's s per 32 values; Q8_K: quants, a scale per 256 values, Q8K_WORDS sums per 256.

    `held` names what the buffer holds: (the graph tensor b, its format) after a graph product, None after
    anything else. Products of one b in a row (a layer's q, k and v; gate and up) quantize it once: b is not
    written while products that read it are still to run (the graph allocator keeps it live until its last
    reader), and `forget` runs before each graph compute, when the same tensors take new values."""

    def __init__(self):
        self.quants, self.scales, self.sums, self.s = (np.empty(0, dt) for dt in (np.uint8, np.float32, np.int32,
                                                                                  np.float32))
        self.held = None

    def forget(self) -> None:
        self.held = None

    def _grown(self, n: int, k: int):
        if self.quants.size < n * k:
            self.quants = np.empty(n * k, np.uint8)
            self.scales, self.s = (np.empty(n * k // 32, np.float32) for _ in range(2))
            self.sums = np.empty(-(-n * k // 256) * Q8K_WORDS, np.int32)

    def q8_0(self, n: int, k: int):
        self._grown(n, k)
        blocks = n * k // 32
        return self.quants[: n * k], self.scales[:blocks], self.sums[:blocks], self.s[:blocks]

    def q8_K(self, n: int, k: int):
        self._grown(n, k)
        return self.quants[: n * k], self.scales[: n * k // 256], self.sums[: n * k // 256 * Q8K_WORDS]


_Q8 = _Q8Scratch()


def forget_quantized_activations() -> None:
    """Before a graph compute: its tensors take new values (see _Q8Scratch)."""
    with PARALLEL_LAUNCH:
        _Q8.forget()


AMX_MIN_TOKENS, AMX_MIN_WORK = 128, 2048  # below, unpacking the weights for the tile unit cost more than it saved


def on_tile_unit(qtype: int, matrices: int, n: int, k: int) -> bool:
    """Whether a product goes to the tile unit (jit/repack.py's gemm_amx): one Q4_K or Q6_K matrix, a prompt of at
    least AMX_MIN_TOKENS tokens and AMX_MIN_WORK tokens x blocks a row (Q4_K on this Xeon, 2 threads, against the
    VNNI tiles: 2048 x 2048 at 64, 128, 256 tokens 0.86x, 0.92x, 1.20x; 4096 x 14336 at 128: 1.17x), AMX usable."""
    return (qtype in SUB_BLOCKS and matrices == 1 and n >= AMX_MIN_TOKENS and n * (k // 256) >= AMX_MIN_WORK
            and amx_usable())


def _integer_call(a: Tensor, firsts: np.ndarray, starts: np.ndarray, x: np.ndarray, y: np.ndarray,
                  b: Tensor | None = None):
    """The call of the integer products of a (in a CPU_INTERLEAVED buffer) with the float32 rows x (n, k) into
    y (n, a.ne1): x quantized to Q8_0 (Q8_K for the K-quants), then rows starts[i] .. starts[i+1] - 1 times the
    matrix at byte firsts[i] of a (jit/repack.py), all in one launch: a prompt's batch, a generation step's
    one row, or the rows each expert was chosen for. b: the graph tensor x holds (its quantization is reused
    by the next product of b, see _Q8Scratch), None for rows gathered here."""
    n, k = x.shape
    w, qtype, groups = a.buffer.quant_bytes(a), int(a.type), a.ne[1] // ROWS

    def quantized(fmt: str) -> bool:
        """Whether the scratch already holds b in this format; it is marked as holding it either way."""
        key = None if b is None else (b, fmt, n, k)
        held, _Q8.held = _Q8.held, key
        return key is not None and held is not None and held[0] is b and held[1:] == key[1:]

    gemm_q8_0 = gemm_16x4_q8_0[qtype] if qtype not in K_FORMATS else None  # the type's kernel, looked up once
    if qtype in K_FORMATS and on_tile_unit(qtype, len(firsts), n, k):
        amx, first, config = gemm_amx[qtype], int(firsts[0]), tile_config(qtype)

        def products_q8_K(xq, xd, xb) -> None:
            amx(w, first, k // 256, groups, xq, xd, xb, y, config)
    elif qtype in K_FORMATS:
        gemm_q8_K = gemm_16x4_q8_K[qtype]

        def products_q8_K(xq, xd, xb) -> None:
            gemm_q8_K(w, firsts, k // 256, groups, xq, xd, xb, starts, y)

    def call_q8_0() -> None:
        with PARALLEL_LAUNCH:
            xq, xd, xs, xm = _Q8.q8_0(n, k)
            if not quantized("q8_0"):
                quantize_q8_0(x, xq, xd, xs, xm)
            gemm_q8_0(w, firsts, k // 32, groups, xq, xd, xs, xm, starts, y)

    def call_q8_K() -> None:
        with PARALLEL_LAUNCH:
            xq, xd, xb = _Q8.q8_K(n, k)
            if not quantized("q8_K"):
                quantize_q8_K(x, xq, xd, xb)
            products_q8_K(xq, xd, xb)

    return call_q8_K if qtype in K_FORMATS else call_q8_0


def _interleaved_call(dst: Tensor, x: np.ndarray):
    """The call of dst = a·b for a in a CPU_INTERLEAVED buffer and the float32 rows x (n, k) of b: one segment
    for a 2-D a, else each plane of b against its matrix of a (broadcast as ggml does)."""
    a, b = dst.src[0], dst.src[1]
    n = x.shape[0]
    if a.ne[2] == a.ne[3] == 1:
        firsts, starts = np.zeros(1, np.int64), np.array([0, n], np.int64)
    else:
        firsts = _a_planes(dst, 0).astype(np.int64)
        starts = np.arange(len(firsts) + 1, dtype=np.int64) * b.ne[1]
    return _integer_call(a, firsts, starts, x, _out_view(dst, (n, a.ne[1])), b)


def _interleaved_rows(dst: Tensor) -> np.ndarray:
    """b's rows as float32 (n, k) for an interleaved product: a view where b is F32 with contiguous rows."""
    b = dst.src[1]
    return np.ascontiguousarray(np.reshape(as_f32(b), (-1, b.ne[0])), dtype=np.float32)


_TILES = Scratch()  # the dequantized tiles' float32, one per thread that multiplies


def _users(planes: np.ndarray, plane) -> np.ndarray | slice:
    """The planes of b that multiply the matrix at byte `plane`: a slice when consecutive (the query heads of one
    KV head: views of x and y, no copies), else their indices."""
    using = np.flatnonzero(planes == plane)
    return slice(using[0], using[-1] + 1) if using[-1] - using[0] + 1 == len(using) else using


def _product_on_blocks(a: Tensor, src: np.ndarray, planes: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """y[i] = x[i] · (a's matrix at byte planes[i] of src)ᵀ for float32 x (P, n, k) and y (P, n, a.ne1)."""
    if x.shape[1] <= VEC_COLUMNS or (x.shape[1] <= GROUPED_COLUMNS and a.type in FLOAT_ROWS):
        _matvec_call(a, src, planes, x, y)()  # the float rows kernel takes any number of columns in one pass
        return
    if x.shape[1] <= GROUPED_COLUMNS:  # a few sequences' tokens: the matrix-vector kernel, VEC_COLUMNS at a time
        for c in range(0, x.shape[1], VEC_COLUMNS):
            part = np.empty((y.shape[0], min(VEC_COLUMNS, x.shape[1] - c), y.shape[2]), np.float32)
            _matvec_call(a, src, planes, np.ascontiguousarray(x[:, c:c + VEC_COLUMNS]), part)()
            y[:, c:c + part.shape[1]] = part
        return
    qtype, nb, k = int(a.type), blocks_per_row(a), a.ne[0]
    distinct = np.unique(planes)
    users = [_users(planes, plane) for plane in distinct]
    bands = threads() if len(distinct) < threads() else 1  # few matrices: each split into row bands
    per = -(-a.ne[1] // bands)

    def band_of(i: int) -> None:
        """Rows [r_lo, r_hi) of one matrix of a, tile by tile: dequantized on this thread, then one sgemm."""
        plane, using, r_lo = distinct[i // bands], users[i // bands], (i % bands) * per
        r_hi = min(a.ne[1], r_lo + per)
        xs = x[using]
        tile_rows = max(1, min(r_hi - r_lo, TILE_BYTES // (4 * k)))
        tile = _TILES.take((tile_rows, k))
        for r0 in range(r_lo, r_hi, tile_rows):
            rows = plane + np.arange(r0, min(r0 + tile_rows, r_hi), dtype=np.uint64) * np.uint64(a.nb[1])
            values = tile[:len(rows)]
            dequantize_rows(qtype, src, rows, nb, values)
            if isinstance(using, slice):
                np.matmul(xs, values.T, out=y[using, :, r0:r0 + len(rows)])
            else:
                y[using, :, r0:r0 + len(rows)] = np.matmul(xs, values.T)

    split_over_threads(band_of, len(distinct) * bands)


def _vector_operands(dst: Tensor, first: int):
    """(byte offsets of a's planes, x (P, columns, k), y (P, columns, a.ne1)) of dst = a·b, x and y views of b
    and dst where their layout allows (else x a copy; y always a view: ValueError if impossible)."""
    a, b = dst.src[0], dst.src[1]
    if _columns_of_one_product(a, b) and b.ne[2] // a.ne[2] <= VEC_COLUMNS:
        planes, columns = _planes(first, a.ne[3], a.ne[2], a.ne[3], a.ne[2], a.nb[3], a.nb[2]), b.ne[2] // a.ne[2]
    else:
        planes, columns = _a_planes(dst, first), b.ne[1]
    x = np.reshape(as_f32(b), (len(planes), columns, b.ne[0]))
    return planes, x, _out_view(dst, (len(planes), columns, a.ne[1]))


def _mul_mat_blocks(dst: Tensor) -> None:
    """mul_mat with src0 read in its block format (see the module docstring)."""
    src, first = memory_of(dst.src[0])
    planes, x, y = _vector_operands(dst, first)
    _product_on_blocks(dst.src[0], src, planes, np.ascontiguousarray(x, dtype=np.float32), y)


def _bind_mul_mat(dst: Tensor):
    """The compiled call for a few float32 columns of b read in place (a generation step's products), a read
    where it is: in its blocks, or float32 (the KV cache); up to GROUPED_COLUMNS of them for a float matrix, which
    the float rows kernel takes in one pass as _product_on_blocks does (eight sequences' steps: the call bound
    once, not its operands looked up again every step)."""
    a, b = dst.src[0], dst.src[1]
    if a.extra is INTERLEAVED:
        x = _interleaved_rows(dst)
        return _interleaved_call(dst, x) if np.shares_memory(x, view(b)) else None
    columns = GROUPED_COLUMNS if a.type in FLOAT_ROWS else VEC_COLUMNS
    if b.type != T.GGMLType.F32 or b.ne[1] > columns or not in_blocks(a, f32=True):
        return None
    src, first = memory_of(a)
    try:
        planes, x, y = _vector_operands(dst, first)
    except ValueError:
        return None
    if not (x.flags.c_contiguous and np.shares_memory(x, view(b))):  # each step's b must be read where it is
        return None
    return _matvec_call(a, src, planes, x, y)


@kernel(Op.MUL_MAT, supports=_supports_mul_mat, bind=_bind_mul_mat, reads_interleaved=True)
def mul_mat(dst: Tensor) -> None:
    """dst[.., i1, i0] = b[.., i1, :]·a[.., i0, :]: on a's blocks, or one BLAS call per float32 matrix pair."""
    a, b = dst.src[0], dst.src[1]
    if a.extra is INTERLEAVED:
        _interleaved_call(dst, _interleaved_rows(dst))()
        return
    if in_blocks(a) or (b.ne[1] <= GROUPED_COLUMNS and in_blocks(a, f32=True)):
        _mul_mat_blocks(dst)
        return
    if _columns_of_one_product(a, b):  # one BLAS call per plane of a, not one per plane of b
        r2 = b.ne[2] // a.ne[2]
        wa = _blasable(src0_f32(a))
        wb = _blasable(np.reshape(as_f32(b), (a.ne[3], a.ne[2], r2, b.ne[0])))
        out = _out_view(dst, (a.ne[3], a.ne[2], r2, a.ne[1]))
    else:
        wa, wb, split = _broadcast_split(dst, _blasable(src0_f32(a)), _blasable(as_f32(b)))
        out = _out_view(dst, (*split, b.ne[1], a.ne[1]))
    if b.nrows < SMALL_BATCH and a.ne[0] * a.ne[1] < SMALL_MATRIX:
        with blas_threads(1):
            np.matmul(wb, wa.swapaxes(-1, -2), out=out)
    else:
        np.matmul(wb, wa.swapaxes(-1, -2), out=out)


@kernel(Op.OUT_PROD, supports=_supports_product)
def out_prod(dst: Tensor) -> None:
    """dst[.., i1, i0] = sum_k a[.., k, i0]·b[.., k, i1], with mul_mat's broadcasting of a over dims 2, 3."""
    a, b = dst.src[0], dst.src[1]
    wa, wb, split = _broadcast_split(dst, src0_f32(a), as_f32(b))
    np.matmul(wb.swapaxes(-1, -2), wa, out=_out_view(dst, (*split, b.ne[0], a.ne[0])))


def _supports_mul_mat_id(dst: Tensor) -> bool:
    return _supports_mul_mat(dst) and dst.src[2].type == T.GGMLType.I32


@kernel(Op.MUL_MAT_ID, supports=_supports_mul_mat_id, reads_interleaved=True)
def mul_mat_id(dst: Tensor) -> None:
    """dst[t, e, :] = as[ids[t, e]] · b[t, e % b.ne1, :]. Interleaved experts: every (token, slot) row in one
    integer launch, grouped by expert. Otherwise one gathered matmul per expert actually used, except that the
    experts used by few rows (at most FEW_ROWS: all of them in a generation step, most in a prompt's batch) go
    to the compiled matrix-vector kernel in one call, VEC_COLUMNS rows per plane (a launch per expert cost 5-7
    times the products' time)."""
    as_, b, ids = dst.src[0], dst.src[1], dst.src[2]
    rows = as_f32(b)[0]                          # (n_tokens, n_b, k)
    chosen = view(ids)[0, 0]                     # (n_tokens, n_used)
    out = view(dst)[0]                           # (n_tokens, n_used, rows)
    n_expert = as_.ne[2]
    if chosen.size and (chosen.min() < 0 or chosen.max() >= n_expert):
        raise OutOfBoundsError(f"mul_mat_id {dst.name!r}: ids {ids.name!r} hold experts outside [0, {n_expert})")
    slot_of_b = np.arange(ids.ne[0]) % b.ne[1]
    if as_.extra is INTERLEAVED:
        _interleaved_experts(as_, rows, chosen, slot_of_b, out)
        return
    experts, counts = np.unique(chosen, return_counts=True)
    users = {int(e): np.nonzero(chosen == e) for e in experts}   # expert -> (tokens, slots) that use it
    few = [e for e, n in zip(experts.tolist(), counts, strict=True) if n <= FEW_ROWS] if in_blocks(as_) else []
    if few:
        work = [(e, (tok[i:i + VEC_COLUMNS], slot[i:i + VEC_COLUMNS])) for e in few for tok, slot in [users[e]]
                for i in range(0, len(tok), VEC_COLUMNS)]
        _few_rows_at_once(as_, [(e, (tok, slot), rows[tok, slot_of_b[slot]]) for e, (tok, slot) in work], out)
    product = _expert_product(as_)
    for expert in set(users) - set(few):
        tok, slot = users[expert]
        out[tok, slot] = product(expert, rows[tok, slot_of_b[slot]])


def _interleaved_experts(as_: Tensor, rows: np.ndarray, chosen: np.ndarray, slot_of_b: np.ndarray,
                         out: np.ndarray) -> None:
    """mul_mat_id on interleaved experts: the rows of b each (token, slot) multiplies, gathered expert by expert,
    then one integer launch with a segment per expert used (its rows, the expert's matrix)."""
    order = np.argsort(chosen, axis=None, kind="stable")
    tok, slot = np.divmod(order, chosen.shape[1])
    experts, counts = np.unique(chosen, return_counts=True)
    x = np.ascontiguousarray(rows[tok, slot_of_b[slot]], dtype=np.float32)      # (n_tokens·n_used, k)
    y = np.empty((len(order), as_.ne[1]), np.float32)
    firsts = experts.astype(np.int64) * as_.nb[2]
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    _integer_call(as_, firsts, starts, x, y)()
    out[tok, slot] = y


def _few_rows_at_once(as_: Tensor, work: list, out: np.ndarray) -> None:
    """work: (expert, (tokens, slots), x (n, k)) with n <= VEC_COLUMNS; all in one kernel call, a plane each."""
    src, first = memory_of(as_)
    n = max(len(x) for _, _, x in work)
    xs = np.zeros((len(work), n, as_.ne[0]), np.float32)
    for i, (_, _, x) in enumerate(work):
        xs[i, :len(x)] = x
    ys = np.empty((len(work), n, as_.ne[1]), np.float32)
    planes = np.array([first + expert * as_.nb[2] for expert, _, _ in work], np.uint64)
    _product_on_blocks(as_, src, planes, xs, ys)
    for i, (_, (tok, slot), x) in enumerate(work):
        out[tok, slot] = ys[i, :len(x)]


def _expert_product(as_: Tensor):
    """(expert, x (n, k)) -> x · expert's matrixᵀ: on the blocks where the compiled kernels read as_, else float32:
    float32 values held already, or a type without compiled kernels (the IQ types but IQ4_NL/XS) dequantized one
    expert at a time (a step uses few of a large model's experts, whose whole stack as float32 would not stay
    cached)."""
    if not in_blocks(as_) and (as_.type == T.GGMLType.F32 or expanded_values(as_) is not None):
        experts = src0_f32(as_)[0]              # (n_expert, rows, k)
        return lambda expert, x: x @ experts[expert].T
    if not in_blocks(as_):
        raw = host_ndarray(as_)[0]              # (n_expert, rows, row bytes)
        return lambda expert, x: x @ T.to_float(as_.type, raw[expert]).reshape(as_.ne[1], as_.ne[0]).T
    src, first = memory_of(as_)

    def on_blocks(expert: int, x: np.ndarray) -> np.ndarray:
        y = np.empty((1, x.shape[0], as_.ne[1]), np.float32)
        planes = np.array([first + expert * as_.nb[2]], np.uint64)
        _product_on_blocks(as_, src, planes, np.ascontiguousarray(x[None], dtype=np.float32), y)
        return y[0]

    return on_blocks
