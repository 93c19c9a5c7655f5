"""The NumPy CPU backend: the "CPU" device, reg and backend (its buffer types are in `cpu.buffer`).

Memory is a uint8 NumPy array per buffer; a tensor is a strided view at its offset, so
kernels read and write in place. The kernels themselves live in `cpu.kernels`.
"""

from __future__ import annotations

import contextlib
import operator
import os
import platform
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pyggml.backend.base import (Backend, BackendReg, Buffer, BufferType, Device, DeviceCaps, DeviceType, Status,
                                 check_graph_buffers, computed_nodes)
from pyggml.backend.cpu import kernels
from pyggml.backend.cpu.buffer import CpuBuffer, CpuBufferType, CpuMappedBufferType, make_resident
from pyggml.backend.cpu.f32_expand import F32ExpandedBufferType
from pyggml.backend.cpu.interleave import InterleavedBufferType
from pyggml.backend.cpu.kernels._blocks import set_threads
from pyggml.backend.cpu.kernels._common import INTERLEAVED, blas_threads
from pyggml.backend.cpu.kernels.mul_mat import GROUPED_COLUMNS, forget_quantized_activations
from pyggml.core.tensor import Tensor
from pyggml.errors import BackendError, UnsupportedOpError


CPU_GUID = bytes([0xAA, 0x67, 0xC7, 0x43, 0x96, 0xE6, 0xA3, 0x8A, 0xE3, 0xAF, 0xEA, 0x92, 0x36, 0xBC, 0xFC, 0x89])
AVAILABLE_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
DEFAULT_N_THREADS = 4  # ggml's default; BLAS never gets more threads than there are cores


# ----------------------------------------------------------------------------------------------
# Device
# ----------------------------------------------------------------------------------------------
def _cpu_model() -> str:
    """The "model name" line of /proc/cpuinfo, as ggml reports it."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "CPU"


class CpuDevice(Device):
    """The host CPU. Thread-safety: all queries are safe from any thread."""

    name = "CPU"
    type = DeviceType.CPU
    caps = DeviceCaps(async_=False, host_buffer=False, buffer_from_host_ptr=True, events=False)

    def __init__(self, reg: BackendReg | None = None):
        super().__init__(reg)
        self.description = _cpu_model()
        self._buffer_type = CpuBufferType(self)
        self._mapped_type = CpuMappedBufferType(self)
        self._f32_type = F32ExpandedBufferType(self)
        self._interleaved_type = InterleavedBufferType(self)

    def memory(self) -> tuple[int, int]:
        """(free, total): physical memory; ggml counts all of it as free."""
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return total, total

    def init_backend(self, params: str | None = None) -> CpuBackend:
        return CpuBackend(self)

    @property
    def buffer_type(self) -> BufferType:
        return self._buffer_type

    def _buffer_from_host_ptr(self, view: memoryview, max_tensor_size: int | None) -> Buffer:
        """Zero copy: the buffer's bytes are the object's bytes (read-only objects stay read-only).

        ggml asserts a 32-byte aligned pointer; NumPy views need no alignment, so any object is accepted.
        """
        return CpuBuffer(self._mapped_type, np.frombuffer(view, np.uint8))

    def supports_op(self, t: Tensor) -> bool:
        return kernels.supports(t)

    def extra_buffer_types(self) -> list[BufferType]:
        """[CPU_F32, CPU_INTERLEAVED]: quantized weights expanded to float32 (pyggml.backend.cpu.f32_expand), and
        the matrices of the types with integer products interleaved for them (pyggml.backend.cpu.interleave)."""
        return [self._f32_type, self._interleaved_type]

    def supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host or buft is self._f32_type or buft is self._interleaved_type


# ----------------------------------------------------------------------------------------------
# Backend
# ----------------------------------------------------------------------------------------------
@dataclass
class CpuGraphPlan:
    """The nodes to run as calls bound once (kernels looked up, views and parameters prepared), so that
    repeated computes of the graph make one call per node.

    The calls hold views of the memory the tensors had when bound: `addresses` (every node's and
    source's data address then) tells a compute whether the graph was placed anew since, and so
    whether to bind again; `buffers` are the distinct buffers they live in, checked for being freed.
    """

    graph: object
    steps: list[tuple[Tensor, Callable[[], None]]]
    tensors: list[Tensor]
    addresses: list
    buffers: list
    freed: bool = False
    blas_on_one_thread: bool = False  # the graph's products run on Numba's threads (see CpuBackend._run)


_DATA = operator.attrgetter("data")


def _data(tensors: list[Tensor]) -> list:
    return list(map(_DATA, tensors))  # twice as fast as a list comprehension: it runs every compute


class CpuBackend(Backend):
    """Runs graphs node by node with the NumPy and compiled kernels (synchronous: no async copies, no events).

    Thread-safety: one compute at a time per instance (enforced by the base's lock);
    set n_threads / abort_callback only between computes.
    """

    name = "CPU"
    guid = CPU_GUID
    tokens_as_alone = GROUPED_COLUMNS  # each column of such a product is summed as that token's alone

    def __init__(self, device: CpuDevice):
        super().__init__(device)
        self.n_threads = DEFAULT_N_THREADS
        self.abort_callback: Callable[[], bool] | None = None

    def _plan(self, graph) -> CpuGraphPlan:
        """Look up and bind every kernel first, so that an unsupported op fails before anything is computed."""
        steps = []
        for node in computed_nodes(graph):
            kernel = kernels.KERNELS.get(node.op)
            if kernel is None or not kernel.supports(node):
                srcs = ", ".join(f"{s.type.name}{list(s.ne)}" for s in node.srcs)
                raise UnsupportedOpError(f"CPU backend has no kernel for {node.op.name} -> {node.type.name} "
                                         f"from ({srcs}) in node {node.name!r}")
            steps.append((node, kernels.bound(node, kernel)))
        tensors = list({id(t): t for node, _ in steps for t in (node, *node.srcs)}.values())
        buffers = list({id(b): b for t in tensors if (b := (t.view_src or t).buffer) is not None}.values())
        interleaved = any(t.extra is INTERLEAVED for t in tensors)
        return CpuGraphPlan(graph, steps, tensors, _data(tensors), buffers, blas_on_one_thread=interleaved)

    def _resident_plan(self, graph) -> CpuGraphPlan:
        """A plan for computing the graph again and again, its memory in compute buffers made resident now
        (make_resident); a graph computed once, without a plan, faults its pages in as it writes them."""
        plan = self._plan(graph)
        make_resident(plan.tensors)
        return plan

    def _run(self, plan: CpuGraphPlan) -> Status:
        """The plan's calls in order. A graph whose weight products run on Numba's threads (interleaved weights)
        gives BLAS one thread: OpenBLAS's idle workers spin for a while after each call, and Numba's after
        each parallel loop, so two pools on the same cores slowed each other 2-4x (a 512-token prompt)."""
        n_threads = min(self.n_threads, AVAILABLE_CPUS)
        set_threads(n_threads)
        # C float semantics for every kernel (inf and NaN without NumPy warnings), set once per graph
        forget_quantized_activations()
        with blas_threads(1 if plan.blas_on_one_thread else n_threads), np.errstate(all="ignore"):
            for _, call in plan.steps:
                call()
                if self.abort_callback is not None and self.abort_callback():
                    return Status.ABORTED
        return Status.SUCCESS

    def _graph_compute(self, graph) -> Status:
        return self._run(self._plan(graph))

    def _graph_plan_create(self, graph) -> CpuGraphPlan:
        return self._resident_plan(graph)

    def _graph_plan_update(self, plan: CpuGraphPlan, graph) -> None:
        fresh = self._resident_plan(graph)
        plan.graph, plan.steps, plan.tensors, plan.addresses, plan.buffers, plan.blas_on_one_thread = (
            fresh.graph, fresh.steps, fresh.tensors, fresh.addresses, fresh.buffers, fresh.blas_on_one_thread)

    def _graph_plan_compute(self, plan: CpuGraphPlan) -> Status:
        if plan.freed:
            raise BackendError("CPU backend: graph_plan_compute on a plan that was freed")
        if any(b.is_freed for b in plan.buffers):
            check_graph_buffers(self.name, (node for node, _ in plan.steps))  # names the tensor and buffer
        if _data(plan.tensors) != plan.addresses:  # the graph was placed anew: its views moved
            self._graph_plan_update(plan, plan.graph)
            check_graph_buffers(self.name, (node for node, _ in plan.steps))
        return self._run(plan)

    def _graph_plan_free(self, plan: CpuGraphPlan) -> None:
        plan.freed = True
        plan.steps = []


def _cpu_backend(backend: Backend, what: str) -> CpuBackend:
    if not isinstance(backend, CpuBackend):
        raise BackendError(f"{what}: {backend!r} is not a CPU backend")
    return backend


def set_n_threads(backend: Backend, n_threads: int) -> None:
    """Threads for BLAS and the compiled kernels during this backend's computes (capped at the available cores)."""
    if n_threads <= 0:
        raise BackendError(f"set_n_threads: n_threads must be positive, got {n_threads}")
    _cpu_backend(backend, "set_n_threads").n_threads = int(n_threads)


def set_abort_callback(backend: Backend, callback: Callable[[], bool] | None) -> None:
    """callback() is asked after every node; True stops the compute with Status.ABORTED."""
    _cpu_backend(backend, "set_abort_callback").abort_callback = callback


def load_kernels(backend: Backend, types=None) -> int:
    """Load the compiled kernels this backend's computes over tensors of these ggml types call (None: every
    type), from the disk cache, now rather than at each one's first call (see jit.runtime.compile_cache);
    returns how many."""
    from pyggml.backend.cpu.jit.runtime.compile_cache import load_kernels as load

    _cpu_backend(backend, "load_kernels")
    return load(types)


def get_features() -> list[tuple[str, str]]:
    """ggml_backend_get_features: what this CPU backend is built on."""
    return [("NUMPY", np.__version__), ("BLAS_THREADS_MAX", str(AVAILABLE_CPUS))]


class CpuReg(BackendReg):
    """The "CPU" registry entry: one device, plus ggml's CPU extension functions."""

    name = "CPU"

    def __init__(self):
        super().__init__([CpuDevice()])

    def _proc_addresses(self) -> dict:
        return {"set_n_threads": set_n_threads, "set_abort_callback": set_abort_callback,
                "get_features": get_features, "load_kernels": load_kernels}


CPU_REG = CpuReg()


def init() -> CpuBackend:
    """A new CPU backend on the CPU device (ggml_backend_cpu_init)."""
    return CPU_REG.device(0).init_backend()


def is_cpu(backend: Backend | None) -> bool:
    return backend is not None and backend.guid == CPU_GUID
