"""The compiled kernels' on-disk cache: whether it is cold, and dropping it when the kernel sources change.

Numba keeps each cached kernel's index next to its module (or under NUMBA_CACHE_DIR); a kernel whose
index is missing compiles on first call. `pyggml generate` asks before loading a model so that it can
say why the first step is slow.

Numba checks a cached kernel against its own source file only, yet a kernel carries the code of the
functions it calls from other modules (mul_mat_vec holds a vec_dot): an edit to quants.py alone
would leave mul_mat_vec's cached code stale. So the cache keeps a fingerprint of all the package's
sources and is emptied when it differs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

FINGERPRINT = "pyggml-jit-sources.sha1"


def entry_points() -> list:
    """The kernels Python calls directly (their callees compile with them)."""
    from pyggml.backend.cpu.jit.mul_mat import dequantize_rows, mul_mat_float_columns, mul_mat_vec
    return [mul_mat_vec, mul_mat_float_columns, dequantize_rows]


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


def drop_stale(dispatcher) -> None:
    """Empty the cache directory of `dispatcher` (this package's) if this package's sources changed since."""
    try:
        cache_dir = Path(dispatcher._cache._cache_path)
    except AttributeError:
        return
    digest = hashlib.sha1()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + source.read_bytes())
    marker = cache_dir / FINGERPRINT
    try:
        if marker.exists() and marker.read_text() == digest.hexdigest():
            return
        for cached in [*cache_dir.glob("*.nbi"), *cache_dir.glob("*.nbc")]:
            cached.unlink(missing_ok=True)
        cache_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(digest.hexdigest())
    except OSError:
        pass  # a read-only install: Numba then caches elsewhere or not at all
