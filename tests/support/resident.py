"""How much of a memory mapping or range is resident: /proc/self/smaps, mincore(2) (Linux)."""

import ctypes
import mmap

import numpy as np

from pyggml.backend.cpu.jit.runtime.compiler_pages import Mapping, parse_smaps
from pyggml.core.host_memory import whole_pages


def mapping_of(arr: np.ndarray) -> Mapping:
    """The mapping that holds arr's first byte, with its resident KiB (rss_kib)."""
    with open("/proc/self/smaps") as f:
        return next(m for m in parse_smaps(f.read()) if m.start <= arr.ctypes.data < m.end)


def resident_share(arr: np.ndarray) -> float:
    """The share of arr's whole pages that are resident (mincore(2)): exact for any range, where a large
    array's smaps mapping may be split (NumPy advises huge pages on its aligned part)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    first, end = whole_pages(arr.ctypes.data, arr.nbytes)
    vec = np.zeros((end - first) // mmap.PAGESIZE, np.uint8)
    if libc.mincore(first, end - first, vec.ctypes.data) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return float(np.mean(vec & 1))
