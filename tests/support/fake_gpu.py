"""A fake GPU backend in one short file: non-host memory, a few ops, optional op offload.

It is the scheduler tests' stand-in for a real accelerator (ggml's scheduler tests use one the same way) and an
example of how little a backend must write: the base classes own everything else.
Its memory is plain NumPy bytes, but its buffer type says "not host", so the CPU
backend cannot touch it and every crossing goes through the scheduler's copies.
"""

from __future__ import annotations

from pyggml.backend import Buffer, BufferType
from pyggml.backend.base import computed_nodes
from pyggml.backend.cpu import kernels
from pyggml.core.host_memory import aligned_bytes
from pyggml.core.tensor import VIEW_OPS, Op, Tensor

from tests.support.minimal_backend import MinimalBackend, MinimalBufferType, MinimalDevice


class FakeBuffer(Buffer):
    def __init__(self, buft: BufferType, size: int):
        super().__init__(buft, size)
        self.host_array = aligned_bytes(size)  # lets the CPU kernels compute here on the fake device's behalf

    def _base(self) -> int:
        return self.host_array.ctypes.data

    def _span(self, t: Tensor, offset: int, size: int):
        start = t.data - self._base() + offset
        return self.host_array[start:start + size]

    def _set_tensor(self, t, data, offset, size):
        self._span(t, offset, size)[:] = data

    def _get_tensor(self, t, out, offset, size):
        out[:] = self._span(t, offset, size)

    def _memset_tensor(self, t, value, offset, size):
        self._span(t, offset, size)[:] = value

    def _clear(self, value):
        self.host_array[:] = value


class FakeBufferType(MinimalBufferType):
    name = "FAKE"
    alignment = 32

    def _alloc_buffer(self, size: int) -> Buffer:
        self.allocated.append(size)
        return FakeBuffer(self, size)


class FakeBackend(MinimalBackend):
    name = "FAKE"
    guid = b"fake-gpu-backend"

    def _graph_compute(self, graph):
        for node in computed_nodes(graph):
            kernels.compute(node)
        return super()._graph_compute(graph)


class FakeDevice(MinimalDevice):
    """The minimal device (tests/support/minimal_backend.py) with memory the CPU kernels compute in, the ops
    it is told to support and to take over (offload_op)."""

    name = "FAKE"
    description = "fake GPU for scheduler tests"

    def __init__(self, ops=(Op.MUL_MAT, Op.UNARY), offload=()):
        super().__init__()
        self.ops, self.offload = set(ops), set(offload)
        self.buft = FakeBufferType(self)

    def memory(self):
        return 1 << 30, 1 << 30

    def init_backend(self, params=None):
        return FakeBackend(self)

    def supports_op(self, t: Tensor) -> bool:
        return t.op == Op.NONE or t.op in VIEW_OPS or t.op in self.ops

    def offload_op(self, t: Tensor) -> bool:
        return t.op in self.offload
