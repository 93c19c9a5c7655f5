"""Multi-buffer: one buffer made of several, as the allocators return when a context is split by max_size.

Tensors always point at the children, never at the multi-buffer; the multi-buffer only
frees, clears and sets the usage of all of them at once (ggml_backend_multi_buffer_*).
"""

from __future__ import annotations

from pyggml.backend.base import Buffer, BufferUsage
from pyggml.errors import BufferUseError


class MultiBuffer(Buffer):
    """Size is the children's total, buft the first child's, base None.

    Thread-safety: as Buffer; `free`, `clear` and setting `usage` touch every child.
    """

    def __init__(self, buffers: list[Buffer]):
        if not buffers:
            raise BufferUseError("multi_buffer: at least one buffer is needed")
        super().__init__(buffers[0].buft, sum(b.size for b in buffers))
        self.buffers = list(buffers)

    def _base(self) -> None:
        return None

    def _free(self) -> None:
        for b in self.buffers:
            b.free()

    def _clear(self, value: int) -> None:
        for b in self.buffers:
            b.clear(value)

    def _set_usage(self, usage: BufferUsage) -> None:
        for b in self.buffers:
            b.usage = usage


def multi_buffer(buffers: list[Buffer]) -> MultiBuffer:
    """ggml_backend_multi_buffer_alloc_buffer: take ownership of `buffers`."""
    return MultiBuffer(buffers)


def is_multi_buffer(buffer: Buffer) -> bool:
    return isinstance(buffer, MultiBuffer)
