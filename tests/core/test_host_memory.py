"""Host memory: populate() makes anonymous pages resident in one call; compute buffers and weight buffers are
populated when made, other buffers keep faulting their pages in as they are written."""

import ctypes
import mmap
import sys

import numpy as np
import pytest

from pyggml.backend import BufferUsage, init_by_name
from pyggml.core.host_memory import aligned_bytes, populate

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore(2) and MADV_POPULATE_WRITE")

MIB = 1 << 20
FRESH = 40 * MIB  # above glibc's largest mmap threshold: always new pages, never a recycled heap chunk


def resident_fraction(arr: np.ndarray) -> float:
    """The share of arr's whole pages that are resident (mincore(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    first = -(-arr.ctypes.data // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (arr.ctypes.data + arr.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    vec = np.zeros((end - first) // mmap.PAGESIZE, np.uint8)
    assert libc.mincore(first, end - first, vec.ctypes.data) == 0, ctypes.get_errno()
    return float(np.mean(vec & 1))


def test_populate_makes_the_whole_pages_resident():
    arr = aligned_bytes(FRESH, fill=None)
    assert resident_fraction(arr) < 0.5  # never written: not there yet
    assert populate(arr.ctypes.data, arr.nbytes)
    assert resident_fraction(arr) == 1.0
    assert populate(arr.ctypes.data, arr.nbytes)  # resident already: a look, still True


def test_populate_refuses_a_range_without_a_whole_page():
    arr = aligned_bytes(mmap.PAGESIZE, fill=None)
    assert not populate(arr.ctypes.data + 1, mmap.PAGESIZE - 2)


def test_aligned_bytes_resident_and_filled():
    arr = aligned_bytes(4 * MIB, fill=None, resident=True)
    assert resident_fraction(arr) == 1.0
    assert arr.ctypes.data % 64 == 0


def test_compute_buffers_are_resident_when_designated_others_are_not():
    buft = init_by_name("CPU").default_buffer_type
    plain = buft.alloc_buffer(FRESH)
    compute = buft.alloc_buffer(FRESH)
    compute.usage = BufferUsage.COMPUTE
    assert resident_fraction(plain.host_array) < 0.5
    assert resident_fraction(compute.host_array) == 1.0
