"""The KV cache: per layer, the keys and values of every position seen so far, in a buffer of its own.

A step writes its tokens' K and V into the cells it was given (pyggml.models.llm.kv_cells decides which) with
`set_rows`, the cell numbers being inputs of the step (as in llama.cpp, so that a graph does not depend
on pos0 and serves the next step too), and its queries read cells [0, n_kv). K rows are positions ([n_embd_k, size]);
V is stored transposed ([size, n_embd_v]) so that softmax(KQ)·V is a plain mul_mat, as in llama.cpp
without flash attention. Sliding-window layers keep all cells too; their mask hides the old ones.

With flash attention (`flash_attn=True`, which a quantized V needs, as in llama.cpp) V rows are positions too
([n_embd_v, size]), and K and V may be quantized (llama.cpp's -ctk / -ctv: Q8_0 takes 34 bytes per 32 values,
0.53x F16's memory; Q4_0 18 bytes, 0.28x): set_rows quantizes the step's rows as ggml's quantize_row_<type> does,
and flash_attn_ext reads them.

A quantized K or V is stored rotated, as llama.cpp stores it: each run of n values (K: the largest power of two
from 64 dividing the head size; V: 64) multiplied by the orthonormal Walsh-Hadamard matrix of order n, which
spreads an outlier over its block before the block is quantized. Queries get K's rotation too (q·k is unchanged
by it), and the attention's output is rotated back by V's (H·H = I). Q4_0 keys and values lose about a third
of their KLD to the F16 cache this way.
"""

from __future__ import annotations

import numpy as np

from dataclasses import dataclass

from pyggml.alloc import alloc_ctx_tensors_from_buft
from pyggml.backend import tensor_set
from pyggml.backend.tensor_io import tensor_get, tensor_get_2d, tensor_set_2d
from pyggml.core import Context, GGMLType, Tensor
from pyggml.core import ops
from pyggml.core import types as T
from pyggml.errors import AllocationError, ParameterError

N_KV_PAD = 256  # llama.cpp's padding of the attended cells: shapes change once every 256 tokens


KV_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0)  # llama.cpp's -ctk / -ctv choices here


class KVCache:
    def __init__(self, backend, n_layer: int, n_head_kv: int, n_embd_k: int, n_embd_v: int, size: int,
                 type_=GGMLType.F32, type_v=None, flash_attn: bool = False):
        self.type = T.as_type(type_)  # K's type
        self.type_v = self.type if type_v is None else T.as_type(type_v)
        for what, t in (("K", self.type), ("V", self.type_v)):
            if t not in KV_TYPES:
                raise ParameterError(f"KV cache: {what} type must be one of {', '.join(k.name for k in KV_TYPES)}, "
                                     f"got {t.name}")
        if T.is_quantized(self.type_v) and not flash_attn:
            raise ParameterError(f"KV cache: a quantized V ({self.type_v.name}) needs flash attention, as in "
                                 f"llama.cpp (V is stored transposed without it)")
        self.flash_attn = flash_attn
        self.size = size
        self.n_head_kv = n_head_kv
        self.n_embd_k = n_embd_k
        self.n_embd_v = n_embd_v
        ctx = Context(no_alloc=True)
        self.k = [ctx.new_tensor_2d(self.type, n_embd_k, size, f"cache_k_l{il}") for il in range(n_layer)]
        v_shape = (n_embd_v, size) if flash_attn else (size, n_embd_v)
        self.v = [ctx.new_tensor_2d(self.type_v, *v_shape, f"cache_v_l{il}") for il in range(n_layer)]
        self.ctx = ctx
        self.buffer = alloc_ctx_tensors_from_buft(ctx, backend.default_buffer_type)
        if self.buffer is None:
            raise AllocationError(f"KV cache of {n_layer} layers x {size} cells could not be allocated")
        self.buffer.clear(0)
        hd_k, hd_v = n_embd_k // n_head_kv, n_embd_v // n_head_kv
        self.k_rot, self.v_rot, self._rot_buffer = self._rotations(backend, rotation_order(self.type, hd_k, True),
                                                                   rotation_order(self.type_v, hd_v, False))

    @staticmethod
    def _rotations(backend, order_k: int, order_v: int):
        """The Hadamard matrices K and V are rotated by (None: not rotated), in a buffer of their own so that
        the cache's bytes stay K's and V's."""
        orders = sorted({n for n in (order_k, order_v) if n})
        if not orders:
            return None, None, None
        ctx = Context(no_alloc=True)
        by_order = {n: ctx.new_tensor_2d(GGMLType.F32, n, n, f"attn_rot_{n}") for n in orders}
        buffer = alloc_ctx_tensors_from_buft(ctx, backend.default_buffer_type)
        if buffer is None:
            raise AllocationError("the KV cache's rotation matrices could not be allocated")
        for n, t in by_order.items():
            tensor_set(t, hadamard(n))
        return by_order.get(order_k), by_order.get(order_v), buffer

    def rotate_k(self, ctx: Context, x: Tensor) -> Tensor:
        """x (queries or keys) rotated as a quantized K is stored; x itself when K is not rotated."""
        return x if self.k_rot is None else _rotated(ctx, x, self.k_rot)

    def rotate_v(self, ctx: Context, x: Tensor) -> Tensor:
        """x (values, or the attention's output to rotate back) rotated as a quantized V is stored."""
        return x if self.v_rot is None else _rotated(ctx, x, self.v_rot)

    @property
    def nbytes(self) -> int:
        return self.buffer.size

    def n_kv(self, n_used: int) -> int:
        """Cells a step attends when n_used of them hold tokens: padded up to N_KV_PAD, at most the cache size."""
        return min(self.size, -(-n_used // N_KV_PAD) * N_KV_PAD)

    def store(self, step, il: int, k: Tensor, v: Tensor) -> None:
        """Add to the step's graph the writes of k, v ([head_dim, n_head_kv, n_tokens]) into the step's cells.

        K rows are cells, so row i of k goes to row cell_i; Vᵀ's cells are columns, so (as llama.cpp does)
        both V and the cache are seen as one-value rows and value d of token i goes to row d * size + cell_i.
        V is transposed first, so that the writes run along the cache's rows (d-major) instead of jumping a
        row per value (about 10x slower for a 512-token batch).
        """
        ctx, n = step.ctx, step.n_tokens
        k_cells, v_cells = self._cell_inputs(step)
        k_rows = ops.reshape_2d(ctx, k, self.n_embd_k, n)
        step.graph.build_forward_expand(ops.set_rows(ctx, self.k[il], k_rows, k_cells))
        if self.flash_attn:  # V rows are cells, as K's
            v_rows = ops.reshape_2d(ctx, v, self.n_embd_v, n)
            step.graph.build_forward_expand(ops.set_rows(ctx, self.v[il], v_rows, k_cells))
            return
        if n > 1:
            v = ops.cont(ctx, ops.transpose(ctx, ops.reshape_2d(ctx, v, self.n_embd_v, n)))
        v_values = ops.reshape_2d(ctx, v, 1, self.n_embd_v * n)
        v_flat = ops.reshape_2d(ctx, self.v[il], 1, self.size * self.n_embd_v)
        step.graph.build_forward_expand(ops.set_rows(ctx, v_flat, v_values, v_cells))

    def _cell_inputs(self, step) -> tuple[Tensor, Tensor | None]:
        """The step's I64 inputs naming the rows that store() writes (one set per step, shared by the layers;
        with flash attention V's rows are K's)."""
        if step.kv_cells is None:
            n = step.n_tokens
            v_cells = None if self.flash_attn else step.ctx.new_tensor_1d(GGMLType.I64, n * self.n_embd_v,
                                                                          "kv_v_cells").set_input()
            step.kv_cells = (step.ctx.new_tensor_1d(GGMLType.I64, n, "kv_k_cells").set_input(), v_cells)
        return step.kv_cells

    def set_cells(self, step, cells: np.ndarray) -> None:
        """Fill the step's cell inputs with the cells its tokens go to (any cells: several sequences may
        share the cache, each in cells of its own)."""
        if step.kv_cells is None:
            return
        cells = np.asarray(cells, dtype=np.int64)
        tensor_set(step.kv_cells[0], cells)
        if step.kv_cells[1] is not None:
            tensor_set(step.kv_cells[1], (np.arange(self.n_embd_v, dtype=np.int64)[:, None] * self.size
                                          + cells).ravel())

    def _value_bytes(self) -> int:
        if T.blck_size(self.type) != 1:
            raise ParameterError(f"the KV cache's V is {T.type_name(self.type)}, a block type stored transposed: "
                                 f"its cells cannot be read or written one by one")
        return T.type_size(self.type)

    def read_cells(self, cells: np.ndarray) -> CellData:
        """Copy out what the cells hold, every layer (for saving a sequence)."""
        cells = np.asarray(cells, dtype=np.int64)
        rb, eb = T.row_size(self.type, self.n_embd_k), self._value_bytes()
        ks, vs = [], []
        for cache_k, cache_v in zip(self.k, self.v, strict=True):
            k = np.empty((cells.size, rb), np.uint8)
            v = np.empty((self.n_embd_v, cells.size, eb), np.uint8)
            for c0, n, at in _runs(cells):
                k[at:at + n] = tensor_get(cache_k, c0 * rb, n * rb).reshape(n, rb)
                v[:, at:at + n] = tensor_get_2d(cache_v, c0 * eb, n * eb, self.n_embd_v, self.size * eb,
                                                n * eb).reshape(self.n_embd_v, n, eb)
            ks.append(k)
            vs.append(v)
        return CellData(T.type_name(self.type), self.n_embd_k, self.n_embd_v, ks, vs)

    def write_cells(self, cells: np.ndarray, data: CellData) -> None:
        """Put saved keys and values into the cells (the same layout only: type, widths, layers)."""
        cells = np.asarray(cells, dtype=np.int64)
        layout = (T.type_name(self.type), self.n_embd_k, self.n_embd_v, len(self.k))
        if (data.type, data.n_embd_k, data.n_embd_v, len(data.k)) != layout or data.n != cells.size:
            raise ParameterError(f"saved cells of type {data.type}, widths {data.n_embd_k}/{data.n_embd_v}, "
                                 f"{len(data.k)} layers do not fit this cache ({layout[0]}, {layout[1]}/"
                                 f"{layout[2]}, {layout[3]} layers)")
        rb, eb = T.row_size(self.type, self.n_embd_k), self._value_bytes()
        for cache_k, cache_v, k, v in zip(self.k, self.v, data.k, data.v, strict=True):
            for c0, n, at in _runs(cells):
                tensor_set(cache_k, np.ascontiguousarray(k[at:at + n]), c0 * rb, n * rb)
                tensor_set_2d(cache_v, np.ascontiguousarray(v[:, at:at + n]), c0 * eb, n * eb, self.n_embd_v,
                              self.size * eb, n * eb)

    def views(self, ctx: Context, il: int, n_kv: int) -> tuple[Tensor, Tensor]:
        """K as [head_dim, n_kv, n_head_kv] and Vᵀ as [n_kv, head_dim, n_head_kv] over cells [0, n_kv) (with
        flash attention V as K: [head_dim, n_kv, n_head_kv])."""
        cache_k, cache_v = self.k[il], self.v[il]
        hd_k, hd_v = self.n_embd_k // self.n_head_kv, self.n_embd_v // self.n_head_kv
        k = ops.view_3d(ctx, cache_k, hd_k, n_kv, self.n_head_kv, cache_k.nb[1], T.row_size(self.type, hd_k), 0)
        if self.flash_attn:
            v = ops.view_3d(ctx, cache_v, hd_v, n_kv, self.n_head_kv, cache_v.nb[1], T.row_size(self.type_v, hd_v), 0)
        else:
            v = ops.view_3d(ctx, cache_v, n_kv, hd_v, self.n_head_kv, cache_v.nb[1], cache_v.nb[1] * hd_v, 0)
        return k, v


@dataclass
class CellData:
    """The keys and values some cells hold, as the cache stores them (raw bytes): per layer K as [n, K row bytes]
    and V as [n_embd_v, n, value bytes] (V is stored transposed). What a saved slot holds besides its tokens."""

    type: str
    n_embd_k: int
    n_embd_v: int
    k: list[np.ndarray]
    v: list[np.ndarray]

    @property
    def n(self) -> int:
        return self.k[0].shape[0] if self.k else 0

    def save(self, path, **extra) -> None:
        """An .npz file (no pickles): the cache's layout, its layers, and the caller's arrays (tokens, positions)."""
        layers = {f"k{il}": k for il, k in enumerate(self.k)} | {f"v{il}": v for il, v in enumerate(self.v)}
        with open(path, "wb") as f:
            np.savez(f, type=np.array(self.type), n_embd=np.array([self.n_embd_k, self.n_embd_v]), **layers, **extra)

    @classmethod
    def load(cls, path) -> tuple["CellData", dict]:
        """(the cells' data, the other arrays saved with them)."""
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        n_layer = sum(name.startswith("k") for name in arrays)
        data = cls(str(arrays.pop("type")), *map(int, arrays.pop("n_embd")),
                   [arrays.pop(f"k{il}") for il in range(n_layer)], [arrays.pop(f"v{il}") for il in range(n_layer)])
        return data, arrays


def rotation_order(type_, head_dim: int, largest: bool) -> int:
    """The order of the Hadamard rotation of a cache of this type (0: none), as llama.cpp picks it: a quantized
    type and a head size that 64 divides; K takes the largest power of two dividing the head size, V 64."""
    if not T.is_quantized(type_) or head_dim % 64:
        return 0
    n = 64
    while largest and head_dim % (2 * n) == 0:
        n *= 2
    return n


def hadamard(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix of order n (a power of two), H·H = I, built as llama.cpp builds it:
    every entry ±1/sqrt(n) in float32."""
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h * np.float32(1.0 / np.float64(np.sqrt(np.float32(n))))


def _rotated(ctx: Context, x: Tensor, rot: Tensor) -> Tensor:
    """x with each run of rot's order of values multiplied by rot (llama.cpp's llama_mul_mat_hadamard)."""
    n = rot.ne[0]
    rows = (ops.reshape_2d if x.is_contiguous else ops.cont_2d)(ctx, x, n, x.nelements // n)
    out = ops.mul_mat(ctx, rot, rows)
    ops.mul_mat_set_hint(out, ops.OpHint.SRC0_IS_HADAMARD)
    return ops.reshape_4d(ctx, out, *x.ne)


def _runs(cells: np.ndarray) -> list[tuple[int, int, int]]:
    """(first cell, count, index in `cells`) of each run of consecutive cells, so that reads and writes go a run
    at a time instead of a cell at a time."""
    breaks = np.flatnonzero(np.diff(cells) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [cells.size]])
    return [(int(cells[a]), int(b - a), int(a)) for a, b in zip(starts, ends, strict=True)]


def causal_mask(pos0: int, n_tokens: int, window: int | None = None, n_kv: int | None = None) -> np.ndarray:
    """[n_tokens, n_kv] (n_kv defaults to pos0 + n_tokens) of 0 (visible) and -inf: a query sees keys at or
    before it, and with a sliding window only the last `window` of them (llama.cpp's LLAMA_SWA_TYPE_STANDARD)."""
    q = pos0 + np.arange(n_tokens)[:, None]
    k = np.arange(pos0 + n_tokens if n_kv is None else n_kv)[None, :]
    visible = k <= q
    if window is not None:
        visible &= q - k < window
    return np.where(visible, np.float32(0), np.float32(-np.inf)).astype(np.float32)
