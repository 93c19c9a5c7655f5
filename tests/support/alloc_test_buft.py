"""The test buffer type of llama.cpp's test-alloc.cpp: configurable max_size and alignment, no memory.

It counts the bytes of its live buffers, which is what test-alloc's bounds are about.
"""

from pyggml.backend.base import Buffer, BufferType


class DummyBufferType(BufferType):
    name = "dummy"

    def __init__(self, max_size: int = 64, alignment: int = 8):
        super().__init__()
        self.max_size = max_size
        self.alignment = alignment
        self.buffers: list[Buffer] = []

    def _alloc_buffer(self, size: int) -> Buffer:
        buffer = Buffer(self, size)
        self.buffers.append(buffer)
        return buffer

    def allocated_total(self) -> int:
        return sum(b.size for b in self.buffers if not b.is_freed)
