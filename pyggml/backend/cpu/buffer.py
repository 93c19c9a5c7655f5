"""The CPU backend's buffers: host memory in a NumPy array, and the base of the extra buffer types whose bytes are
converted as they are written (CPU_F32, CPU_INTERLEAVED). A module of its own so that the device and the extra buffer
types both build on it without importing each other."""

from __future__ import annotations

import mmap

import numpy as np

from pyggml.backend.base import Buffer, BufferType, BufferUsage
from pyggml.backend.tensor_io import host_bytes
from pyggml.core.host_memory import aligned_bytes, populate, zero_anonymous
from pyggml.core.tensor import Tensor
from pyggml.errors import BackendError

TENSOR_ALIGNMENT = 32
CLEAR_BY_PAGES = 1 << 20  # buffers from this size on are cleared by handing their pages back (zero_anonymous)


class CpuBuffer(Buffer):
    """Host bytes in a NumPy uint8 array (owned, or borrowed from a host object: then possibly read-only).

    Thread-safety: as Buffer (disjoint tensors may be read and written concurrently).
    """

    def __init__(self, buft: BufferType, host_array: np.ndarray, anonymous: bool = False):
        super().__init__(buft, host_array.nbytes)
        self._host = host_array
        self.anonymous = anonymous  # the process's own anonymous memory (aligned_bytes), not borrowed
        self._address = host_array.ctypes.data  # asked for on every tensor placed; the array never moves
        self.read_only = not host_array.flags.writeable
        self.host_views: dict = {}  # host_ndarray's views of this memory by layout, dropped with the memory

    @property
    def host_array(self) -> np.ndarray:
        self.check_alive()
        return self._host

    def _span(self, t: Tensor, offset: int, size: int) -> np.ndarray:
        start = self.offset_of(t) + offset
        return self._host[start: start + size]

    def _base(self) -> int:
        return self._address

    def _free(self) -> None:
        self._host = None  # drops the memory (or the reference to a borrowed object)
        self.host_views = {}

    def _memset_tensor(self, t: Tensor, value: int, offset: int, size: int) -> None:
        self._span(t, offset, size).fill(value)

    def _set_tensor(self, t: Tensor, data: memoryview, offset: int, size: int) -> None:
        self._span(t, offset, size)[:] = np.frombuffer(data, np.uint8, count=size)

    def _get_tensor(self, t: Tensor, out: memoryview, offset: int, size: int) -> None:
        np.frombuffer(out, np.uint8, count=size)[:] = self._span(t, offset, size)

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """A direct copy when src is in host memory (ggml: memcpy), else False."""
        src_bytes = host_bytes(src)
        if src_bytes is None:
            return False
        self._span(dst, 0, src.nbytes)[:] = np.frombuffer(src_bytes, np.uint8)
        return True

    def _clear(self, value: int) -> None:
        """Zeros in a large buffer of its own memory go back to the OS as whole pages (zero_anonymous)."""
        if value == 0 and self.anonymous and self.size >= CLEAR_BY_PAGES:
            zero_anonymous(self._host)
        else:
            self._host.fill(value)


def make_resident(tensors: list[Tensor]) -> None:
    """Make the memory of these tensors that lies in compute buffers (the graph allocator's, of this process's own
    memory) resident, in one call per stretch of neighbouring tensors: a graph's steps then write memory that is
    there, where each first write of a page would fault (on a virtual machine up to about 10 ms per MiB: a new
    step shape's first run paid 0.2 s of faults). Only what the graph uses: a compute buffer is reserved for the
    largest step (83 MiB for a 135M model's 512-token batches), and making all of it resident when it was
    designated took 0.15-0.2 s of a 32-token `pyggml generate` whose steps use a few MiB of it."""
    spans: dict[int, list[tuple[int, int]]] = {}  # id(buffer) -> its tensors' [start, end) addresses
    for t in tensors:
        base = t.view_src or t
        buffer = base.buffer
        if (type(buffer) is CpuBuffer and buffer.anonymous and buffer.usage == BufferUsage.COMPUTE
                and base.data is not None):
            spans.setdefault(id(buffer), []).append((base.data, base.data + base.nbytes))
    for ranges in spans.values():
        ranges.sort()
        start, end = ranges[0]
        for first, last in ranges[1:]:
            if first > end + mmap.PAGESIZE:  # a whole page apart: the next stretch
                populate(start, end - start)
                start = first
            end = max(end, last)
        populate(start, end - start)


class ConvertedBuffer(CpuBuffer):
    """A buffer whose tensors' bytes are converted as they are written (the extra buffer types CPU_F32 and
    CPU_INTERLEAVED, as ggml's): not host memory to the rest of the system, so no generic views, no
    read-back, no memset, no direct copy.
    `what` says, in the errors, what the conversion made of the bytes."""

    host_array = None  # the memory holds the conversion, not the tensors' bytes: no generic host views of it
    what = "converted"

    def _get_tensor(self, t: Tensor, out: memoryview, offset: int, size: int) -> None:
        raise BackendError(f"{self.buft.name}: {t.name!r} cannot be read back (its bytes were {self.what} as they "
                           f"were written, as in ggml's extra buffers)")

    def _memset_tensor(self, t: Tensor, value: int, offset: int, size: int) -> None:
        raise BackendError(f"{self.buft.name}: memset of {t.name!r} is not supported (only whole rows are written)")

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        return False


class CpuBufferType(BufferType):
    """ggml's "CPU" buffer type: host memory, 32-byte tensor alignment, no size limit.

    Thread-safety: alloc_buffer may be called from any thread.
    """

    name = "CPU"
    alignment = TENSOR_ALIGNMENT
    is_host = True

    def _alloc_buffer(self, size: int) -> Buffer:
        # uninitialised and in 4 KiB pages, like ggml_aligned_malloc's under Linux's default transparent huge pages
        # ("madvise": only ranges that ask get them; see aligned_bytes)
        return CpuBuffer(self, aligned_bytes(size, fill=None, huge_pages=False), anonymous=True)


class CpuMappedBufferType(CpuBufferType):
    """The type of buffers made over existing host memory (an mmap of a model file, an ndarray, ...)."""

    name = "CPU_Mapped"
