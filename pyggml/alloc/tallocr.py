"""TensorAllocator: ggml's linear (bump) allocator, which packs tensors one after another into a buffer."""

from __future__ import annotations

from pyggml.backend.base import Buffer, Status
from pyggml.backend.tensor_io import tensor_alloc
from pyggml.core.tensor import Tensor
from pyggml.errors import AllocationError, OutOfBufferSpace


class TensorAllocator:
    """ggml_tallocr: each tensor goes at the next offset, its size padded to the buffer's alignment.

    The first offset aligns the buffer's absolute base, so a buffer sized as the exact sum of the padded
    sizes holds them all when its base is aligned. A tensor that does not fit raises OutOfBufferSpace
    (ggml aborts) and leaves the allocator and the tensor unchanged.
    """

    def __init__(self, buffer: Buffer):
        alignment = buffer.alignment
        if alignment < 1 or alignment & (alignment - 1):
            raise AllocationError(f"buffer {buffer.name}: alignment {alignment} is not a power of two")
        self.buffer = buffer
        self.base = buffer.base or 0
        self.alignment = alignment
        self.offset = -self.base % alignment

    def __repr__(self) -> str:
        return f"TensorAllocator({self.buffer!r}, offset {self.offset})"

    def alloc(self, t: Tensor) -> Status:
        """Place t at the current offset and advance past its padded size."""
        size = -(-self.buffer.alloc_size(t) // self.alignment) * self.alignment
        available = self.buffer.size - self.offset
        if size > available:
            raise OutOfBufferSpace(f"not enough space in buffer {self.buffer.name} ({self.buffer.size} bytes) to "
                                   f"allocate tensor {t.name!r}: needed {size}, available {max(available, 0)}")
        status = tensor_alloc(self.buffer, t, self.base + self.offset)
        self.offset += size
        return status
