"""How much of a memory mapping is resident, from /proc/self/smaps (Linux)."""

import numpy as np

from pyggml.backend.cpu.jit.runtime.compiler_pages import Mapping, parse_smaps


def mapping_of(arr: np.ndarray) -> Mapping:
    """The mapping that holds arr's first byte, with its resident KiB (rss_kib)."""
    with open("/proc/self/smaps") as f:
        return next(m for m in parse_smaps(f.read()) if m.start <= arr.ctypes.data < m.end)
