"""The CPU backend's compiled kernels (Numba, LLVM): one place, readable as Python, named as ggml names them.

They compile with pyggml.core.jit's decorators (`jit`; `parallel_jit` adds `prange`), lazily, cached on disk; a
kernel that switches on a ggml type is made per type (`PerType`), so that a model compiles its own types only.
Importing this package hands LLVM's code pages back after every compile or cache load (runtime.compiler_pages).
"""

from __future__ import annotations

import threading

from pyggml.backend.cpu.jit.runtime import compiler_pages
from pyggml.core.jit import PerType, jit, parallel_jit

compiler_pages.install()

# One parallel launch at a time: Numba's portable "workqueue" threading layer aborts the process on
# concurrent launches from several Python threads (CPU backends computing on several threads, a model loading
# beside one computing).
PARALLEL_LAUNCH = threading.Lock()


def launched(call):
    """call() bound to run under PARALLEL_LAUNCH: a kernel compiled with parallel_jit shares its loop over Numba's
    threads, one launch at a time."""
    def launch() -> None:
        with PARALLEL_LAUNCH:
            call()
    return launch


__all__ = ["PARALLEL_LAUNCH", "PerType", "jit", "launched", "parallel_jit"]
