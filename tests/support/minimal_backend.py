"""The tests' one fake backend: a non-host device whose classes override only the required members (the
backend-layer tests check the base classes' defaults with it). fake_gpu.py extends it into an accelerator the
scheduler tests compute on; test_registry.py installs a subclass of it as a plug-in distribution."""

from pyggml.backend.base import Backend, BackendReg, Buffer, BufferType, Device, DeviceType, Status
from pyggml.core.tensor import Op


class MinimalBuffer(Buffer):
    """Remote-style memory: bytes kept in a private bytearray, no host address."""

    def __init__(self, buft, size):
        super().__init__(buft, size)
        self.mem = bytearray(size)

    def _set_tensor(self, t, data, offset, size):
        start = self.offset_of(t) + offset
        self.mem[start: start + size] = data

    def _get_tensor(self, t, out, offset, size):
        start = self.offset_of(t) + offset
        out[:] = self.mem[start: start + size]

    def _clear(self, value):
        self.mem[:] = bytes([value]) * self.size


class MinimalBufferType(BufferType):
    name = "MIN"
    alignment = 16

    def __init__(self, device=None):
        super().__init__(device)
        self.allocated = []

    def _alloc_buffer(self, size):
        self.allocated.append(size)
        return MinimalBuffer(self, size)


class MinimalBackend(Backend):
    name = "MIN"
    guid = b"minimal-backend!"

    def __init__(self, device):
        super().__init__(device)
        self.computed = []

    def _graph_compute(self, graph):
        self.computed.append(graph.n_nodes)
        return Status.SUCCESS


class MinimalDevice(Device):
    name = "MIN0"
    description = "a minimal device"
    type = DeviceType.GPU

    def __init__(self):
        super().__init__()
        self.buft = MinimalBufferType(self)

    def memory(self):
        return 100, 200

    def init_backend(self, params=None):
        return MinimalBackend(self)

    @property
    def buffer_type(self):
        return self.buft

    def supports_op(self, t):
        return t.op == Op.ADD

    def supports_buft(self, buft):
        return buft is self.buft


class MinimalReg(BackendReg):
    name = "MIN"


def minimal_device() -> MinimalDevice:
    """A device registered in its own (unregistered) reg."""
    dev = MinimalDevice()
    MinimalReg([dev])
    return dev
