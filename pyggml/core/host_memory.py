"""Aligned host memory: the bytes behind CPU buffers and allocating contexts."""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys

import numpy as np

HOST_ALIGNMENT = 64  # ggml_aligned_malloc's alignment
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", 15)


def aligned_bytes(nbytes: int, alignment: int = HOST_ALIGNMENT, fill: int | None = 0,
                  huge_pages: bool = True) -> np.ndarray:
    """A uint8 array of nbytes whose first byte sits at a multiple of alignment.

    NumPy asks for transparent huge pages for large arrays; `huge_pages=False` takes 4 KiB pages instead, before
    any byte is written (the pages ggml_aligned_malloc gets under Linux's default "madvise" policy). On a virtual
    machine that hands the guest's free 2 MiB blocks back to its host (free-page reporting), a fresh huge page is
    faulted in on the host as well: 760 MiB first written took 1.5-2.6 s in huge pages against 0.4-0.8 s in 4 KiB
    pages (0.15-0.3 s populated, `populate`), measured in one process one after another, without compaction."""
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    arr = raw[start: start + nbytes]
    if not huge_pages:
        first, end = whole_pages(raw.ctypes.data, raw.nbytes)
        if end > first:
            madvise(first, end - first, MADV_NOHUGEPAGE)
    if fill is not None:
        arr.fill(fill)
    return arr


def whole_pages(address: int, length: int) -> tuple[int, int]:
    """[first, end): the whole pages inside [address, address + length) (empty when there is none)."""
    first = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    return first, max(first, (address + length) // mmap.PAGESIZE * mmap.PAGESIZE)


def populate(address: int, length: int) -> bool:
    """Make the whole pages of [address, address + length) of this process's anonymous memory resident and
    writable now, in one call (MADV_POPULATE_WRITE), rather than by a fault at each page's first write later.
    On a virtual machine that backs pages lazily a first write can cost far more than the write (measured here:
    400 MiB first written in 0.07 to 5.1 s by faults, 0.06 to 4.2 s populated): populating moves that cost to
    when the memory is made, and pages already resident cost only a look. False where the kernel or platform
    has no such call (the pages then fault in as they are written)."""
    first, end = whole_pages(address, length)
    return end > first and madvise(first, end - first, MADV_POPULATE_WRITE)


def map_for_reading(arr: np.ndarray) -> bool:
    """Map the pages under `arr` (those of a model file's mapping, already in the page cache) into this process in
    one call (MADV_POPULATE_READ) before a kernel reads them all, rather than by a fault every 64 KiB as it reads
    (an 8B file's weights repacked: 1.8 s by faults, 1.6 s mapped first). The call does not hold the GIL, so
    threads map their own pieces side by side. False where the kernel or platform has no such call."""
    first = arr.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE
    end = -(-(arr.ctypes.data + arr.nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE
    return end > first and madvise(first, end - first, MADV_POPULATE_READ)


def madvise(address: int, length: int, advice: int) -> bool:
    """madvise(2) on any address range of this process (Python's mmap objects offer it for their own only);
    False where it failed or the platform has none."""
    call = _libc_madvise()
    return call is not None and call(address, length, advice) == 0


@functools.cache
def _libc_madvise():
    if not sys.platform.startswith("linux"):
        return None
    madvise_fn = ctypes.CDLL(None, use_errno=True).madvise
    madvise_fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise_fn.restype = ctypes.c_int
    return madvise_fn


def release_file_pages(arr: np.ndarray) -> bool:
    """Hand back this process's resident pages under `arr` when it views a read-only file mapping (np.frombuffer
    of an mmap opened with ACCESS_READ, directly or through memoryviews): a model's bytes already copied into
    backend buffers then stop counting in RSS, and are read from the file again if touched. Only whole pages
    inside `arr`; True if any went. Anything else is left alone (MADV_DONTNEED zeros anonymous memory and a
    private mapping's written pages)."""
    owner = arr
    while isinstance(owner, np.ndarray):
        owner = owner.base
    while isinstance(owner, memoryview) and not isinstance(owner.obj, mmap.mmap):
        owner = owner.obj
    if not (isinstance(owner, memoryview) and owner.readonly and isinstance(owner.obj, mmap.mmap)):
        return False
    first, end = whole_pages(arr.ctypes.data, arr.nbytes)
    return end > first and madvise(first, end - first, mmap.MADV_DONTNEED)


def zero_anonymous(arr: np.ndarray) -> None:
    """Zero a C-contiguous uint8 array of this process's own anonymous memory (what aligned_bytes returns):
    its whole pages go back to the OS (MADV_DONTNEED: they read as zeros and take no memory until
    written again, so a large buffer cleared up front, such as a KV cache, costs only what is used),
    the partial pages at its ends are filled. The range stops taking transparent huge pages (NumPy asks
    for them on large arrays): one write into a KV cache's layer would otherwise make 2 MiB resident.
    Never for memory mapped from a file: those pages would read the file again."""
    start = arr.ctypes.data
    first, end = whole_pages(start, arr.nbytes)
    if end - first < mmap.PAGESIZE or not madvise(first, end - first, mmap.MADV_DONTNEED):
        arr.fill(0)
        return
    madvise(first, end - first, MADV_NOHUGEPAGE)
    arr[: first - start].fill(0)
    arr[end - start:].fill(0)


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
