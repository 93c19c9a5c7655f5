"""The CPU backend's compiled kernels (Numba, LLVM): one place, readable as Python, named as ggml names them.

Kernels compile lazily on first call and are cached on disk (`cache=True`), so only the first process after an
install pays the compilation. `jit` is the one decorator every module here uses; `parallel_jit` adds `prange`.
Division follows C and NumPy (error_model "numpy": x / 0 gives inf or NaN, no exception, no check).
"""

from __future__ import annotations

import functools
import threading

import numba

from pyggml.backend.cpu.jit.runtime import compiler_pages

jit = functools.partial(numba.njit, cache=True, nogil=True, error_model="numpy")
parallel_jit = functools.partial(numba.njit, cache=True, nogil=True, error_model="numpy", parallel=True)
compiler_pages.install()

# One parallel launch at a time: Numba's portable "workqueue" threading layer aborts the process on
# concurrent launches from several Python threads (CPU backends computing on several threads, a model loading
# beside one computing).
PARALLEL_LAUNCH = threading.Lock()
