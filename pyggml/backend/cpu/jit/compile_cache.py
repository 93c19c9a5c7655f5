"""Whether the compiled kernels' on-disk cache is cold (so the first use will compile, about 10-40 s).

Numba keeps each cached kernel's index next to its module (or under NUMBA_CACHE_DIR); a kernel whose
index is missing compiles on first call. `pyggml generate` asks before loading a model so that it can
say why the first step is slow.
"""

from __future__ import annotations

import os


def entry_points() -> list:
    """The kernels Python calls directly (their callees compile with them)."""
    from pyggml.backend.cpu.jit.mul_mat import dequantize_rows, mul_mat_vec
    return [mul_mat_vec, dequantize_rows]


def is_cold(dispatchers=None) -> bool:
    """True when some kernel has no cache index yet (False where Numba's cache layout is not the known one)."""
    for d in entry_points() if dispatchers is None else dispatchers:
        try:
            index = d._cache._cache_file._index_path
        except AttributeError:
            return False
        if not os.path.exists(index):
            return True
    return False
