"""Scheduler: ggml_backend_sched — one graph computed across several backends.

The passes follow ggml's `ggml_backend_sched_split_graph` (ggml-backend.cpp): assign every tensor a backend
(pre-allocated buffers, inputs, weights with op offload, four expansion passes, upgrades to
higher-priority backends sharing a buffer type, then sources and views), cut the
node list into splits of one backend each, create copies of the inputs a split
needs from other backends ("<backend>#<tensor>#<copy>"), plan all of it with one
GraphAllocator and run the splits in order.

Where pyggml differs from ggml 0.15.3 (all deliberate):
- The caller's graph is restored before it is split again: ggml rewires node
  sources to the copies and a second split of the same graph goes wrong; here the
  rewiring is undone at the next split, so splitting a graph twice gives the same
  plan (the sources point at the copies only between a split and the next one).
- Split inputs have no fixed limit (ggml HEAD's growable arrays).
- A split without inputs on another backend than the previous split waits for it,
  and each split records its event (ggml HEAD's race fix, llama.cpp #26040).
- An eval callback that returns False cancels the whole compute (ggml only stops the
  current split); graph_compute then returns Status.ABORTED.
- A tensor pre-allocated in a buffer no backend can use raises SchedulerError
  (ggml aborts the process).
- A view op always takes its root's backend, even when the user pinned it elsewhere: its
  bytes are the root's, and a pinned view in ggml is copied before its root is computed.
- An in-place op (one that writes into its root's memory) runs on a backend that can use that
  memory, pinned or not; when none of those can run the op, SchedulerError says so (ggml
  computes on a stale copy and gives wrong results).

Thread-safety: a Scheduler is used by one thread at a time; use one per thread.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from pyggml.alloc import GraphAllocator
from pyggml.backend import Backend, BufferType, BufferUsage, DeviceType, Status, tensor_copy
from pyggml.backend.tensor_io import tensor_get, tensor_set
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import MAX_SRC, VIEW_OPS, Op, Tensor, TensorFlag, host_ndarray
from pyggml.errors import SchedulerError

MAX_BACKENDS = 16
MAX_COPIES = 4

EvalCallback = Callable[[Tensor, bool], bool]


@dataclass
class Split:
    """A run of consecutive nodes [i_start, i_end) computed on one backend, and the tensors it copies in."""

    backend_id: int
    i_start: int
    i_end: int = 0
    inputs: list[Tensor] = field(default_factory=list)
    graph: Graph | None = None


def _buffer_of(t: Tensor):
    return t.view_src.buffer if t.view_src is not None else t.buffer


class Scheduler:
    """ggml_backend_sched: backends earlier in the list have priority; the last must be a CPU device."""

    def __init__(self, backends: list[Backend], bufts: list[BufferType] | None = None,
                 graph_size: int = 2048, parallel: bool = False, op_offload: bool = True):
        if not 1 <= len(backends) <= MAX_BACKENDS:
            raise SchedulerError(f"a scheduler takes 1 to {MAX_BACKENDS} backends, got {len(backends)}")
        if backends[-1].device.type != DeviceType.CPU:
            raise SchedulerError(f"the last backend must be a CPU device, got {backends[-1].name} "
                                 f"({DeviceType(backends[-1].device.type).name})")
        self.backends = list(backends)
        self.bufts = list(bufts) if bufts is not None else [b.default_buffer_type for b in backends]
        if len(self.bufts) != len(self.backends):
            raise SchedulerError(f"{len(self.bufts)} buffer types for {len(self.backends)} backends")
        for b, buft in zip(self.backends, self.bufts, strict=True):
            if not b.supports_buft(buft):
                raise SchedulerError(f"backend {b.name} does not support buffer type {buft.name}")
        self.graph_size = graph_size
        self.n_copies = MAX_COPIES if parallel else 1
        self.op_offload = op_offload
        self.events = [[b.device.event_new() for _ in range(self.n_copies)] if self.n_copies > 1 else [None]
                       for b in self.backends]
        self.galloc = GraphAllocator(self.bufts)
        self.debug = int(os.environ.get("PYGGML_SCHED_DEBUG", os.environ.get("GGML_SCHED_DEBUG", "0")) or 0)
        self.callback_eval: EvalCallback | None = None

        self.splits: list[Split] = []
        self.graph = Graph(size=0)  # the graph copy that the allocator plans
        self.node_backend_ids: list[int] = []
        self.leaf_backend_ids: list[int] = []
        self._prev_node_ids: list[int] = []
        self._prev_leaf_ids: list[int] = []
        self.graph_inputs: list[Tensor] = []
        self.ctx = Context(no_alloc=True)
        self.cur_copy = 0
        self.next_copy = 0
        self._ids: dict[int, int] = {}  # id(tensor) -> backend id
        self._copies: dict[tuple[int, int], list[Tensor]] = {}  # (id(tensor), backend id) -> copies
        self._keep: dict[int, Tensor] = {}  # keeps every hashed tensor alive so ids stay unique
        self._rewired: list[tuple[Tensor, int, Tensor]] = []  # (node, slot, original src) to restore
        self.is_reset = False
        self.is_alloc = False
        self.reset()

    # ----- public state ----------------------------------------------------------------------
    @property
    def n_backends(self) -> int:
        return len(self.backends)

    @property
    def n_splits(self) -> int:
        return len(self.splits)

    def get_backend(self, i: int) -> Backend:
        if not 0 <= i < self.n_backends:
            raise SchedulerError(f"backend index {i} out of range (the scheduler has {self.n_backends})")
        return self.backends[i]

    def _backend_index(self, backend: Backend | int) -> int:
        if isinstance(backend, int):
            self.get_backend(backend)
            return backend
        for i, b in enumerate(self.backends):
            if b is backend:
                return i
        raise SchedulerError(f"backend {backend.name} is not one of this scheduler's backends")

    def get_buffer_type(self, backend: Backend | int) -> BufferType:
        return self.bufts[self._backend_index(backend)]

    def get_buffer_size(self, backend: Backend | int) -> int:
        """Compute buffer bytes of that backend (0 when its buffer type is shared with an earlier backend)."""
        return self.galloc.get_buffer_size(self._backend_index(backend))

    def set_tensor_backend(self, t: Tensor, backend: Backend | int) -> None:
        """Pin t to a backend; pins survive until reset()."""
        self._set_id(t, self._backend_index(backend))
        self.is_reset = False

    def get_tensor_backend(self, t: Tensor) -> Backend | None:
        i = self._ids.get(id(t), -1)
        return None if i == -1 else self.backends[i]

    def set_eval_callback(self, callback: EvalCallback | None) -> None:
        """callback(t, ask): with ask=True return whether you want to see t; with ask=False t is
        computed and synchronized, return False to cancel the rest of the compute."""
        self.callback_eval = callback

    # ----- hash helpers ------------------------------------------------------------------------
    def _id(self, t: Tensor | None) -> int:
        return -1 if t is None else self._ids.get(id(t), -1)

    def _set_id(self, t: Tensor, backend_id: int) -> None:
        self._ids[id(t)] = backend_id
        self._keep[id(t)] = t

    def _copy(self, t: Tensor, backend_id: int, c: int) -> Tensor | None:
        copies = self._copies.get((id(t), backend_id))
        return None if copies is None else copies[c]

    # ----- lifecycle ---------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget assignments, pins and copies (ggml_backend_sched_reset); the next compute splits anew."""
        if not self.is_reset:
            self._ids.clear()
            self._copies.clear()
            self._keep.clear()
            self.is_reset = True
        self.is_alloc = False

    def synchronize(self) -> None:
        for b in self.backends:
            b.synchronize()
        if not self.is_alloc:
            self.next_copy = 0

    def free(self) -> None:
        self.synchronize()
        self._restore_graph()
        for row in self.events:
            for ev in row:
                if ev is not None:
                    ev.free()
        self.galloc.free()

    def _check_size(self, graph: Graph) -> None:
        if graph.n_nodes + graph.n_leafs > 2 * self.graph_size:
            raise SchedulerError(f"graph has {graph.n_nodes} nodes and {graph.n_leafs} leafs; this scheduler was "
                                 f"made for graph_size {self.graph_size}")

    def reserve(self, graph: Graph) -> bool:
        """Plan the compute buffers for a worst-case graph so that later graphs need no reallocation."""
        self._check_size(graph)
        self.synchronize()
        self.split_graph(graph)
        ok = self.galloc.reserve_n(self.graph, self.node_backend_ids, self.leaf_backend_ids)
        self.reset()
        return ok

    def reserve_size(self, graph: Graph) -> list[int]:
        """The compute buffer size each backend would need, without allocating anything."""
        self._check_size(graph)
        self.reset()
        self.synchronize()
        self.split_graph(graph)
        return self.galloc.reserve_n_size(self.graph, self.node_backend_ids, self.leaf_backend_ids)

    def alloc_graph(self, graph: Graph) -> bool:
        self._check_size(graph)
        if self.is_alloc:
            raise SchedulerError("alloc_graph called twice without reset(); build a new graph after each reset")
        self.cur_copy = self.next_copy
        self.next_copy = (self.next_copy + 1) % self.n_copies
        self.split_graph(graph)
        if not self._alloc_splits():
            return False
        self.is_alloc = True
        return True

    def graph_compute(self, graph: Graph) -> Status:
        status = self.graph_compute_async(graph)
        self.synchronize()
        return status

    def graph_compute_async(self, graph: Graph) -> Status:
        if not self.is_reset and not self.is_alloc:
            self.reset()
        if not self.is_alloc and not self.alloc_graph(graph):
            return Status.ALLOC_FAILED
        return self._compute_splits()

    # ----- pass 1 helpers ----------------------------------------------------------------------
    def _backend_from_buffer(self, t: Tensor, op: Tensor) -> int:
        buf = _buffer_of(t)
        if buf is None:
            return -1
        for i, b in enumerate(self.backends):
            if b.supports_buft(buf.buft) and b.supports_op(op):
                return i
        return -1

    def _backend_id_from_cur(self, t: Tensor) -> int:
        i = self._backend_from_buffer(t, t)
        if i != -1:
            return i
        if t.view_src is not None:
            i = self._backend_from_buffer(t.view_src, t)
            if i != -1:
                return i
        buf = _buffer_of(t)
        if buf is not None:
            raise SchedulerError(f"pre-allocated tensor {t.name!r} is in a buffer ({buf.name}) that no backend of "
                                 f"this scheduler can run {t.op.name} on")
        if t.flags & TensorFlag.INPUT:
            return self.n_backends - 1
        if t.op == Op.ROPE:  # the rope frequency tensor is too small to choose a backend by
            return -1
        for src in t.srcs:
            if src.buffer is not None and src.buffer.usage == BufferUsage.WEIGHTS:
                sb = self._backend_from_buffer(src, t)
                if self.op_offload and sb == self.n_backends - 1 and src.buffer.is_host:
                    for b in range(sb):
                        if self.backends[b].supports_op(t) and self.backends[b].offload_op(t):
                            return b
                return sb
        return -1

    def _buffer_supported(self, t: Tensor, backend_id: int) -> bool:
        buf = _buffer_of(t)
        if buf is not None:
            buft = buf.buft
        else:
            tid = self._id(t)
            if tid == -1 and t.view_src is not None:
                tid = self._id(t.view_src)
            buft = self.bufts[tid] if tid != -1 else None
        return buft is not None and self.backends[backend_id].supports_buft(buft)

    def _set_if_supported(self, node: Tensor, backend_id: int) -> None:
        if self.backends[backend_id].supports_op(node):
            self._set_id(node, backend_id)

    # ----- splitting ---------------------------------------------------------------------------
    def _restore_graph(self) -> None:
        for node, slot, src in reversed(self._rewired):
            node.src[slot] = src
        self._rewired.clear()

    def split_graph(self, graph: Graph) -> None:  # noqa: C901
        """Assign backends, cut splits, create input copies and build the graph the allocator plans."""
        self._restore_graph()
        self.splits = []
        self.graph_inputs = []
        self.is_reset = False
        self.ctx = Context(no_alloc=True)
        nodes = graph.nodes
        compute_nodes = [n for n in nodes if n.op not in VIEW_OPS]

        # pass 1: pre-allocated tensors, inputs and weights (user pins are kept)
        for t in (*graph.leafs, *nodes):
            if self._id(t) == -1:
                self._set_id(t, self._backend_id_from_cur(t))

        # pass 2: expand non-CPU backends to their neighbours, then every backend
        cpu = self.n_backends - 1
        for skip_cpu in (True, False):
            for order in (compute_nodes, compute_nodes[::-1]):
                cur = -1
                for node in order:
                    nid = self._id(node)
                    if nid != -1:
                        cur = -1 if (skip_cpu and nid == cpu) else nid
                    elif cur != -1:
                        self._set_if_supported(node, cur)

        # pass 3: upgrade to higher-priority backends sharing the buffer type; place the rest by inputs
        for node in compute_nodes:
            nid = self._id(node)
            if nid == -1:
                best = -1
                for b, backend in enumerate(self.backends):
                    if not backend.supports_op(node):
                        continue
                    n_ok = sum(1 for s in node.srcs
                               if (self._id(s) != -1 or self._id(s.view_src) != -1) and self._buffer_supported(s, b))
                    if n_ok > best:
                        best = n_ok
                        self._set_id(node, b)
            else:
                for b in range(nid):
                    if (self.bufts[b] is self.bufts[nid] and self.backends[b].supports_op(node)
                            and all(self._buffer_supported(s, b) for s in node.srcs)):
                        self._set_id(node, b)
                        break

        # pass 4: sources and views follow their node / root; leftovers take the first capable backend
        for node in nodes:
            if node.view_src is not None and (self._id(node) == -1 or node.op in VIEW_OPS):
                root_id = self._id(node.view_src)
                if root_id != -1 or self._id(node) == -1:  # a view op lives where its memory is, pinned or not
                    self._set_id(node, root_id)
            for src in node.srcs:
                if self._id(src) == -1:
                    self._set_id(src, self._id(src.view_src) if src.view_src is not None else self._id(node))
            for b in range(self.n_backends):
                if self._id(node) != -1:
                    break
                self._set_if_supported(node, b)
            if self._id(node) == -1:
                raise SchedulerError(f"no backend of this scheduler supports node {node.name!r} ({node.op.name}); "
                                     f"add a CPU backend that does")
        for leaf in graph.leafs:  # a leaf no node reads (an output leaf): ggml leaves it at -1 and aborts
            if self._id(leaf) == -1:
                self._set_id(leaf, cpu)

        self._keep_in_place_ops_with_their_memory(nodes)
        self._cut_splits(nodes)
        if self.debug:
            print(self.describe(graph), file=sys.stderr)
        self._build_graph_copy(graph)

    def _keep_in_place_ops_with_their_memory(self, nodes: list[Tensor]) -> None:
        """An op that writes into another tensor's memory (add_inplace, cpy into a view) must run on a
        backend that can use that memory; ggml may place it elsewhere and compute on a stale copy."""
        for node in nodes:
            if node.view_src is None or node.op in VIEW_OPS:
                continue
            if self._buffer_supported(node.view_src, self._id(node)):
                continue
            able = [b for b in range(self.n_backends)
                    if self._buffer_supported(node.view_src, b) and self.backends[b].supports_op(node)]
            if not able:
                raise SchedulerError(
                    f"node {node.name!r} ({node.op.name}) writes into the memory of {node.view_src.name!r}, but no "
                    f"backend that can use that memory runs {node.op.name}; compute it out of place")
            root = self._id(node.view_src)
            self._set_id(node, root if root in able else able[0])

    def _cut_splits(self, nodes: list[Tensor]) -> None:
        """Pass 5: consecutive nodes of one backend form a split; sources from elsewhere get copies."""
        first = next((n for n in nodes if n.op not in VIEW_OPS), None)
        split = Split(self._id(first) if first is not None else self.n_backends - 1, 0)
        self.splits = [split]
        cur = split.backend_id
        for i, node in enumerate(nodes):
            if node.op in VIEW_OPS:
                continue
            nid = self._id(node)
            need_new = nid == cur and split.inputs and any(
                s.buffer is not None and s.buffer.usage == BufferUsage.WEIGHTS and self._id(s) != cur
                and not self._buffer_supported(s, cur) for s in node.srcs)
            if nid != cur or need_new:
                split.i_end = i
                split = Split(nid, i)
                self.splits.append(split)
                cur = nid
            for j in range(MAX_SRC):
                src = node.src[j]
                if src is None:
                    continue
                sid = self._id(src)
                if sid == -1:
                    raise SchedulerError(f"internal: source {src.name!r} of {node.name!r} has no backend")
                if src.flags & TensorFlag.INPUT and self.n_copies > 1 and (id(src), sid) not in self._copies:
                    self._copies[(id(src), sid)] = self._make_copies(src, sid, keep_original=True)
                    self.graph_inputs.append(src)
                if sid != cur and not self._buffer_supported(src, cur):
                    if (id(src), cur) not in self._copies:
                        self._copies[(id(src), cur)] = self._make_copies(src, cur, keep_original=False)
                        split.inputs.append(src)
                    node.src[j] = self._copies[(id(src), cur)][self.cur_copy]
                    self._rewired.append((node, j, src))
        split.i_end = len(nodes)

    def _make_copies(self, src: Tensor, backend_id: int, keep_original: bool) -> list[Tensor]:
        copies = []
        for c in range(self.n_copies):
            if keep_original and c == self.cur_copy:
                t = src
            else:
                t = Tensor(src.type, src.ne, src.nb, name=f"{self.backends[backend_id].name}#{src.name}#{c}")
                self.ctx.add(t)
            if self.n_copies > 1:
                t.flags |= TensorFlag.INPUT | TensorFlag.OUTPUT  # fixed slots that ggml-alloc never overwrites
            self._set_id(t, backend_id)
            copies.append(t)
        return copies

    def _build_graph_copy(self, graph: Graph) -> None:
        """The graph the allocator plans: per split, a dependency view and the copy of each input, then its nodes."""
        self._prev_node_ids, self._prev_leaf_ids = self.node_backend_ids, self.leaf_backend_ids
        copy = Graph(size=0)
        node_ids: list[int] = []
        for split in self.splits:
            split.graph = graph.view(split.i_start, split.i_end)
            for inp in split.inputs:
                dep = self.ctx.view_tensor(inp)  # keeps the source alive until the split starts
                dep.src[0] = inp
                copy.nodes.append(dep)
                node_ids.append(self._id(inp))
                copy.nodes.append(self._copy(inp, split.backend_id, self.cur_copy))
                node_ids.append(split.backend_id)
            for node in graph.nodes[split.i_start:split.i_end]:
                copy.nodes.append(node)
                node_ids.append(self._id(node))
        leaf_ids: list[int] = []
        if self.n_copies > 1:
            for inp in self.graph_inputs:
                bid = self._id(inp)
                for c in range(self.n_copies):
                    copy.leafs.append(self._copy(inp, bid, c))
                    leaf_ids.append(bid)
            for split in self.splits:
                for inp in split.inputs:
                    for c in range(self.n_copies):
                        copy.leafs.append(self._copy(inp, split.backend_id, c))
                        leaf_ids.append(split.backend_id)
        for leaf in graph.leafs:
            copy.leafs.append(leaf)
            leaf_ids.append(self._id(leaf))
        copy.size = max(copy.n_nodes, copy.n_leafs)
        self.graph = copy
        self.node_backend_ids, self.leaf_backend_ids = node_ids, leaf_ids

    # ----- allocation and compute ----------------------------------------------------------------
    def _ids_changed(self) -> bool:
        for now, prev in ((self.node_backend_ids, self._prev_node_ids), (self.leaf_backend_ids, self._prev_leaf_ids)):
            if len(now) != len(prev):
                return True
            if any(a != b and self.bufts[a] is not self.bufts[b] for a, b in zip(now, prev, strict=False)):
                return True
        return False

    def _alloc_splits(self) -> bool:
        if self._ids_changed() or not self.galloc.alloc_graph(self.graph):
            for b in self.backends:  # the re-plan may move split inputs
                b.synchronize()
            if not self.galloc.reserve_n(self.graph, self.node_backend_ids, self.leaf_backend_ids):
                return False
            if not self.galloc.alloc_graph(self.graph):
                return False
        return True

    def _wait_for(self, backend_id: int) -> None:
        ev = self.events[backend_id][self.cur_copy if self.n_copies > 1 else 0]
        if ev is not None:
            ev.synchronize()
        else:
            self.backends[backend_id].synchronize()

    def _copy_inputs(self, split: Split) -> None:
        sb = self.backends[split.backend_id]
        ev = self.events[split.backend_id][self.cur_copy if self.n_copies > 1 else 0]
        for k, inp in enumerate(split.inputs):
            ib = self.backends[self._id(inp)]
            cpy = self._copy(inp, split.backend_id, self.cur_copy)
            if inp.flags & TensorFlag.INPUT:
                # user data is copied at once, so the caller may overwrite it as soon as compute returns
                self._wait_for(split.backend_id)
                tensor_copy(inp, cpy)
                continue
            if ev is not None:
                sb.event_wait(ev)
            else:
                sb.synchronize()
            if self._is_expert_weights(inp, cpy, split):
                self._copy_used_experts(inp, cpy, split, k, ib)
            elif not sb.cpy_tensor_async(ib, sb, inp, cpy):
                ib.synchronize()
                self._wait_for(split.backend_id)
                tensor_copy(inp, cpy)

    @staticmethod
    def _is_expert_weights(inp: Tensor, cpy: Tensor, split: Split) -> bool:
        if not split.graph.nodes or inp.buffer is None:
            return False
        node = split.graph.nodes[0]
        return (inp.buffer.usage == BufferUsage.WEIGHTS and inp.buffer.is_host
                and node.op == Op.MUL_MAT_ID and node.src[0] is cpy)

    def _copy_used_experts(self, inp: Tensor, cpy: Tensor, split: Split, k: int, ib: Backend) -> None:
        """MoE weights offload: copy only the experts the ids select, in runs of consecutive experts."""
        node = split.graph.nodes[0]
        n_expert, expert_size = inp.ne[2], inp.nb[2]
        ib.synchronize()
        ids_tensor = node.src[2]
        for later in split.inputs[k + 1:]:  # ids not copied yet: read the original
            if ids_tensor is self._copy(later, split.backend_id, self.cur_copy):
                ids_tensor = later
                break
        ids = tensor_get(ids_tensor)
        if ids.size and (ids.min() < 0 or ids.max() >= n_expert):
            raise SchedulerError(f"{node.name!r}: expert id out of range 0..{n_expert - 1} in {ids_tensor.name!r}")
        used = sorted(set(int(i) for i in ids.ravel()))
        runs: list[list[int]] = []
        for e in used:
            if runs and e == runs[-1][1] + 1:
                runs[-1][1] = e
            else:
                runs.append([e, e])
        raw = host_ndarray(inp).reshape(-1).view(np.uint8)  # expert weights are contiguous host memory
        for first, last in runs:
            off = first * expert_size
            size = (last - first + 1) * expert_size
            if last < n_expert - 1:
                size += min(expert_size, 512)  # padding so no NaN follows the last expert (CUDA MMQ)
            size = min(size, inp.nbytes - off)
            tensor_set(cpy, raw[off:off + size], off, size)

    def _compute_splits(self) -> Status:
        prev_backend = -1
        for split in self.splits:
            sb = self.backends[split.backend_id]
            if not split.inputs and prev_backend not in (-1, split.backend_id):
                self._wait_for(prev_backend)
            self._copy_inputs(split)
            status = self._compute_split(sb, split)
            if status != Status.SUCCESS:
                return status
            ev = self.events[split.backend_id][self.cur_copy if self.n_copies > 1 else 0]
            if ev is not None:
                sb.event_record(ev)
            prev_backend = split.backend_id
        return Status.SUCCESS

    def _compute_split(self, sb: Backend, split: Split) -> Status:
        if self.callback_eval is None:
            return sb.graph_compute_async(split.graph)
        nodes = split.graph.nodes
        j0 = 0
        while j0 < len(nodes):
            j1 = j0
            need = self.callback_eval(nodes[j1], True)
            while not need and j1 < len(nodes) - 1:
                j1 += 1
                need = self.callback_eval(nodes[j1], True)
            status = sb.graph_compute_async(split.graph.view(j0, j1 + 1))
            if status != Status.SUCCESS:
                return status
            sb.synchronize()
            if need and not self.callback_eval(nodes[j1], False):
                return Status.ABORTED
            j0 = j1 + 1
        return Status.SUCCESS

    # ----- introspection -------------------------------------------------------------------------
    def describe(self, graph: Graph | None = None) -> str:
        """A readable dump of the splits, their inputs and (with a graph) every node's assignment."""
        lines = [f"scheduler: {self.n_backends} backends ({', '.join(b.name for b in self.backends)}), "
                 f"{self.n_splits} splits, {self.n_copies} copies"]
        for k, split in enumerate(self.splits):
            ins = ", ".join(f"{t.name} ({t.nbytes} B from {self.backends[self._id(t)].name})" for t in split.inputs)
            lines.append(f"## SPLIT #{k}: {self.backends[split.backend_id].name} nodes [{split.i_start}, "
                         f"{split.i_end}) {len(split.inputs)} inputs{': ' + ins if ins else ''}")
            if graph is not None:
                for i in range(split.i_start, split.i_end):
                    node = graph.nodes[i]
                    if node.op in VIEW_OPS:
                        continue
                    srcs = " ".join(f"{s.name}[{self._name_of(s)}]" for s in node.srcs)
                    lines.append(f"  node #{i:3d} {node.op.name:>12} {node.name:<24} [{self._name_of(node)}] {srcs}")
        return "\n".join(lines)

    def _name_of(self, t: Tensor) -> str:
        b = self.get_tensor_backend(t)
        return b.name if b is not None else "NULL"

