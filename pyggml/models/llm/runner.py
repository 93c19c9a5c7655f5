"""Where a model's step graphs are planned and computed: one backend, or several through the scheduler.

With several backends the model is split by layers as llama.cpp's `--rpc` / `-sm layer` do: every
layer's weights and KV cache live on one backend (the token embedding and the output head stay on the
local CPU backend, the last one), layers are dealt out in proportion to each device's free memory,
and the scheduler runs each op where its weights are, copying activations between backends.
"""

from __future__ import annotations

from collections import OrderedDict

from pyggml.alloc import GraphAllocator
from pyggml.backend import (Backend, BufferType, BufferUsage, DeviceType, init_by_name, tensor_alloc, tensor_get,
                            tensor_set)
from pyggml.backend.base import Buffer, Status
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.errors import ComputeAborted, GGMLError
from pyggml.sched import Scheduler


class SingleBackend:
    """One backend, one GraphAllocator reserved for the worst case.

    A step graph that is computed again (the model reuses it while the step shape stays the same) runs
    through a backend graph plan made once, where the backend has plans (ggml_backend_graph_plan_*):
    the kernels are looked up once per graph instead of once per token.
    """

    def __init__(self, backend: Backend, planner: str = "best"):
        self.backend = backend
        self.galloc = GraphAllocator(backend.default_buffer_type, planner=planner)
        self.has_plans = type(backend)._graph_plan_create is not Backend._graph_plan_create
        self._plans: OrderedDict[int, tuple[Graph, object]] = OrderedDict()  # id(graph) -> (graph, its plan)

    def reserve(self, graph: Graph) -> None:
        self.galloc.reserve(graph)

    graphs_kept = 2  # placed graphs stay valid side by side in the one buffer: the prompt's and the token's

    def alloc_graph(self, graph: Graph) -> None:
        self.forget(graph)  # placing a graph anew may change what its plan would hold
        self.galloc.alloc_graph(graph)

    def compute(self, graph: Graph) -> None:
        if not self.has_plans:
            check_status(self.backend.graph_compute(graph), self.backend.name)
            return
        status = self.backend.graph_plan_compute(self.plan_of(graph))
        self.backend.synchronize()
        check_status(status, self.backend.name)

    def plan_of(self, graph: Graph):
        """graph's backend plan: the one made before (the latest graphs_kept are kept), else a new one."""
        entry = self._plans.get(id(graph))
        if entry is None or entry[0] is not graph:
            entry = (graph, self.backend.graph_plan_create(graph))
            self._plans[id(graph)] = entry
            while len(self._plans) > self.graphs_kept:
                self.backend.graph_plan_free(self._plans.popitem(last=False)[1][1])
        self._plans.move_to_end(id(graph))
        return entry[1]

    def forget(self, graph: Graph) -> None:
        """Free graph's plan, if it has one (the next compute plans, and binds its kernels, again)."""
        entry = self._plans.pop(id(graph), None)
        if entry is not None:
            self.backend.graph_plan_free(entry[1])

    @property
    def plan(self):
        return self.galloc.plan

    @property
    def buffer_size(self) -> int:
        return self.galloc.get_buffer_size(0)

    def describe(self) -> str:
        return self.backend.name


class Scheduled:
    """Several backends (the local CPU last) run by a Scheduler; each step graph is a new graph."""

    def __init__(self, backends: list[Backend], placement: list[tuple[str, list[int]]]):
        self.sched = Scheduler(backends, graph_size=8192)
        self.placement = placement

    def reserve(self, graph: Graph) -> None:
        if not self.sched.reserve(graph):
            raise GGMLError("the scheduler could not reserve the compute buffers of the worst-case step")

    graphs_kept = 1  # the scheduler places each graph anew

    def alloc_graph(self, graph: Graph) -> None:
        self.sched.reset()
        if not self.sched.alloc_graph(graph):
            raise GGMLError("the scheduler could not allocate a step graph")

    def compute(self, graph: Graph) -> None:
        check_status(self.sched.graph_compute(graph), "the scheduler")

    def forget(self, graph: Graph) -> None:
        """Nothing is kept per graph here."""

    @property
    def plan(self):
        return self.sched.galloc.plan

    @property
    def buffer_size(self) -> int:
        return sum(self.sched.get_buffer_size(i) for i in range(self.sched.n_backends))

    def describe(self) -> str:
        return ", ".join(f"{name} layers {ls[0]}..{ls[-1]}" if ls else f"{name} no layers"
                         for name, ls in self.placement)


def check_status(status: Status, who: str) -> None:
    """A step that did not finish raises: its logits would be those of a half-computed graph. The KV cells it
    wrote are past n_past, so the next step overwrites them and the cache stays consistent."""
    if status == Status.ABORTED:
        raise ComputeAborted(f"{who}: graph compute stopped by the abort callback")
    if status != Status.SUCCESS:
        raise GGMLError(f"{who}: graph compute failed with status {status.name}")


def layer_counts(n_layer: int, backends: list[Backend]) -> list[int]:
    """Layers per backend in proportion to each device's free memory (largest remainders get the rest)."""
    free = [max(b.device.memory()[0], 1) for b in backends]
    shares = [n_layer * f / sum(free) for f in free]
    counts = [int(s) for s in shares]
    for i in sorted(range(len(shares)), key=lambda i: counts[i] - shares[i])[: n_layer - sum(counts)]:
        counts[i] += 1
    return counts


def move_tensors(tensors: list[Tensor], buft: BufferType, usage: BufferUsage, read=None) -> Buffer:
    """Re-home tensors (roots) into one new buffer of buft, with the bytes `read(t)` gives (default: their own)."""
    offsets, size = [], 0
    for t in tensors:
        offsets.append(size)
        size += -(-buft.alloc_size(t) // buft.alignment) * buft.alignment
    buf = buft.alloc_buffer(size)
    buf.usage = usage
    for t, off in zip(tensors, offsets, strict=True):  # a tensor may be unplaced yet when `read` brings its bytes
        raw = tensor_get(t, 0, t.nbytes) if read is None else read(t)
        t.buffer = t.data = t.extra = None  # extra belonged to the old buffer (a converting buffer's marker)
        tensor_alloc(buf, t, buf.base + off)
        tensor_set(t, raw)
    return buf


def plan_layers(n_layer: int, backends: list[Backend]) -> list[tuple[Backend, list[int]]]:
    """Consecutive layers per backend, in proportion to free memory (layer_counts)."""
    placement, first = [], 0
    for backend, count in zip(backends, layer_counts(n_layer, backends), strict=True):
        placement.append((backend, list(range(first, first + count))))
        first += count
    return placement


def layer_prefixes(layers) -> tuple[str, ...]:
    """Name prefixes of these layers' weights (for str.startswith)."""
    return tuple(f"blk.{il}." for il in layers)


def remote_prefixes(placement) -> tuple[str, ...]:
    """Name prefixes of the weights of layers that do not stay on the local backend (the last)."""
    return layer_prefixes(il for _, layers in placement[:-1] for il in layers)


def split_layers(weights, kv, placement) -> Scheduled:
    """Place each remote layer's weights (bytes from the file: the loader left them unplaced) and move its
    KV cache from the local backend (the last) to its backend."""
    for backend, layers in placement[:-1]:
        if not layers:
            continue
        prefixes = layer_prefixes(layers)
        move_tensors([t for name, t in weights.tensors.items() if name.startswith(prefixes)],
                     backend.default_buffer_type, BufferUsage.WEIGHTS, weights.file_bytes)
        move_tensors([c for il in layers for c in (kv.k[il], kv.v[il])], backend.default_buffer_type, BufferUsage.ANY)
    return Scheduled([backend for backend, _ in placement], [(b.name, layers) for b, layers in placement])


def set_threads(backends: list[Backend], n_threads: int | None) -> None:
    """Give every backend that takes a thread count (ggml's `set_n_threads` extension) n_threads; None leaves
    their defaults."""
    if n_threads is None:
        return
    for backend in backends:
        reg = getattr(backend.device, "reg", None)
        set_n_threads = reg.get_proc_address("set_n_threads") if reg is not None else None
        if set_n_threads is not None:
            set_n_threads(backend, n_threads)


def backend_list(backend) -> list[Backend]:
    """Backends from a registered name, a comma-separated string of names, a Backend or a list of these;
    with several, a CPU backend (the list's first, else a new one) goes last, as the scheduler needs."""
    if isinstance(backend, str):
        items = backend.split(",")
    else:
        items = backend if isinstance(backend, (list, tuple)) else [backend]
    if any(isinstance(b, str) and b.strip().upper() != "CPU" for b in items):
        from pyggml.backend.registry import load_all

        load_all()  # installed plugin backends register their devices; not for CPU alone (torch's import alone
                    # took 180 MiB of RSS)
    backends = [init_by_name(b.strip()) if isinstance(b, str) else b for b in items]
    if backends[-1].device.type != DeviceType.CPU and len(backends) > 1:
        cpus = [b for b in backends if b.device.type == DeviceType.CPU]
        backends = [b for b in backends if b is not cpus[0]] + cpus[:1] if cpus else backends + [init_by_name("CPU")]
    return backends
