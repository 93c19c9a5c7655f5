"""GraphAllocator: ggml's graph allocator (gallocr), which plans a graph's compute memory before it runs.

Read top to bottom, as ggml-alloc.c: the in-place op list, the planning pass (ggml's `alloc_graph_impl`:
leafs first, then INPUT tensors, then every node in order with in-place reuse and freeing after the last
consumer), the offline re-placement of the same lifetimes, the virtual buffer (up to 16 backend buffers,
one per chunk) and the allocator itself (reserve, automatic re-plan, alloc_graph).

`planner="ggml"` drives ggml's dynamic allocator node by node and gives ggml's offsets and buffer sizes
exactly. `planner="best"` (the default) keeps the same lifetimes and in-place decisions, merges every
in-place chain into one interval and places the intervals offline with `planner.plan_offsets`; it keeps
ggml's placement whenever that is not larger, so it is never worse than ggml.

Where ggml is unsafe, this allocator is safe:

* The root of an OUTPUT view is never freed, because `Tensor.set_output` flags the root too (ggml HEAD;
  0.15.3 flags only the view and can overwrite it).
* ggml compares only node counts and sizes before reusing a plan, so a graph with the same sizes but other
  edges silently runs on stale offsets. The plan here also records a fingerprint of the graph's edges,
  ops, INPUT/OUTPUT flags, views and same-layout relations; a changed fingerprint is re-planned (one
  buffer) or refused with False (several buffers), like any other needed re-plan; `needs_realloc(graph)`
  says why.
* ggml never checks a leaf that is no node's source (an output leaf) before reusing a plan; here every
  leaf must fit its planned memory too.
* `reserve_n_size` followed by `alloc_graph` allocates the planned buffers instead of dereferencing the
  buffers that `reserve_n_size` released (a crash in ggml 0.15.3).
* Asserts are exceptions: bad buffer ids or id lists of the wrong length raise BufferIdError before any
  state changes. A failed buffer allocation returns False as in ggml; the plan stays, and the next
  `alloc_graph` tries to allocate its buffers again. If binding a tensor fails in `alloc_graph`, the
  tensors it had bound are unbound again before the error propagates.
* ggml's in-place branch for view parents is unreachable (a view never owns planned memory) and is left out.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from pyggml.alloc import planner as offsets
from pyggml.alloc import schedule
from pyggml.alloc.plan import BufferPlan, Plan, TensorPlan
from pyggml.backend.base import SIZE_MAX, BufferType, BufferUsage
from pyggml.backend.tensor_io import tensor_alloc, view_init
from pyggml.core.graph import Graph
from pyggml.core.tensor import Op, Tensor, TensorFlag
from pyggml.errors import AllocationError, BufferIdError

log = logging.getLogger("pyggml.alloc")

PLANNERS = ("ggml", "best")

INPLACE_OPS = frozenset({
    Op.FILL, Op.SCALE, Op.DIAG_MASK_ZERO, Op.DIAG_MASK_INF, Op.ADD, Op.ADD_ID, Op.ADD1, Op.SUB, Op.MUL, Op.DIV,
    Op.SQR, Op.SQRT, Op.LOG, Op.UNARY, Op.ROPE, Op.ROPE_BACK, Op.SILU_BACK, Op.RMS_NORM, Op.RMS_NORM_BACK,
    Op.SOFT_MAX, Op.SOFT_MAX_BACK,
})
"""ggml_op_can_inplace: the ops whose kernels may write over a source."""

ELEMENTWISE_OPS = INPLACE_OPS | frozenset({Op.SIN, Op.COS, Op.CLAMP, Op.LEAKY_RELU, Op.GLU, Op.CONT, Op.DUP})
"""The in-place ops of `reorder=True`: ggml's list plus ops whose output element i depends only on the
sources' element i (or, for CONT/DUP, is it), so that writing an element over the same element of a
source of the same type, shape and strides never destroys a value still to be read. The CPU kernels of
the additions compute their result before storing it, which makes them safe even beyond that."""

REORDER_SEARCH_S = 0.5
"""With `reorder=True` the offline placement runs planner "search" for at most this long: the new order's
intervals are less regular than ggml's, and "best" alone can stay several percent above their LOAD."""

# plain ints: testing an IntFlag with & costs ten times more than int(flags) & mask
_OUTPUT = int(TensorFlag.OUTPUT)
_INPUT = int(TensorFlag.INPUT)
_IO = _INPUT | _OUTPUT


def _align(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment


# ----------------------------------------------------------------------------------------------
# 1. The planning pass (ggml_gallocr_alloc_graph_impl)
# ----------------------------------------------------------------------------------------------


class _Chain:
    """Bytes handed from tensor to tensor in place: one interval for the offline planner."""

    __slots__ = ("size", "start", "end", "chunk", "offset")

    def __init__(self, size: int, start: int):
        self.size, self.start, self.end = size, start, -1


class _HashNode:
    """ggml's hash_node (children, views, buffer id, address, ownership) plus the lifetime it records."""

    __slots__ = ("tensor", "n_children", "n_views", "buffer_id", "chunk", "offset", "allocated", "size",
                 "first", "last", "handed_over", "parent", "chain")

    def __init__(self, tensor: Tensor):
        self.tensor = tensor
        self.n_children = self.n_views = self.buffer_id = 0
        self.allocated = False
        self.chain = None
        self.parent = None
        self.last = -1
        self.handed_over = False


class _PlanningPass:
    """One run of ggml's planning over a graph: ggml's offsets in the dynamic allocators, and the lifetimes."""

    def __init__(self, bufts: list[BufferType], groups: list[int], allocators: dict[int, offsets.DynAllocator],
                 inplace_ops: frozenset = INPLACE_OPS):
        self.bufts, self.groups, self.allocators = bufts, groups, allocators
        self.inplace_ops = inplace_ops
        self.hash: dict[int, _HashNode] = {}
        self.placed: list[_HashNode] = []
        self.step = 0

    def get(self, t: Tensor) -> _HashNode:
        hn = self.hash.get(id(t))
        if hn is None:
            hn = self.hash[id(t)] = _HashNode(t)
        return hn

    def allocate_node(self, t: Tensor, buffer_id: int) -> None:
        hn = self.hash.get(id(t))
        if hn is None:
            hn = self.hash[id(t)] = _HashNode(t)
        elif hn.allocated:
            return
        if t.data is not None or t.buffer is not None or t.view_src is not None:
            return
        hn.allocated = True
        hn.first = self.step
        self.placed.append(hn)
        if t.op in self.inplace_ops and self._reuse_parent(t, hn):
            return
        hn.size = self.bufts[buffer_id].alloc_size(t)
        hn.buffer_id = buffer_id
        hn.chunk, hn.offset = self.allocators[self.groups[buffer_id]].alloc(hn.size)
        hn.chain = _Chain(hn.size, self.step)

    def _reuse_parent(self, t: Tensor, hn: _HashNode) -> bool:
        """Take over the first source that this node is the last user of (ggml's in-place rules)."""
        for p in t.src:
            if p is None:
                continue
            p_hn = self.hash.get(id(p))
            if p_hn is None or not p_hn.allocated:
                continue  # external memory, a view, or already released
            if int(p.flags) & _OUTPUT or (p.view_src is not None and int(p.view_src.flags) & _OUTPUT):
                continue
            if p.type != t.type or p.ne != t.ne or p.nb != t.nb:
                continue
            if p_hn.n_children == 1 and p_hn.n_views == 0:
                hn.buffer_id, hn.chunk, hn.offset = p_hn.buffer_id, p_hn.chunk, p_hn.offset
                hn.chain, hn.parent = p_hn.chain, p
                hn.size = self.bufts[hn.buffer_id].alloc_size(t)
                p_hn.allocated = False
                p_hn.last, p_hn.handed_over = self.step, True
                self._free_extra_space(hn, p_hn)
                return True
        return False

    def _free_extra_space(self, hn: _HashNode, p_hn: _HashNode) -> None:
        """A smaller child gives the tail of its parent's bytes back (only when a buffer type pads sizes)."""
        alignment = self.bufts[p_hn.buffer_id].alignment
        if hn.size > p_hn.size:
            raise AllocationError(f"in-place tensor {hn.tensor.name!r} needs {hn.size} bytes, more than the "
                                  f"{p_hn.size} bytes of its parent {p_hn.tensor.name!r}")
        parent_size, node_size = _align(p_hn.size, alignment), _align(hn.size, alignment)
        if parent_size > node_size:
            self.allocators[self.groups[p_hn.buffer_id]].free(p_hn.chunk, p_hn.offset + node_size,
                                                              parent_size - node_size)

    def free_node(self, t: Tensor, hn: _HashNode) -> None:
        if int(t.flags) & _OUTPUT:
            return  # outputs are never freed
        self.allocators[self.groups[hn.buffer_id]].free(hn.chunk, hn.offset, hn.size)
        hn.allocated = False
        hn.last = self.step
        hn.chain.end = self.step

    def run(self, leafs: list[Tensor], nodes: list[Tensor], node_ids: list[int] | None,  # noqa: C901
            leaf_ids: list[int] | None) -> None:
        get, allocate, hash_ = self.get, self.allocate_node, self.hash
        for i, leaf in enumerate(leafs):
            allocate(leaf, leaf_ids[i] if leaf_ids else 0)
        node_srcs = [[s for s in node.src if s is not None] for node in nodes]
        # count children and views; place INPUT tensors before anything else so nothing overwrites them
        for i, node in enumerate(nodes):
            buffer_id = node_ids[i] if node_ids else 0
            if node.view_src is not None and node.op != Op.NONE:
                get(node.view_src).n_views += 1
            if int(node.flags) & _INPUT:
                allocate(node, buffer_id)
            for src in node_srcs[i]:
                get(src).n_children += 1
                if int(src.flags) & _INPUT:
                    allocate(src, buffer_id)
        for i, node in enumerate(nodes):
            self.step = i
            buffer_id = node_ids[i] if node_ids else 0
            srcs = node_srcs[i]
            for src in srcs:
                if not hash_[id(src)].allocated:  # the common case (already placed) without a call
                    allocate(src, buffer_id)
            allocate(node, buffer_id)
            for p in srcs:
                p_hn = hash_[id(p)]
                p_hn.n_children -= 1
                if p_hn.n_children == 0 and p_hn.n_views == 0:
                    if p.view_src is not None:
                        root = p.view_src
                        r_hn = get(root)
                        r_hn.n_views -= 1
                        if r_hn.n_views == 0 and r_hn.n_children == 0 and r_hn.allocated:
                            self.free_node(root, r_hn)
                    elif p_hn.allocated:
                        self.free_node(p, p_hn)


# ----------------------------------------------------------------------------------------------
# 2. From a planning pass to a Plan (ggml's offsets, or the offline planner's when smaller)
# ----------------------------------------------------------------------------------------------


def _close_lifetimes(placed: list[_HashNode], n_steps: int) -> None:
    """Tensors and chains that were never released live to the last step."""
    last_step = n_steps - 1
    for hn in placed:
        if hn.last < 0:
            hn.last = max(last_step, hn.first)
        if hn.chain.end < 0:
            hn.chain.end = max(last_step, hn.chain.start)


def _lower_bound(members: list[_HashNode], alignment: int) -> int:
    """Peak of live padded bytes; a parent handed over in place stops counting the step before its child."""
    n = len(members)
    if not n:
        return 0
    first = np.fromiter((hn.first for hn in members), np.int64, n)
    last = np.fromiter((hn.last - hn.handed_over for hn in members), np.int64, n)
    size = np.fromiter((_align(hn.size, alignment) for hn in members), np.int64, n)
    keep = last >= first
    delta = np.zeros(int(last.max()) + 2, np.int64)
    np.add.at(delta, first[keep], size[keep])
    np.add.at(delta, last[keep] + 1, -size[keep])
    return int(np.cumsum(delta).max())


def _unbounded(max_size: int) -> int | None:
    return None if max_size >= SIZE_MAX // 2 else max_size


def _place_offline(members: list[_HashNode], buft: BufferType, search_s: float | None) -> offsets.PlanResult:
    """The offline planner over the in-place chains of one allocator (each chain is one interval): "best",
    or "search" for at most `search_s` seconds (it stops as soon as it reaches the lower bound)."""
    chains = list({id(hn.chain): hn.chain for hn in members}.values())
    intervals = [offsets.Interval(k, c.start, c.end + 1, c.size) for k, c in enumerate(chains)]
    result = offsets.plan_offsets(intervals, alignment=buft.alignment, planner="best" if search_s is None else "search",
                                  budget_s=search_s,
                                  max_size=_unbounded(buft.max_size))
    for k, c in enumerate(chains):
        c.chunk, c.offset = result.chunks[k], result.offsets[k]
    return result


def _make_plan(run: _PlanningPass, n_steps: int, planner: str, search_s: float | None = None) -> Plan:
    """Collect the pass into a Plan, re-placing each allocator's chains offline when that is smaller."""
    placed, bufts, groups = run.placed, run.bufts, run.groups
    _close_lifetimes(placed, n_steps)
    members: dict[int, list[_HashNode]] = {g: [] for g in run.allocators}
    for hn in placed:
        members[groups[hn.buffer_id]].append(hn)
    buffers = []
    for i, buft in enumerate(bufts):
        if groups[i] != i:
            buffers.append(BufferPlan([], 0, 0, buffers[groups[i]].planner, groups[i]))
            continue
        ggml_chunks = run.allocators[i].chunk_sizes
        chunks, chosen = ggml_chunks, "ggml"
        lower_bound = _lower_bound(members[i], buft.alignment)
        if planner == "best" and sum(ggml_chunks) > lower_bound:
            result = _place_offline(members[i], buft, search_s)
            if result.height < sum(ggml_chunks):
                chunks, chosen = list(result.chunk_sizes), "best"
                for hn in members[i]:
                    hn.chunk, hn.offset = hn.chain.chunk, hn.chain.offset
        buffers.append(BufferPlan(chunks, lower_bound, sum(ggml_chunks), chosen, i))
    tensors = [TensorPlan(hn.tensor, hn.buffer_id, hn.chunk, hn.offset, _align(hn.size, bufts[hn.buffer_id].alignment),
                          hn.first, hn.last, hn.parent) for hn in placed]
    return Plan(tensors, buffers, n_steps, planner)


# ----------------------------------------------------------------------------------------------
# 3. What alloc_graph needs to reuse a plan: ggml's per-position records, and the topology fingerprint
# ----------------------------------------------------------------------------------------------

TensorAlloc = tuple  # (buffer_id, chunk, offset, size_max); None for views, preallocated and empty slots


class _Record:
    """ggml's node_allocs/leaf_allocs (by graph position) and the fingerprint of the planned graph."""

    def __init__(self, graph: Graph, placed: list[_HashNode], inplace_ops: frozenset):
        allocs = {id(hn.tensor): (hn.buffer_id, hn.chunk, hn.offset, hn.size) for hn in placed}
        get = allocs.get
        self.leafs = [get(id(t)) for t in graph.leafs]
        self.nodes = [(get(id(t)), tuple([None if s is None else get(id(s)) for s in _used_slots(t)]))
                      for t in graph.nodes]
        self.fingerprint = fingerprint(graph, inplace_ops)
        self.graph_tensors = graph.leafs + graph.nodes  # the tensors the plan names
        self.bound_tensors = self.graph_tensors  # the latest graph placed with it (the plan is rebound on demand)


def _used_slots(t: Tensor) -> list[Tensor | None]:
    """The source slots up to the last non-empty one (interior empty slots kept)."""
    src = t.src
    n = len(src)
    while n and src[n - 1] is None:
        n -= 1
    return src[:n]


def fingerprint(graph: Graph, inplace_ops: frozenset = INPLACE_OPS) -> tuple:
    """What a plan depends on beyond sizes: edges by position, ops, INPUT/OUTPUT flags, views and,
    for in-place ops, which sources share the node's layout. Tensor identities, data and view
    offsets are left out, so a rebuilt graph of the same shape (e.g. the next token) matches."""
    index: dict[int, object] = {id(t): ~i for i, t in enumerate(graph.leafs)}
    index.update((id(t), i) for i, t in enumerate(graph.nodes))

    def ref(t: Tensor):
        k = index.get(id(t))
        if k is None:
            k = index[id(t)] = ("external", len(index))
        return k

    leafs = tuple((int(t.flags) & _IO, None if t.view_src is None else ref(t.view_src)) for t in graph.leafs)
    nodes = []
    for t in graph.nodes:
        slots = _used_slots(t)
        same = ()
        if t.op in inplace_ops:
            same = tuple([s is not None and s.type == t.type and s.ne == t.ne and s.nb == t.nb for s in slots])
        refs = tuple([None if s is None else ref(s) for s in slots])
        nodes.append((t.op, int(t.flags) & _IO, None if t.view_src is None else ref(t.view_src), refs, same))
    return leafs, tuple(nodes)


# ----------------------------------------------------------------------------------------------
# 4. Virtual buffer: one backend buffer per planned chunk
# ----------------------------------------------------------------------------------------------


class VirtualBuffer:
    """ggml's vbuffer: the chunks of one buffer id as separate backend buffers (tensors never straddle)."""

    def __init__(self, buft: BufferType, chunk_sizes: list[int]):
        self.chunks = []
        try:
            for size in chunk_sizes:
                buffer = buft.alloc_buffer(size)
                buffer.usage = BufferUsage.COMPUTE
                self.chunks.append(buffer)
        except BaseException:
            self.free()
            raise

    @property
    def size(self) -> int:
        return sum(b.size for b in self.chunks)

    def chunk_size(self, chunk: int) -> int:
        return self.chunks[chunk].size if chunk < len(self.chunks) else 0

    def tensor_alloc(self, t: Tensor, chunk: int, offset: int) -> None:
        buffer = self.chunks[chunk]
        tensor_alloc(buffer, t, (buffer.base or 0) + offset)

    def reset(self) -> None:
        for b in self.chunks:
            b.reset()

    def free(self) -> None:
        for b in self.chunks:
            if not b.is_freed:
                b.free()
        self.chunks = []


# ----------------------------------------------------------------------------------------------
# 5. The graph allocator
# ----------------------------------------------------------------------------------------------


class GraphAllocator:
    """Plans and allocates graphs into one compute buffer per buffer type (ggml_gallocr).

    `GraphAllocator(buft)` or `GraphAllocator([buft0, buft1, ...])`; the same buffer type object given
    twice shares one allocator and one buffer. `debug=True` (or PYGGML_DEBUG_ALLOC=1) verifies every plan.

    `reorder=True` lets planning choose the execution order (see `schedule`) and reuse a dying source's
    bytes for any of ELEMENTWISE_OPS: each reserve permutes `graph.nodes` into the order of lowest LOAD
    (the graph then runs in that order; node buffer ids follow their nodes) and the plan reports ggml's
    LOAD for the original order in `Plan.ggml_order_lower_bound`.

    Thread-safety: one thread at a time; use one allocator per thread.
    """

    def __init__(self, bufts: BufferType | list[BufferType], planner: str = "best", debug: bool | None = None,
                 reorder: bool = False):
        bufts = list(bufts) if isinstance(bufts, (list, tuple)) else [bufts]
        if not bufts:
            raise AllocationError("a graph allocator needs at least one buffer type")
        if planner not in PLANNERS:
            raise AllocationError(f"unknown planner {planner!r}; expected one of {PLANNERS}")
        self.bufts = bufts
        self.planner = planner
        self.reorder = reorder
        self.inplace_ops = ELEMENTWISE_OPS if reorder else INPLACE_OPS
        self.debug = os.environ.get("PYGGML_DEBUG_ALLOC") == "1" if debug is None else debug
        self._groups = [next(j for j in range(i + 1) if bufts[j] is bufts[i]) for i in range(len(bufts))]
        self._buffers: list[VirtualBuffer | None] = [None] * len(bufts)
        self._plan: Plan | None = None
        self._record: _Record | None = None

    def __repr__(self) -> str:
        return f"GraphAllocator({[b.name for b in self.bufts]}, planner={self.planner!r}, reorder={self.reorder})"

    @property
    def n_buffers(self) -> int:
        return len(self.bufts)

    @property
    def plan(self) -> Plan | None:
        """The latest plan (None before the first reserve), naming the tensors of the latest graph placed."""
        rec = self._record
        if rec is not None and rec.bound_tensors is not rec.graph_tensors:
            current = rec.bound_tensors
            if not all(a is b for a, b in zip(current, rec.graph_tensors, strict=False)):
                pairs = zip(rec.graph_tensors, current, strict=True)
                self._plan = self._plan.rebound({id(old): new for old, new in pairs})
            rec.graph_tensors = current
        return self._plan

    # ----- reserve ---------------------------------------------------------------------------------

    def reserve(self, graph: Graph) -> bool:
        """Plan the graph with everything on buffer 0 and allocate the buffers; False if allocation failed."""
        return self.reserve_n(graph)

    def reserve_n(self, graph: Graph, node_buffer_ids: list[int] | None = None,
                  leaf_buffer_ids: list[int] | None = None) -> bool:
        """Plan with a buffer id per node and per leaf (None: all 0) and grow the buffers that need it."""
        self._replan(graph, node_buffer_ids, leaf_buffer_ids)
        return self._realloc(no_alloc=False)

    def reserve_n_size(self, graph: Graph, node_buffer_ids: list[int] | None = None,
                       leaf_buffer_ids: list[int] | None = None) -> list[int]:
        """Plan without allocating and return the size per buffer id (shared buffers are counted per id,
        as in ggml). Buffers that would have to grow are released; the next alloc_graph allocates them."""
        self._replan(graph, node_buffer_ids, leaf_buffer_ids)
        self._realloc(no_alloc=True)
        return [self._plan.buffers[g].size for g in self._groups]

    def _check_ids(self, graph: Graph, ids: list[int] | None, n: int, what: str) -> list[int] | None:
        if ids is None:
            return None
        ids = [int(i) for i in ids]
        if len(ids) != n:
            raise BufferIdError(f"{what}_buffer_ids has {len(ids)} entries, but the graph has {n} {what}s")
        bad = next((k for k, b in enumerate(ids) if not 0 <= b < self.n_buffers), None)
        if bad is not None:
            tensors = graph.nodes if what == "node" else graph.leafs
            raise BufferIdError(f"{what} {bad} ({tensors[bad].name!r}) has buffer id {ids[bad]}, but the allocator "
                                f"has {self.n_buffers} buffers (ids 0..{self.n_buffers - 1})")
        return ids

    def _replan(self, graph: Graph, node_ids, leaf_ids) -> None:
        node_ids = self._check_ids(graph, node_ids, graph.n_nodes, "node")
        leaf_ids = self._check_ids(graph, leaf_ids, graph.n_leafs, "leaf")
        started = time.perf_counter()
        ggml_order_lower_bound = None
        if self.reorder:
            node_ids, ggml_order_lower_bound = self._reorder(graph, node_ids, leaf_ids)
        run = self._pass(graph.leafs, graph.nodes, node_ids, leaf_ids, self.inplace_ops)
        plan = _make_plan(run, max(graph.n_nodes, 1), self.planner, REORDER_SEARCH_S if self.reorder else None)
        plan.ggml_order_lower_bound = plan.lower_bound if ggml_order_lower_bound is None else ggml_order_lower_bound
        record = _Record(graph, run.placed, self.inplace_ops)
        plan.time_s = time.perf_counter() - started
        if self.debug:
            plan.verify()
        self._plan, self._record = plan, record

    def _pass(self, leafs, nodes, node_ids, leaf_ids, inplace_ops) -> _PlanningPass:
        allocators = {g: offsets.DynAllocator(self.bufts[g].alignment, self.bufts[g].max_size)
                      for g in sorted(set(self._groups))}
        run = _PlanningPass(self.bufts, self._groups, allocators, inplace_ops)
        run.run(leafs, nodes, node_ids, leaf_ids)
        return run

    def _reorder(self, graph: Graph, node_ids, leaf_ids) -> tuple[list[int] | None, int]:
        """Permute graph.nodes into the candidate order of lowest LOAD (the original one on ties) and
        return the node ids in the new order and ggml's LOAD for the original order."""
        n_steps = max(graph.n_nodes, 1)

        def load(nodes, ids, inplace_ops) -> int:
            return _make_plan(self._pass(graph.leafs, nodes, ids, leaf_ids, inplace_ops), n_steps, "ggml").lower_bound

        buft_of = {id(t): self.bufts[node_ids[i] if node_ids else 0] for i, t in enumerate(graph.nodes)}
        orders = schedule.candidate_orders(graph.nodes, lambda t: buft_of.get(id(t), self.bufts[0]).alloc_size(t),
                                           self.inplace_ops)
        ggml_load = load(graph.nodes, node_ids, INPLACE_OPS)
        best_order, best_load = None, None
        for order in orders:
            nodes = [graph.nodes[i] for i in order]
            ids = None if node_ids is None else [node_ids[i] for i in order]
            candidate = load(nodes, ids, self.inplace_ops)
            if best_load is None or candidate < best_load:
                best_order, best_load = order, candidate
        graph.nodes[:] = [graph.nodes[i] for i in best_order]
        return (None if node_ids is None else [node_ids[i] for i in best_order]), ggml_load

    def _realloc(self, no_alloc: bool) -> bool:
        """Grow the buffers whose planned chunks no longer fit (a re-allocation re-creates every chunk)."""
        ok = True
        for i in sorted(set(self._groups)):
            new = self._plan.buffers[i].chunk_sizes
            current = self._buffers[i]
            if current is not None and all(size <= current.chunk_size(c) for c, size in enumerate(new)):
                continue
            if current is not None:
                log.debug("reallocating %s buffer from %d to %d bytes", self.bufts[i].name, current.size, sum(new))
                current.free()
            self._buffers[i] = None
            if no_alloc:
                continue
            try:
                self._buffers[i] = VirtualBuffer(self.bufts[i], new)
            except (AllocationError, MemoryError) as e:
                log.error("failed to allocate %s buffer of size %d: %s", self.bufts[i].name, sum(new), e)
                ok = False  # the others are still grown, so that a retry only has the missing ones to make
        for i, g in enumerate(self._groups):
            self._buffers[i] = self._buffers[g]
        return ok

    # ----- alloc_graph ----------------------------------------------------------------------------

    def needs_realloc(self, graph: Graph) -> str | None:
        """Why the latest plan cannot be reused for this graph, or None when it can.

        ggml's needs_realloc (node and leaf counts, every tensor fits its planned memory) plus the topology
        fingerprint; alloc_graph re-plans (one buffer) or returns False (several) when this is not None.
        """
        rec = self._record
        if rec is None:
            return "nothing was reserved yet"
        if graph.n_nodes != len(rec.nodes) or graph.n_leafs != len(rec.leafs):
            return (f"the graph has {graph.n_nodes} nodes and {graph.n_leafs} leafs, the plan "
                    f"{len(rec.nodes)} and {len(rec.leafs)}")
        fitting: dict[int, TensorAlloc | None] = {}  # id(tensor) -> the record it was found to fit
        for i, leaf in enumerate(graph.leafs):  # ggml checks leafs only as sources; a leaf may be an output
            if not self._fits(leaf, rec.leafs[i], fitting):
                return f"leaf {i} ({leaf.name!r}) does not fit its planned memory"
        for i, node in enumerate(graph.nodes):
            dst, srcs = rec.nodes[i]
            if not self._fits(node, dst, fitting):
                return f"node {i} ({node.name!r}) does not fit its planned memory"
            for j, src in enumerate(node.src):
                if src is not None and not self._fits(src, srcs[j] if j < len(srcs) else None, fitting):
                    return f"source {j} ({src.name!r}) of node {i} ({node.name!r}) does not fit its planned memory"
        if fingerprint(graph) != rec.fingerprint:
            return "the graph's topology (edges, ops, flags or views) differs from the planned one"
        return None

    def _fits(self, t: Tensor, ta: TensorAlloc | None, fitting: dict[int, TensorAlloc | None]) -> bool:
        """Whether t fits its record; a tensor is sized once per record (a node is checked again as every
        consumer's source, with the same record)."""
        if t.data is not None or t.view_src is not None:
            return True
        if ta is None:
            return t.buffer is not None
        if fitting.get(id(t)) is ta:
            return True
        if ta[3] < self.bufts[ta[0]].alloc_size(t):
            return False
        fitting[id(t)] = ta
        return True

    def alloc_graph(self, graph: Graph) -> bool:
        """Give every tensor of the graph its planned memory, re-planning first if needed (one buffer only).

        Returns False when a re-plan is needed with several buffers (call reserve_n) or allocation failed.
        """
        reason = self.needs_realloc(graph)
        if reason is not None:
            if self.n_buffers > 1:
                log.debug("cannot re-plan a graph with %d buffers automatically (%s); call reserve_n",
                          self.n_buffers, reason)
                return False
            log.debug("re-planning automatically: %s", reason)
            if not self.reserve(graph):
                return False
        else:
            if any(b is None for b in self._buffers) and not self._realloc(no_alloc=False):
                return False
            self._rebind(graph)
        for g in sorted(set(self._groups)):
            self._buffers[g].reset()
        rec = self._record
        bound: list[tuple] = []  # (tensor, buffer, data) before this call
        try:
            for leaf, ta in zip(graph.leafs, rec.leafs, strict=True):
                self._init_tensor(leaf, ta, bound)
            for node, (dst, srcs) in zip(graph.nodes, rec.nodes, strict=True):
                # the record has every used slot: the fingerprint matched
                for src, ta in zip(node.src, srcs, strict=False):
                    if src is not None and (src.buffer is None or src.data is None):  # most were placed already
                        self._init_tensor(src, ta, bound)
                self._init_tensor(node, dst, bound)
        except BaseException:
            for t, buffer, data in bound:  # all or nothing: a failed call leaves no tensor half-placed
                t.buffer, t.data = buffer, data
            raise
        return True

    def _rebind(self, graph: Graph) -> None:
        """Note this graph as the plan's user; `plan` swaps the tensors it names only when asked for
        (a model step reuses the plan every token and never looks at it)."""
        self._record.bound_tensors = graph.leafs + graph.nodes

    def _init_tensor(self, t: Tensor, ta: TensorAlloc | None, bound: list[tuple]) -> None:
        if t.view_src is not None:
            if t.buffer is None and t.view_src.buffer is not None:
                bound.append((t, t.buffer, t.data))
                view_init(t)
        elif t.data is None and ta is not None:
            bound.append((t, t.buffer, t.data))
            self._buffers[ta[0]].tensor_alloc(t, ta[1], ta[2])

    # ----- sizes and cleanup ------------------------------------------------------------------------

    def get_buffer_size(self, buffer_id: int) -> int:
        """Bytes allocated for a buffer id; 0 before allocation and for ids sharing an earlier id's buffer."""
        if not 0 <= buffer_id < self.n_buffers:
            raise BufferIdError(f"buffer id {buffer_id} is outside 0..{self.n_buffers - 1}")
        buffer = self._buffers[buffer_id]
        if buffer is None or self._groups[buffer_id] != buffer_id:
            return 0
        return buffer.size

    def free(self) -> None:
        """Release every buffer (shared ones once) and forget the plan."""
        for g in sorted(set(self._groups)):
            if self._buffers[g] is not None:
                self._buffers[g].free()
        self._buffers = [None] * self.n_buffers
        self._plan = self._record = None
