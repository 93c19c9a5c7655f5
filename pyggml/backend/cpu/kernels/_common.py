"""Helpers every CPU kernel uses: typed views of tensors and conversion of results into the destination."""

from __future__ import annotations

import functools
import itertools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import ThreadpoolController

from pyggml.backend.cpu.jit.f16 import f16_to_f32_values, f32_to_f16
from pyggml.backend.cpu.kernels._blocks import THREADS_MAX, threads
from pyggml.core import types as T
from pyggml.core.tensor import Tensor, host_ndarray

FLOAT_TYPES = frozenset({T.GGMLType.F32, T.GGMLType.F16, T.GGMLType.BF16})
F32_EXPANDED = "CPU_F32"  # Tensor.extra of a tensor in a CPU_F32 buffer: `t.buffer.values(t)` are its values
INTERLEAVED = "CPU_INTERLEAVED"  # Tensor.extra of a tensor in a CPU_INTERLEAVED buffer: `t.buffer.quant_bytes(t)`
_BLAS = ThreadpoolController()  # scanning the loaded BLAS libraries costs ~1 ms: done once


def blas_threads(n: int):
    """A context that limits BLAS to n threads (about 10 us to enter and leave)."""
    return _BLAS.limit(limits=n, user_api="blas")


_POOL: tuple[int, ThreadPoolExecutor] | None = None  # (the process that made it, the pool): a forked child's own
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The kernels' worker threads, made once per process (a child forked after they started has none of them)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (os.getpid(), ThreadPoolExecutor(THREADS_MAX, thread_name_prefix="pyggml-cpu"))
        return _POOL[1]


def split_over_threads(work, parts: int) -> None:
    """work(i) for every i < parts, shared out over this thread's kernel threads (`threads()`) as Python threads
    with BLAS on one thread each: BLAS calls and compiled kernels (which release the GIL) side by side. Work
    made of many small BLAS products and compiled loops between them (attention's heads) ran 2-3x faster so
    than with BLAS's threads, which spin between its calls while the compiled loops run on one core."""
    n = min(threads(), parts)
    if n <= 1:
        for i in range(parts):
            work(i)
        return
    pool = _pool()
    errors = np.geterr()  # the caller's floating-point error handling (the backend's C semantics), per thread
    taken = itertools.count()  # each thread takes the next part when done with its last (next() is atomic)

    def share(_) -> None:
        with np.errstate(**errors):
            while (i := next(taken)) < parts:
                work(i)

    with blas_threads(1):
        helpers = [pool.submit(share, None) for _ in range(n - 1)]
        try:
            share(None)  # the calling thread is one of the n
        finally:  # every part is done (or failed) before the caller goes on; a helper that has not started
            for helper in helpers:  # by then has nothing left to take (nor waits behind busy workers: no deadlock)
                if not helper.cancel():
                    helper.result()


SPLIT_VALUES = 1 << 18  # element-wise work on fewer values stays on the calling thread (a split costs ~50 us)


def split_rows(n_rows: int, n_values: int, work) -> None:
    """work(lo, hi) over rows [lo, hi) covering [0, n_rows), split into one band per thread when there are
    SPLIT_VALUES values or more (an encoder's GELU over 4096 x 4304 values)."""
    n = min(threads(), n_rows) if n_values >= SPLIT_VALUES else 1
    per = -(-n_rows // n) if n_rows else 0
    split_over_threads(lambda i: work(i * per, min(n_rows, (i + 1) * per)), n)


class Scratch(threading.local):
    """float32 scratch memory, one per thread, kept and grown to the largest size asked for: a fresh array per call
    faults its pages in again every time (a product's dequantized tiles; attention's scores, 4 MiB a head of
    SigLIP's, 5% of its attention)."""

    values = np.empty(0, np.float32)

    def take(self, shape) -> np.ndarray:
        n = math.prod(shape)
        if self.values.size < n:
            self.values = np.empty(n, np.float32)
        return self.values[:n].reshape(shape)


def banded(n_rows: int, n_values: int, work):
    """A bound call of split_rows(n_rows, n_values, work), or of work(0, n_rows) itself below SPLIT_VALUES values (a
    generation step's small nodes skip the split's bookkeeping)."""
    if n_values < SPLIT_VALUES:
        return functools.partial(work, 0, n_rows)
    return functools.partial(split_rows, n_rows, n_values, work)


def expanded_values(t: Tensor) -> np.ndarray | None:
    """The float32 values of a tensor in a CPU_F32 buffer (shape ne[::-1], in place); None for others."""
    return t.buffer.values(t) if t.extra is F32_EXPANDED else None


def view(t: Tensor) -> np.ndarray:
    """Zero-copy view of t's memory (shape ne[::-1]; raw uint8 rows for block types)."""
    return host_ndarray(t)


def as_f32(t: Tensor) -> np.ndarray:
    """t's values as float32 with shape ne[::-1]: a view for F32, a converted copy otherwise (F16 by a compiled
    loop: NumPy's cast converts one value at a time, 13x slower)."""
    v = host_ndarray(t)
    if t.type == T.GGMLType.F32:
        return v
    if t.type == T.GGMLType.F16:
        out = np.empty(v.shape, np.float32)
        f16_to_f32_values(np.ascontiguousarray(v).view(np.uint16).reshape(-1), out.reshape(-1))
        return out
    return T.to_float(t.type, v).reshape(tuple(reversed(t.ne)))


def store(dst: Tensor, values: np.ndarray) -> None:
    """Write values (broadcastable to dst's shape) into dst's memory, converting to dst's type."""
    out = host_ndarray(dst)
    if (dst.type == T.GGMLType.F16 and getattr(values, "dtype", None) == np.float32 and values.shape == out.shape
            and out.flags.c_contiguous and not np.may_share_memory(out, values)):  # compiled, rounded as NumPy
        f32_to_f16(np.ascontiguousarray(values).reshape(-1), out.view(np.uint16).reshape(-1))
    elif dst.type == T.GGMLType.F32 or not (T.is_quantized(dst.type) or dst.type == T.GGMLType.BF16):
        np.copyto(out, values, casting="unsafe")
    else:
        full = np.broadcast_to(np.asarray(values, dtype=np.float32), tuple(reversed(dst.ne)))
        out[...] = T.from_float(dst.type, full).reshape(out.shape)


def rows_2d(a: np.ndarray) -> np.ndarray | None:
    """a as (rows, last dim) without copying (a view to bind a compiled kernel to), or None if impossible."""
    try:
        return np.reshape(a, (-1, a.shape[-1]), copy=False)
    except ValueError:
        return None


def overlap(out: np.ndarray, *inputs: np.ndarray) -> bool:
    """Whether out shares memory with an input other than by being exactly it (a kernel working row by row
    may write in place, but not into memory that it has still to read)."""
    return any(np.may_share_memory(out, x) and (out.__array_interface__["data"][0], out.shape, out.strides) !=
               (x.__array_interface__["data"][0], x.shape, x.strides) for x in inputs)


def flat_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A 4-D array as (its memory as one 1-D array, its first three strides in elements), rows made
    contiguous first if they are not: compiled loops over a row then see unit stride and vectorise."""
    if a.strides[3] != a.itemsize and a.shape[3] > 1:
        a = np.ascontiguousarray(a)
    if a.size == 0:
        return a.reshape(-1), np.zeros(3, np.int64)
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.strides, strict=True)) // a.itemsize
    flat = np.lib.stride_tricks.as_strided(a, shape=(span,), strides=(a.itemsize,), writeable=False)
    return flat, np.array(a.strides[:3], np.int64) // a.itemsize
