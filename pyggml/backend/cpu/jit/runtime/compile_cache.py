"""The compiled kernels' on-disk cache: whether it is cold, loading it early, dropping it when sources change.

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


def mul_mat_kernels() -> list:
    """The matrix products' kernels: every model calls them, so their cache says whether a model ran before."""
    from pyggml.backend.cpu.jit.mul_mat import dequantize_rows, mul_mat_float_columns, mul_mat_vec
    return [mul_mat_vec, mul_mat_float_columns, dequantize_rows]


def entry_points() -> list:
    """The kernels the CPU backend's ops call from Python (their callees compile into them)."""
    from pyggml.backend.cpu.jit import attention, glu, norm, repack, rope, rows, softmax
    return [*mul_mat_kernels(), repack.gemm_16x4_q8_0, repack.quantize_q8_0_rows, repack.quantize_q8_0_parallel,
            repack.gemm_16x4_q8_K, repack.quantize_q8_K_rows, repack.quantize_q8_K_parallel,
            softmax.soft_max_rows, rope.rope_rows, attention.exp_score_rows, attention.flash_attn_rows, glu.glu_rows,
            glu.unary_rows, norm.norm_rows, norm.rms_norm_rows, rows.set_rows_f16, rows.set_rows_f32]


def load_cached(dispatchers=None) -> int:
    """Load now every signature the disk cache holds for the kernels, instead of at each one's first call.

    Models call this before they read their weights: a load needs LLVM, whose pages the process gives
    back afterwards (compiler_pages), so LLVM is then resident while the process is small, not at a first
    generation step with all the weights resident (about 12 MiB more peak RSS). Entries made for other
    sources or another CPU are left alone; returns the number of kernels loaded.
    """
    loaded = 0
    for d in entry_points() if dispatchers is None else dispatchers:
        try:
            cache = d._cache
            index = cache._cache_file._load_index()
        except AttributeError:
            continue  # not a caching dispatcher, or Numba's cache layout is not the known one
        if not index:
            continue
        codegen = d.targetctx.codegen()
        for key in index:
            args = key[0]
            if tuple(args) not in d.overloads and key == cache._index_key(args, codegen):
                d.compile(args)
                loaded += 1
    return loaded


def is_cold(dispatchers=None) -> bool:
    """True when some kernel has no cache index yet (False where Numba's cache layout is not the known one)."""
    for d in mul_mat_kernels() if dispatchers is None else dispatchers:
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
    package = Path(__file__).parents[1]  # jit/, with its ir/ and runtime/
    for source in sorted(package.rglob("*.py")):
        digest.update(str(source.relative_to(package)).encode() + source.read_bytes())
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
