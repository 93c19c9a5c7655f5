"""The backend interfaces of ggml-backend-impl.h: BufferType, Buffer, Backend, Event, Device, BackendReg.

As in tinygrad's device.py, the base classes own the policy (validation, freed
state, error messages, the seed's defaults for every optional member) and a
backend fills in a few underscore hooks. A minimal backend overrides:

- BufferType: `_alloc_buffer(size)`; sets `name` and `alignment` (and, if it differs
  from the default, `max_size`, `is_host`, `_alloc_size(t)`).
- Buffer: `_set_tensor`, `_get_tensor`, `_clear` (and optionally `_base`, `_free`,
  `_init_tensor`, `_memset_tensor`, `_cpy_tensor`, `_reset`, `_set_usage`,
  `set_tensor_2d`/`get_tensor_2d`).
- Backend: `name`, `guid`, `_graph_compute(graph)` (optionally `set/get_tensor_async`,
  `cpy_tensor_async`, `synchronize`, `_graph_plan_create/update/compute/free`,
  `event_record`, `event_wait`).
- Device: `name`, `description`, `memory()`, `init_backend()`, `buffer_type`,
  `supports_op`, `supports_buft` (optionally the rest).
- BackendReg: `name`, `devices` (optionally `_proc_addresses()`).

The checks on tensors (bounds, allocation, layout) live in `tensor_io`, as in
ggml's public wrappers; the hooks may assume their arguments are valid.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import IntEnum

from pyggml.core.tensor import VIEW_OPS, Op, Tensor, TensorFlag
from pyggml.errors import AllocationError, BackendError, BufferUseError, BufferFreedError

SIZE_MAX = 2**64 - 1  # ggml's "no limit" for get_max_size
API_VERSION = 2  # GGML_BACKEND_API_VERSION: a loaded BackendReg must report it


class BufferUsage(IntEnum):
    ANY = 0
    WEIGHTS = 1
    COMPUTE = 2


class DeviceType(IntEnum):
    CPU = 0
    GPU = 1
    IGPU = 2
    ACCEL = 3


class Status(IntEnum):
    ALLOC_FAILED = -2
    FAILED = -1
    SUCCESS = 0
    ABORTED = 1


@dataclass(frozen=True)
class DeviceCaps:
    """What a device can do; all False unless the device says otherwise (ggml zero-fills the props)."""

    async_: bool = False
    host_buffer: bool = False
    buffer_from_host_ptr: bool = False
    events: bool = False


@dataclass(frozen=True)
class DeviceProps:
    name: str
    description: str
    memory_free: int
    memory_total: int
    type: DeviceType
    device_id: str | None = None
    caps: DeviceCaps = field(default_factory=DeviceCaps)


class _FakeAddresses:
    """Disjoint, page-aligned address ranges for buffers whose memory is not in this process.

    ggml's allocators and scheduler do address arithmetic (data = base + offset); giving
    every non-host buffer its own range keeps that arithmetic valid and unambiguous.
    """

    START = 0x7E00_0000_0000
    PAGE = 4096

    def __init__(self):
        self._lock = threading.Lock()
        self._next = self.START

    def reserve(self, size: int) -> int:
        with self._lock:
            base = self._next
            self._next += -(-max(size, 1) // self.PAGE) * self.PAGE + self.PAGE  # a guard page between ranges
            return base


FAKE_ADDRESSES = _FakeAddresses()


# ----------------------------------------------------------------------------------------------
# Buffer type
# ----------------------------------------------------------------------------------------------
class BufferType:
    """Allocates buffers of one kind of memory (ggml_backend_buffer_type).

    Thread-safety: a buffer type holds no mutable state of its own; `alloc_buffer` may be
    called from several threads at once if the subclass's `_alloc_buffer` allows it
    (the CPU one does).
    """

    name: str = "?"
    alignment: int = 1
    max_size: int = SIZE_MAX
    is_host: bool = False

    def __init__(self, device: Device | None = None):
        self.device = device

    def alloc_buffer(self, size: int) -> Buffer:
        """A new buffer of `size` bytes; size 0 gives a dummy buffer without asking the backend."""
        size = int(size)
        if size < 0:
            raise AllocationError(f"buffer type {self.name}: cannot allocate a buffer of {size} bytes")
        if size == 0:
            return Buffer(self, 0)
        try:
            buffer = self._alloc_buffer(size)
        except MemoryError as e:
            raise AllocationError(f"buffer type {self.name}: failed to allocate a buffer of {size} bytes: {e}") from e
        if buffer is None:
            raise AllocationError(f"buffer type {self.name}: failed to allocate a buffer of {size} bytes")
        return buffer

    def alloc_size(self, t: Tensor) -> int:
        """Bytes the tensor needs in a buffer of this type, padding included (never less than nbytes)."""
        if type(self)._alloc_size is BufferType._alloc_size:
            return t.nbytes  # the default hook: nothing to check (asked for on every tensor placed)
        size = self._alloc_size(t)
        if size < t.nbytes:
            raise BackendError(f"buffer type {self.name}: alloc_size of {t.name!r} is {size} bytes, "
                               f"less than its {t.nbytes} bytes")
        return size

    # hooks
    def _alloc_buffer(self, size: int) -> Buffer:
        raise NotImplementedError(f"buffer type {self.name} does not implement _alloc_buffer")

    def _alloc_size(self, t: Tensor) -> int:
        return t.nbytes

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


# ----------------------------------------------------------------------------------------------
# Buffer
# ----------------------------------------------------------------------------------------------
class Buffer:
    """A block of memory of one buffer type that tensors are placed in (ggml_backend_buffer).

    `base` is the address of the first byte (None for a size-0 buffer). A buffer used after
    `free()` raises BufferFreedError; so does freeing it twice. A read-only buffer (e.g. over a
    read-only mmap) refuses writes with BufferUseError. A host buffer (buft.is_host) must also
    expose `host_array`, a uint8 NumPy array whose first byte is at `base`, so that
    `core.tensor.host_ndarray` and the host fast paths of tensor_copy can reach its tensors; it may
    offer `host_views`, a dict in which host_ndarray keeps views by layout (emptied when freed).

    Thread-safety: concurrent set/get/memset on disjoint tensors are safe; overlapping writes,
    or `free`/`clear`/`reset` concurrent with any other use, are not.
    """

    read_only = False

    def __init__(self, buft: BufferType, size: int):
        self.buft = buft
        self.size = int(size)
        self._usage = BufferUsage.ANY
        self._freed = False
        self._fake_base: int | None = None

    # ----- properties -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.buft.name

    @property
    def usage(self) -> BufferUsage:
        return self._usage

    @usage.setter
    def usage(self, usage: BufferUsage) -> None:
        self._usage = BufferUsage(usage)
        self._set_usage(self._usage)

    @property
    def is_host(self) -> bool:
        return self.buft.is_host

    @property
    def alignment(self) -> int:
        return self.buft.alignment

    @property
    def max_size(self) -> int:
        return self.buft.max_size

    def alloc_size(self, t: Tensor) -> int:
        return self.buft.alloc_size(t)

    @property
    def is_freed(self) -> bool:
        return self._freed

    @property
    def base(self) -> int | None:
        self.check_alive()
        return None if self.size == 0 else self._base()

    def offset_of(self, t: Tensor) -> int:
        """Byte offset of t's data from this buffer's base."""
        return t.data - (self.base or 0)

    def check_alive(self) -> None:
        if self._freed:
            raise BufferFreedError(f"buffer {self.name} ({self.size} bytes) was used after free()")

    def check_writable(self, what: str, t: Tensor | None = None) -> None:
        self.check_alive()
        if self.read_only:
            target = f" tensor {t.name!r}" if t is not None else ""
            raise BufferUseError(f"{what}: buffer {self.name} ({self.size} bytes) is read-only;{target} "
                                 "cannot be written")

    # ----- the interface ------------------------------------------------------------------------
    def free(self) -> None:
        self.check_alive()
        self._freed = True
        self._free()

    def init_tensor(self, t: Tensor) -> Status:
        self.check_alive()
        return self._init_tensor(t)

    def memset_tensor(self, t: Tensor, value: int, offset: int, size: int) -> None:
        self.check_writable("memset_tensor", t)
        self._memset_tensor(t, value, offset, size)

    def set_tensor(self, t: Tensor, data: memoryview, offset: int, size: int) -> None:
        """Write `size` bytes of `data` (a uint8 memoryview) at byte `offset` of t."""
        self.check_writable("set_tensor", t)
        self._set_tensor(t, data, offset, size)

    def get_tensor(self, t: Tensor, out: memoryview, offset: int, size: int) -> None:
        """Read `size` bytes at byte `offset` of t into `out` (a writable uint8 memoryview)."""
        self.check_alive()
        self._get_tensor(t, out, offset, size)

    def set_tensor_2d(self, t: Tensor, data: memoryview, offset: int, size: int,
                      n_copies: int, stride_tensor: int, stride_data: int) -> None:
        """n_copies rows of `size` bytes; the default is ggml's fallback, a loop of 1-D writes."""
        for i in range(n_copies):
            self.set_tensor(t, data[i * stride_data: i * stride_data + size], offset + i * stride_tensor, size)

    def get_tensor_2d(self, t: Tensor, out: memoryview, offset: int, size: int,
                      n_copies: int, stride_tensor: int, stride_data: int) -> None:
        for i in range(n_copies):
            self.get_tensor(t, out[i * stride_data: i * stride_data + size], offset + i * stride_tensor, size)

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """Copy src (any buffer) into dst (this buffer); False when this buffer cannot do it directly."""
        self.check_writable("cpy_tensor", dst)
        return self._cpy_tensor(src, dst)

    def clear(self, value: int = 0) -> None:
        """Fill the whole buffer with one byte value (a no-op on a size-0 buffer)."""
        self.check_writable("clear")
        if self.size:
            self._clear(value)

    def reset(self) -> None:
        self.check_alive()
        self._reset()

    # ----- hooks (defaults are the seed's) -----------------------------------------------------
    def _base(self) -> int:
        """Memory outside this process gets a fake but unique, aligned address range."""
        if self._fake_base is None:
            self._fake_base = FAKE_ADDRESSES.reserve(self.size)
        return self._fake_base

    def _free(self) -> None:
        pass

    def _set_usage(self, usage: BufferUsage) -> None:
        pass

    def _init_tensor(self, t: Tensor) -> Status:
        return Status.SUCCESS

    def _memset_tensor(self, t: Tensor, value: int, offset: int, size: int) -> None:
        raise BackendError(f"memset not implemented by backend buffer {self.name} (tensor {t.name!r})")

    def _set_tensor(self, t: Tensor, data: memoryview, offset: int, size: int) -> None:
        raise NotImplementedError(f"buffer {self.name} does not implement _set_tensor")

    def _get_tensor(self, t: Tensor, out: memoryview, offset: int, size: int) -> None:
        raise NotImplementedError(f"buffer {self.name} does not implement _get_tensor")

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        return False

    def _clear(self, value: int) -> None:
        raise NotImplementedError(f"buffer {self.name} does not implement _clear")

    def _reset(self) -> None:
        pass

    def __repr__(self) -> str:
        state = ", freed" if self._freed else ""
        return f"{type(self).__name__}({self.name!r}, {self.size} bytes, {self._usage.name}{state})"


# ----------------------------------------------------------------------------------------------
# Events
# ----------------------------------------------------------------------------------------------
class Event:
    """A point in a backend's stream that other backends or the host can wait for (ggml_backend_event).

    Thread-safety: as safe as the device's event functions; the base holds no state but `device`.
    """

    def __init__(self, device: Device):
        self.device = device

    def synchronize(self) -> None:
        self.device.event_synchronize(self)

    def free(self) -> None:
        self.device.event_free(self)


# ----------------------------------------------------------------------------------------------
# Backend
# ----------------------------------------------------------------------------------------------
def check_graph_buffers(backend_name: str, nodes) -> None:
    """Refuse to compute when any tensor of the nodes lives in a freed buffer (checked before anything runs)."""
    for node in nodes:
        for t in (node, *node.src):
            if t is None:
                continue
            buf = t.view_src.buffer if t.view_src is not None else t.buffer
            if buf is not None and buf.is_freed:
                raise BufferFreedError(f"{backend_name}: tensor {t.name!r} (used by node {node.name!r}) lives in "
                                       f"buffer {buf.name} ({buf.size} bytes), which was freed")


class Backend:
    """One stream of execution on a device (ggml_backend).

    Thread-safety: computes (graph_compute, graph_plan_compute) on one instance are serialized
    by a lock; other calls (copies, plan create/update/free, free) must not race with a compute.
    Use one backend instance per thread to compute concurrently.
    """

    name: str = "?"
    guid: bytes = bytes(16)
    # a batch of up to this many tokens gives each one the results it gets decoded alone, bit for bit (None: no
    # such promise): speculative decoding keeps its verification steps within it, so greedy output is plain's
    tokens_as_alone: int | None = None

    def __init__(self, device: Device):
        if not isinstance(self.guid, bytes) or len(self.guid) != 16:
            raise BackendError(f"backend {self.name}: guid must be 16 bytes, got {self.guid!r}")
        self.device = device
        self._freed = False
        self._compute_lock = threading.Lock()

    def check_alive(self) -> None:
        if self._freed:
            raise BackendError(f"backend {self.name} was used after free()")

    def free(self) -> None:
        self.check_alive()
        self._freed = True
        self._free()

    @property
    def default_buffer_type(self) -> BufferType:
        return self.device.buffer_type

    def alloc_buffer(self, size: int) -> Buffer:
        return self.default_buffer_type.alloc_buffer(size)

    @property
    def alignment(self) -> int:
        return self.default_buffer_type.alignment

    @property
    def max_size(self) -> int:
        return self.default_buffer_type.max_size

    # ----- async data access (defaults: synchronize, then the blocking call) -------------------
    def set_tensor_async(self, t: Tensor, data: memoryview, offset: int, size: int) -> None:
        self.synchronize()
        _buffer_of(t).set_tensor(t, data, offset, size)

    def get_tensor_async(self, t: Tensor, out: memoryview, offset: int, size: int) -> None:
        self.synchronize()
        _buffer_of(t).get_tensor(t, out, offset, size)

    def cpy_tensor_async(self, src_backend: Backend, dst_backend: Backend, src: Tensor, dst: Tensor) -> bool:
        """Queue a copy from src (on src_backend) to dst (on this backend); False if not supported."""
        return False

    def synchronize(self) -> None:
        """Wait for everything queued on this backend (a synchronous backend has nothing to wait for)."""

    # ----- graph plans (optional; the plan object is the backend's own) ---------------------
    def graph_plan_create(self, graph):
        self.check_alive()
        return self._graph_plan_create(graph)

    def graph_plan_free(self, plan) -> None:
        self.check_alive()
        self._graph_plan_free(plan)

    def graph_plan_update(self, plan, graph) -> None:
        """Point a plan at a graph of the same topology (faster than a new plan where supported)."""
        self.check_alive()
        self._graph_plan_update(plan, graph)

    def graph_plan_compute(self, plan) -> Status:
        self.check_alive()
        with self._compute_lock:
            return Status(self._graph_plan_compute(plan))

    def _graph_plan_create(self, graph):
        raise BackendError(f"backend {self.name} does not support graph plans (graph_plan_create)")

    def _graph_plan_free(self, plan) -> None:
        raise BackendError(f"backend {self.name} does not support graph plans (graph_plan_free)")

    def _graph_plan_update(self, plan, graph) -> None:
        raise BackendError(f"backend {self.name} does not support graph plans (graph_plan_update)")

    def _graph_plan_compute(self, plan) -> Status:
        raise BackendError(f"backend {self.name} does not support graph plans (graph_plan_compute)")

    # ----- compute ---------------------------------------------------------------------------
    def graph_compute_async(self, graph) -> Status:
        """Start computing the graph; calls from several threads on one backend run one after another."""
        self.check_alive()
        check_graph_buffers(self.name, graph.nodes)
        with self._compute_lock:
            return Status(self._graph_compute(graph))

    def graph_compute(self, graph) -> Status:
        """Compute the graph and wait for it: graph_compute_async followed by synchronize, as in ggml."""
        status = self.graph_compute_async(graph)
        self.synchronize()
        return status

    def _graph_compute(self, graph) -> Status:
        raise NotImplementedError(f"backend {self.name} does not implement _graph_compute")

    def _free(self) -> None:
        pass

    # ----- capabilities (through the device, as in ggml) -----------------------------------
    def supports_op(self, t: Tensor) -> bool:
        return self.device.supports_op(t)

    def supports_buft(self, buft: BufferType) -> bool:
        return self.device.supports_buft(buft)

    def offload_op(self, t: Tensor) -> bool:
        return self.device.offload_op(t)

    # ----- events ----------------------------------------------------------------------------
    def event_record(self, event: Event) -> None:
        raise BackendError(f"backend {self.name} does not support events (event_record)")

    def event_wait(self, event: Event) -> None:
        raise BackendError(f"backend {self.name} does not support events (event_wait)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _buffer_of(t: Tensor) -> Buffer:
    return t.view_src.buffer if t.view_src is not None else t.buffer


_COMPUTE = int(TensorFlag.COMPUTE)  # a plain int: testing an IntFlag with & costs an enum construction


def computed_nodes(graph):
    """The nodes a backend actually runs: flagged COMPUTE, not a view or NONE, not empty (ggml's node loop)."""
    return [n for n in graph.nodes
            if int(n.flags) & _COMPUTE and n.op != Op.NONE and n.op not in VIEW_OPS and 0 not in n.ne]


# ----------------------------------------------------------------------------------------------
# Device
# ----------------------------------------------------------------------------------------------
class Device:
    """One device of a backend registry entry (ggml_backend_device): its memory, buffer types and capabilities.

    Thread-safety: the queries (memory, props, supports_*) are safe from any thread;
    `init_backend` returns a new, independent backend each call.
    """

    name: str = "?"
    description: str = ""
    type: DeviceType = DeviceType.CPU
    caps: DeviceCaps = DeviceCaps()
    host_buffer_type: BufferType | None = None  # optional: pinned host memory for faster transfers

    def __init__(self, reg: BackendReg | None = None):
        self.reg = reg

    def memory(self) -> tuple[int, int]:
        """(free, total) bytes."""
        raise NotImplementedError(f"device {self.name} does not implement memory()")

    def props(self) -> DeviceProps:
        free, total = self.memory()
        return DeviceProps(self.name, self.description, free, total, DeviceType(self.type), caps=self.caps)

    def init_backend(self, params: str | None = None) -> Backend:
        raise NotImplementedError(f"device {self.name} does not implement init_backend()")

    @property
    def buffer_type(self) -> BufferType:
        raise NotImplementedError(f"device {self.name} does not implement buffer_type")

    def extra_buffer_types(self) -> list[BufferType]:
        """Buffer types for weights in a layout the device computes faster with (ggml_backend_dev_get_extra_bufts)."""
        return []

    def buffer_from_host_ptr(self, obj, size: int | None = None, max_tensor_size: int | None = None) -> Buffer:
        """A buffer over existing host memory (any buffer-protocol object, e.g. an mmap), without copying."""
        try:
            view = memoryview(obj).cast("B")
        except TypeError as e:
            raise BufferUseError(f"device {self.name}: buffer_from_host_ptr needs a C-contiguous buffer-protocol "
                              f"object, got {type(obj).__name__} ({e})") from None
        size = view.nbytes if size is None else int(size)
        if not 0 <= size <= view.nbytes:
            raise BufferUseError(f"device {self.name}: buffer_from_host_ptr of {size} bytes over an object of "
                              f"{view.nbytes} bytes")
        return self._buffer_from_host_ptr(view[:size], max_tensor_size)

    def _buffer_from_host_ptr(self, view: memoryview, max_tensor_size: int | None) -> Buffer:
        raise BackendError(f"device {self.name} cannot create buffers from host memory (buffer_from_host_ptr)")

    def supports_op(self, t: Tensor) -> bool:
        raise NotImplementedError(f"device {self.name} does not implement supports_op")

    def supports_buft(self, buft: BufferType) -> bool:
        raise NotImplementedError(f"device {self.name} does not implement supports_buft")

    def offload_op(self, t: Tensor) -> bool:
        return False

    def event_new(self) -> Event | None:
        """None when the device has no events (ggml returns NULL)."""
        return None

    def event_free(self, event: Event | None) -> None:
        pass

    def event_synchronize(self, event: Event) -> None:
        raise BackendError(f"device {self.name} does not support events (event_synchronize)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {DeviceType(self.type).name})"


# ----------------------------------------------------------------------------------------------
# Registry entry
# ----------------------------------------------------------------------------------------------
class BackendReg:
    """A backend implementation and its devices (ggml_backend_reg).

    `get_proc_address` answers ggml's well-known extension names with or without the
    `ggml_backend_` prefix ("set_n_threads" or "ggml_backend_set_n_threads").
    Thread-safety: read-only after construction.
    """

    name: str = "?"
    api_version: int = API_VERSION

    def __init__(self, devices: list[Device] | None = None):
        self.devices: list[Device] = list(devices or [])
        for dev in self.devices:
            dev.reg = self

    @property
    def device_count(self) -> int:
        return len(self.devices)

    def device(self, i: int) -> Device:
        if not 0 <= i < len(self.devices):
            raise BackendError(f"backend reg {self.name}: device index {i} out of range (it has {len(self.devices)})")
        return self.devices[i]

    def get_proc_address(self, name: str):
        """The extension function called `name`, or None if this backend does not offer it."""
        return self._proc_addresses().get(name.removeprefix("ggml_backend_"))

    def _proc_addresses(self) -> dict:
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self.devices)} devices)"

