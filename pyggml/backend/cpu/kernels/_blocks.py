"""Weights read in their own block format by the compiled kernels (pyggml.backend.cpu.jit): where the bytes are.

A compiled kernel takes the whole memory a tensor lives in (read-only uint8, so one compiled version
serves the mmap'ed file and writable buffers alike) and byte offsets into it, so that views, planes and
broadcasting need no copies.
"""

from __future__ import annotations

import threading

import numba
import numpy as np

from pyggml.backend.cpu.jit.quants import BLOCKS
from pyggml.core import types as T
from pyggml.core.tensor import Tensor

THREADS_MAX = numba.config.NUMBA_NUM_THREADS


def in_blocks(t: Tensor, f32: bool = False) -> bool:
    """Whether the compiled kernels read t in place: a type they decode (or F32, where `f32`), whole rows
    contiguous, host memory."""
    known = t.type in BLOCKS or (f32 and t.type == T.GGMLType.F32)
    if not known or t.nb[0] != T.type_size(t.type) or t.extra is not None:
        return False
    owner = t.memory_owner()
    return owner is None or getattr(owner, "host_array", None) is not None  # None: not placed yet (supports_op)


def memory_of(t: Tensor) -> tuple[np.ndarray, int]:
    """(t's whole memory as read-only uint8, the byte offset of t's first element in it)."""
    owner = t.memory_owner()
    src = owner.host_array.view()
    src.flags.writeable = False
    return src, t.data - owner.base


def blocks_per_row(t: Tensor) -> int:
    """Blocks in one row (values for F16/BF16, whose blocks are single values)."""
    return t.ne[0] // T.blck_size(t.type)


_threads = threading.local()  # Numba's thread count is per calling thread too


def set_threads(n: int) -> None:
    """Threads for the compiled kernels run from this thread (numba.set_num_threads, capped at Numba's pool)."""
    n = max(1, min(n, THREADS_MAX))
    if getattr(_threads, "n", None) != n:
        numba.set_num_threads(n)
        _threads.n = n


def threads() -> int:
    """The threads set for this thread's compiled kernels (Numba's default before any set_threads)."""
    n = getattr(_threads, "n", None)
    return n if n is not None else numba.get_num_threads()
