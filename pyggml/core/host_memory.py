"""Aligned host memory: the bytes behind CPU buffers and allocating contexts."""

from __future__ import annotations

import numpy as np

HOST_ALIGNMENT = 64  # ggml_aligned_malloc's alignment


def aligned_bytes(nbytes: int, alignment: int = HOST_ALIGNMENT, fill: int | None = 0) -> np.ndarray:
    """A uint8 array of nbytes whose first byte sits at a multiple of alignment."""
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    arr = raw[start: start + nbytes]
    if fill is not None:
        arr.fill(fill)
    return arr


class HostArena:
    """Host memory owned by a Context (no_alloc=False): what `host_ndarray` reads through."""

    is_host = True

    def __init__(self, nbytes: int):
        self.host_array = aligned_bytes(nbytes)
        self.base = self.host_array.ctypes.data
        self.size = nbytes
        self.host_views: dict = {}  # host_ndarray's views of this memory by layout

    def __repr__(self) -> str:
        return f"HostArena({self.size} bytes @0x{self.base:x})"
