"""The PyTorch backend: buffer types, buffers, devices "TORCH_CPU" and "CUDA0".., the "TORCH" reg, the backend.

A buffer is one `torch.uint8` tensor on the device; a tensor is a typed strided view into it
(`storage[off:off+n].view(dtype).as_strided(ne[::-1], nb[::-1])`), so kernels read and write in
place, as the CPU backend does with NumPy.

TORCH_CPU memory is host memory, but its buffer type says `is_host = False`: the backend's
stream (a worker thread) may be writing it at any moment, so no other backend may read or write
it behind the stream's back. The scheduler therefore copies tensors in and out, exactly as for a
GPU, and `supports_buft` accepts only the device's own buffer type.
"""

from __future__ import annotations

import os
import warnings
import weakref

import numpy as np
import torch

from pyggml.backend.base import (Backend, BackendReg, Buffer, BufferType, Device, DeviceCaps, DeviceType, Event,
                                 Status, computed_nodes)
from pyggml.backend.tensor_io import host_bytes, tensor_buffer
from pyggml.backend.torch import kernels
from pyggml.backend.torch.stream import CudaStream, HostMarker, Stream, WorkerStream
from pyggml.core import types as T
from pyggml.core.tensor import Op, Tensor, host_ndarray
from pyggml.errors import BackendError, LayoutError, UnsupportedOpError

TORCH_GUID = b"pyggml.torch.v01"
OFFLOAD_MIN_BATCH = 32  # ggml-cuda's op_offload_min_batch_size default

TORCH_DTYPES = {
    T.GGMLType.F32: torch.float32, T.GGMLType.F16: torch.float16, T.GGMLType.BF16: torch.bfloat16,
    T.GGMLType.F64: torch.float64, T.GGMLType.I8: torch.int8, T.GGMLType.I16: torch.int16,
    T.GGMLType.I32: torch.int32, T.GGMLType.I64: torch.int64,
}


def _strided(flat: torch.Tensor, t: Tensor, offset: int) -> torch.Tensor:
    """t's typed view over `flat` (uint8) starting at byte `offset`: shape ne[::-1]; block types as uint8 rows."""
    if T.is_quantized(t.type):
        dtype, itemsize = torch.uint8, 1
        shape, strides = (t.ne[3], t.ne[2], t.ne[1], T.row_size(t.type, t.ne[0])), (t.nb[3], t.nb[2], t.nb[1], 1)
    else:
        dtype, itemsize = TORCH_DTYPES[t.type], T.type_size(t.type)
        shape, strides = tuple(reversed(t.ne)), tuple(reversed(t.nb))
    if offset % itemsize or any(s % itemsize for s in strides):
        raise LayoutError(f"tensor {t.name!r} ({T.type_name(t.type)}) at byte offset {offset} with nb={t.nb} is not "
                          f"aligned to its {itemsize}-byte elements; torch cannot view it")
    span = flat[offset: offset + t.nbytes]
    return span.view(dtype).as_strided(shape, [s // itemsize for s in strides])


# ----------------------------------------------------------------------------------------------
# Buffers
# ----------------------------------------------------------------------------------------------
class TorchBuffer(Buffer):
    """A torch uint8 tensor on the device, plus the float32 copies of quantized tensors computed from it.

    The cache is keyed by the tensor's address and layout and trusted only while the storage's
    version counter (bumped by every torch write through any view of it) is unchanged.
    """

    def __init__(self, buft: TorchBufferType, storage: torch.Tensor, read_only: bool = False):
        super().__init__(buft, storage.numel())
        self.storage = storage
        self.read_only = read_only
        self._dequantized: dict[tuple, tuple[int, torch.Tensor]] = {}

    def _base(self) -> int:
        if self.storage.device.type == "cpu":
            return self.storage.data_ptr()
        return super()._base()  # device memory: a fake, unique address range

    def _span(self, t: Tensor, offset: int, size: int) -> torch.Tensor:
        start = self.offset_of(t) + offset
        return self.storage[start: start + size]

    def view(self, t: Tensor) -> torch.Tensor:
        """The typed, strided torch view of t (zero copy)."""
        self.check_alive()
        return _strided(self.storage, t, self.offset_of(t))

    def dequantized(self, t: Tensor) -> torch.Tensor:
        """t's values as float32 on the device, converted once while the buffer is unchanged."""
        key = (t.data, t.type, tuple(t.ne), tuple(t.nb))
        version = self.storage._version
        hit = self._dequantized.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        values = kernels.dequantize(t, self.view(t))
        self._dequantized[key] = (version, values)
        return values

    def _free(self) -> None:
        self.storage = None
        self._dequantized.clear()

    def _settled(self) -> None:
        """Wait for a write issued on the device's current stream: the buffer interface is synchronous (as
        ggml-cuda's)."""
        if self.storage.is_cuda:
            torch.cuda.current_stream(self.storage.device).synchronize()

    def _memset_tensor(self, t: Tensor, value: int, offset: int, size: int) -> None:
        self._span(t, offset, size).fill_(value)
        self._settled()

    def _set_tensor(self, t: Tensor, data: memoryview, offset: int, size: int) -> None:
        self._span(t, offset, size).copy_(host_tensor(data))
        self._settled()

    def _get_tensor(self, t: Tensor, out: memoryview, offset: int, size: int) -> None:
        torch.from_numpy(np.frombuffer(out, np.uint8, count=size)).copy_(self._span(t, offset, size))

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """Direct copies from any torch buffer (any device) or from host memory; False otherwise."""
        src_buf = tensor_buffer(src)
        if isinstance(src_buf, TorchBuffer):
            self._span(dst, 0, src.nbytes).copy_(src_buf._span(src, 0, src.nbytes))
        else:
            src_bytes = host_bytes(src)
            if src_bytes is None:
                return False
            self._span(dst, 0, src.nbytes).copy_(host_tensor(src_bytes))
        self._settled()
        return True

    def _clear(self, value: int) -> None:
        self.storage.fill_(value)
        self._settled()


def host_tensor(data: memoryview) -> torch.Tensor:
    """A uint8 torch tensor over host bytes: zero copy when writable, a copy of read-only bytes (torch needs
    writable memory)."""
    arr = np.frombuffer(data, np.uint8)
    return torch.from_numpy(arr if arr.flags.writeable else arr.copy())


class TorchBufferType(BufferType):
    """Device memory allocated by torch; not host memory to anyone else (see the module docstring)."""

    is_host = False

    def __init__(self, device: TorchDevice):
        super().__init__(device)
        self.name = device.name
        self.alignment = 32 if device.torch_device.type == "cpu" else 128  # ggml's CPU and CUDA alignments

    def _alloc_buffer(self, size: int) -> Buffer:
        raw_size = size + self.alignment
        try:
            raw = torch.empty(raw_size, dtype=torch.uint8, device=self.device.torch_device)
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
            raise MemoryError(str(e)) from e
        start = (-raw.data_ptr()) % self.alignment
        return TorchBuffer(self, raw[start: start + size])


# ----------------------------------------------------------------------------------------------
# Device, events
# ----------------------------------------------------------------------------------------------
class TorchEvent(Event):
    """A ggml event: a marker of the device's stream kind (threading-based or a torch.cuda.Event)."""

    def __init__(self, device: TorchDevice, marker):
        super().__init__(device)
        self.marker = marker


def _batch_size(t: Tensor) -> int:
    """How ggml-cuda measures an op's batch for offload_op."""
    if t.op == Op.GET_ROWS:
        return 0
    if t.op == Op.MUL_MAT:
        return t.ne[1]
    if t.op in (Op.MUL_MAT_ID, Op.ROPE, Op.ROPE_BACK):
        return t.ne[2]
    return t.nrows


class TorchDevice(Device):
    """One torch device: "TORCH_CPU" or "CUDA<i>" (a GPU).

    TORCH_CPU has type CPU, so a scheduler may end with it (CUDA0 + TORCH_CPU); the NumPy "CPU" device,
    registered first, stays the one init_best() and init_by_type(CPU) pick.
    """

    caps = DeviceCaps(async_=True, host_buffer=False, buffer_from_host_ptr=False, events=True)

    def __init__(self, torch_device: torch.device, reg: BackendReg | None = None):
        super().__init__(reg)
        self.torch_device = torch.device(torch_device)
        is_cpu = self.torch_device.type == "cpu"
        if is_cpu:
            self.name, self.type = "TORCH_CPU", DeviceType.CPU
            self.description = f"PyTorch {torch.__version__} on the CPU"
            self.caps = DeviceCaps(async_=True, host_buffer=False, buffer_from_host_ptr=True, events=True)
        else:
            self.name, self.type = f"CUDA{self.torch_device.index}", DeviceType.GPU
            self.description = torch.cuda.get_device_name(self.torch_device)
        self._buffer_type = TorchBufferType(self)

    def memory(self) -> tuple[int, int]:
        if self.torch_device.type == "cpu":
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), total
        return torch.cuda.mem_get_info(self.torch_device)

    def init_backend(self, params: str | None = None) -> TorchBackend:
        return TorchBackend(self)

    @property
    def buffer_type(self) -> BufferType:
        return self._buffer_type

    def _buffer_from_host_ptr(self, view: memoryview, max_tensor_size: int | None) -> Buffer:
        """TORCH_CPU only: the buffer's storage is the object's memory (zero copy; read-only stays read-only)."""
        if self.torch_device.type != "cpu":
            return super()._buffer_from_host_ptr(view, max_tensor_size)
        with warnings.catch_warnings():  # torch warns about read-only memory; the buffer refuses writes itself
            warnings.simplefilter("ignore", UserWarning)
            storage = torch.frombuffer(view, dtype=torch.uint8) if view.nbytes else torch.empty(0, dtype=torch.uint8)
        return TorchBuffer(self._buffer_type, storage, read_only=view.readonly)

    def supports_op(self, t: Tensor) -> bool:
        return kernels.supports(t)

    def supports_buft(self, buft: BufferType) -> bool:
        return buft is self._buffer_type

    def offload_op(self, t: Tensor) -> bool:
        """CUDA devices take over ops with big batches (ggml-cuda's rule); TORCH_CPU never asks for work."""
        return self.type == DeviceType.GPU and _batch_size(t) >= OFFLOAD_MIN_BATCH

    def new_stream(self, name: str) -> Stream:
        if self.torch_device.type == "cpu":
            return WorkerStream(name)
        return CudaStream(name, self.torch_device)

    def event_new(self) -> TorchEvent:
        return TorchEvent(self, HostMarker() if self.torch_device.type == "cpu" else torch.cuda.Event())

    def event_synchronize(self, event: TorchEvent) -> None:
        event.marker.synchronize()


# ----------------------------------------------------------------------------------------------
# Backend
# ----------------------------------------------------------------------------------------------
def _torch_buffer(t: Tensor) -> TorchBuffer | None:
    buf = tensor_buffer(t)
    return buf if isinstance(buf, TorchBuffer) else None


class TorchBackend(Backend):
    """Runs graphs with the torch kernels on its own stream: every call returns at once, `synchronize` waits.

    Thread-safety: one backend per thread; calls on one backend from several threads are queued in
    the order they arrive. Errors raised by queued work surface at the next synchronize().
    """

    guid = TORCH_GUID

    def __init__(self, device: TorchDevice):
        super().__init__(device)
        self.name = device.name
        self.stream = device.new_stream(device.name)
        self._release = weakref.finalize(self, self.stream.release)  # a backend dropped without free()
        self._release.atexit = False  # a worker ending while the interpreter shuts down can abort inside torch

    def _free(self) -> None:
        self._release.detach()
        self.stream.close()

    def synchronize(self) -> None:
        self.check_alive()
        self.stream.synchronize()

    def _staging(self, size: int) -> torch.Tensor:
        """Host memory for an async transfer: pinned for CUDA, so the copy can overlap."""
        return torch.empty(size, dtype=torch.uint8, pin_memory=self.device.torch_device.type == "cuda")

    def set_tensor_async(self, t: Tensor, data: memoryview, offset: int, size: int) -> None:
        """The bytes are staged now, so the caller may reuse `data` at once."""
        buf = _torch_buffer(t)
        if buf is None:
            return super().set_tensor_async(t, data, offset, size)
        buf.check_writable("set_tensor_async", t)
        staged = self._staging(size)  # torch keeps pinned memory from reuse until the copy that reads it is done
        staged.copy_(host_tensor(data))
        self.stream.submit(lambda: buf._span(t, offset, size).copy_(staged, non_blocking=True))

    def get_tensor_async(self, t: Tensor, out: memoryview, offset: int, size: int) -> None:
        buf = _torch_buffer(t)
        if buf is None:
            return super().get_tensor_async(t, out, offset, size)
        buf.check_alive()
        staged = self._staging(size)
        self.stream.submit(lambda: staged.copy_(buf._span(t, offset, size), non_blocking=True))
        self.stream.after_synchronize(lambda: np.frombuffer(out, np.uint8, count=size).__setitem__(
            slice(None), staged.numpy()))

    def cpy_tensor_async(self, src_backend: Backend, dst_backend: Backend, src: Tensor, dst: Tensor) -> bool:
        """Queue a copy between torch buffers; the copy waits for what src_backend has queued so far."""
        src_buf, dst_buf = _torch_buffer(src), _torch_buffer(dst)
        if src_buf is None or dst_buf is None or dst_backend is not self:
            return False
        dst_buf.check_writable("cpy_tensor_async", dst)
        if isinstance(src_backend, TorchBackend) and src_backend is not self:
            marker = src_backend.stream.new_marker()
            src_backend.stream.record(marker)
            self.stream.wait(marker)
        self.stream.submit(lambda: dst_buf._span(dst, 0, dst.nbytes).copy_(src_buf._span(src, 0, src.nbytes),
                                                                          non_blocking=True))
        return True

    def _graph_compute(self, graph) -> Status:
        """Check every node now (an unsupported op raises here), then queue the computation."""
        nodes = computed_nodes(graph)
        for node in nodes:
            if not kernels.supports(node):
                srcs = ", ".join(f"{s.type.name}{list(s.ne)}" for s in node.srcs)
                raise UnsupportedOpError(f"{self.name} backend has no kernel for {node.op.name} -> {node.type.name} "
                                         f"from ({srcs}) in node {node.name!r}")
            for t in (node, *node.srcs):
                buf = _torch_buffer(t)
                if buf is None or buf.buft is not self.device.buffer_type:
                    raise BackendError(f"{self.name}: tensor {t.name!r} (used by node {node.name!r}) is in "
                                       f"{tensor_buffer(t)!r}, not in a {self.name} buffer")
        self.stream.submit(lambda: kernels.compute_nodes(nodes))
        return Status.SUCCESS

    def event_record(self, event: TorchEvent) -> None:
        self.stream.record(event.marker)

    def event_wait(self, event: TorchEvent) -> None:
        self.stream.wait(event.marker)


# ----------------------------------------------------------------------------------------------
# Interop and registration
# ----------------------------------------------------------------------------------------------
def to_torch(t: Tensor) -> torch.Tensor:
    """A torch tensor sharing t's memory (shape ne[::-1]; block types as uint8 rows; BF16 as torch.bfloat16).

    Tensors in torch buffers give the buffer's own view; tensors in host memory (CPU buffers,
    allocating contexts) go through DLPack. Nothing is copied. Synchronize t's backend first.
    """
    buf = _torch_buffer(t)
    if buf is not None:
        return buf.view(t)
    host = torch.from_dlpack(host_ndarray(t))
    return host.view(torch.bfloat16) if t.type == T.GGMLType.BF16 else host


def get_features() -> list[tuple[str, str]]:
    return [("TORCH", torch.__version__), ("CUDA", torch.version.cuda or "0")]


class TorchReg(BackendReg):
    """The "TORCH" registry entry: TORCH_CPU, then one device per visible CUDA GPU."""

    name = "TORCH"

    def __init__(self):
        gpus = [TorchDevice(torch.device("cuda", i)) for i in range(torch.cuda.device_count())]
        super().__init__([TorchDevice(torch.device("cpu")), *gpus])

    def _proc_addresses(self) -> dict:
        return {"get_features": get_features, "to_torch": to_torch}


TORCH_REG = TorchReg()
