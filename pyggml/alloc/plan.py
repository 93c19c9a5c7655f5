"""Plan: where a graph allocator put every tensor, for how long, and why — in a form you can check and draw.

A plan is the result of one `GraphAllocator.reserve*` call. Each placed tensor has a buffer id, a chunk
(one backend buffer of that buffer id's virtual buffer), an offset inside the chunk, its padded size and
its lifetime in node steps (first and last step, both inclusive). A tensor that took over its parent's
bytes in place names that parent; it is the only case in which two tensors alive at the same step may
share bytes. Buffer ids that share one allocator (the same buffer type given twice) share memory, so
`verify` checks them together and `buffer_sizes` reports the shared memory under the first id only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pyggml.backend.base import Backend, BufferUsage
from pyggml.backend.tensor_io import tensor_memset
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.errors import AllocationError

POISON = 0xFF  # every float made of these bytes is a NaN


class TensorPlan(NamedTuple):
    """One placed tensor; `inplace_parent` is the tensor whose bytes it took over, if any."""

    tensor: Tensor
    buffer_id: int
    chunk: int
    offset: int
    size: int
    first: int
    last: int
    inplace_parent: Tensor | None


class BufferPlan(NamedTuple):
    """One buffer id: its chunk sizes under the chosen planner and the numbers to judge them by.

    `shared_with` is the first buffer id with the same buffer type (itself when not shared); a shared
    later id reports no chunks and size 0 because its memory is counted under the first id.
    """

    chunk_sizes: list[int]
    lower_bound: int
    ggml_size: int
    planner: str
    shared_with: int

    @property
    def size(self) -> int:
        return sum(self.chunk_sizes)


class Plan:
    """Placements and lifetimes of one planned graph (see the module docstring)."""

    def __init__(self, tensors: list[TensorPlan], buffers: list[BufferPlan], n_steps: int, planner: str):
        self.tensors = tensors
        self.buffers = buffers
        self.n_steps = n_steps
        self.planner = planner
        self.time_s = 0.0  # how long planning took (set by the graph allocator)
        self.ggml_order_lower_bound = 0  # LOAD of ggml's node order and in-place rules (set by the graph allocator)
        self._by_tensor = {id(p.tensor): p for p in tensors}

    def __repr__(self) -> str:
        return (f"Plan({len(self.tensors)} tensors, {self.n_steps} steps, planner {self.planner!r}, "
                f"sizes {self.buffer_sizes}, lower bound {self.lower_bound}, ggml {self.ggml_size})")

    def placement(self, t: Tensor) -> tuple[int, int, int] | None:
        """(buffer_id, chunk, offset) of a tensor the allocator placed; None for views, preallocated or unknown."""
        p = self._by_tensor.get(id(t))
        return None if p is None else (p.buffer_id, p.chunk, p.offset)

    def get(self, t: Tensor) -> TensorPlan | None:
        return self._by_tensor.get(id(t))

    def rebound(self, tensors: dict[int, Tensor]) -> Plan:
        """The same plan for another graph of the same topology: tensors swapped by id (`{id(old): new}`)."""
        def swap(t: Tensor | None) -> Tensor | None:
            return None if t is None else tensors.get(id(t), t)

        placed = [p._replace(tensor=swap(p.tensor), inplace_parent=swap(p.inplace_parent)) for p in self.tensors]
        plan = Plan(placed, self.buffers, self.n_steps, self.planner)
        plan.time_s, plan.ggml_order_lower_bound = self.time_s, self.ggml_order_lower_bound
        return plan

    @property
    def buffer_sizes(self) -> list[int]:
        return [b.size for b in self.buffers]

    @property
    def chunk_sizes(self) -> list[list[int]]:
        return [b.chunk_sizes for b in self.buffers]

    @property
    def size(self) -> int:
        return sum(self.buffer_sizes)

    @property
    def lower_bound(self) -> int:
        """Peak of simultaneously live padded bytes, summed over the buffers (in-place handoffs counted once)."""
        return sum(b.lower_bound for b in self.buffers)

    @property
    def ggml_size(self) -> int:
        """What ggml's own planner takes for the same graph and buffer ids."""
        return sum(b.ggml_size for b in self.buffers)

    # ----- verification ---------------------------------------------------------------------------

    def verify(self) -> None:
        """Raise AllocationError unless every tensor fits its chunk and no two live tensors share bytes.

        Two tensors alive at a common step may overlap only when one was handed to the other in place.
        """
        groups: dict[tuple[int, int], list[TensorPlan]] = {}
        for p in self.tensors:
            shared = self.buffers[p.buffer_id].shared_with
            chunks = self.buffers[shared].chunk_sizes
            if p.chunk >= len(chunks) or p.offset < 0 or p.offset + p.size > chunks[p.chunk]:
                have = chunks[p.chunk] if p.chunk < len(chunks) else "no such chunk"
                raise AllocationError(f"tensor {p.tensor.name!r} at buffer {p.buffer_id} chunk {p.chunk} offset "
                                      f"{p.offset} with {p.size} bytes does not fit its chunk (size {have})")
            groups.setdefault((shared, p.chunk), []).append(p)
        for (buffer_id, chunk), members in groups.items():
            self._verify_chunk(buffer_id, chunk, members)

    @staticmethod
    def _verify_chunk(buffer_id: int, chunk: int, members: list[TensorPlan]) -> None:
        n = len(members)
        first = np.fromiter((p.first for p in members), np.int64, n)
        last = np.fromiter((p.last for p in members), np.int64, n)
        lo = np.fromiter((p.offset for p in members), np.int64, n)
        hi = lo + np.fromiter((p.size for p in members), np.int64, n)
        index = {id(p.tensor): i for i, p in enumerate(members)}
        parent = np.fromiter((index.get(id(p.inplace_parent), -1) for p in members), np.int64, n)
        block = 512
        for start in range(0, n, block):
            rows = slice(start, min(n, start + block))
            r = np.arange(rows.start, rows.stop)[:, None]
            clash = ((first[rows, None] <= last) & (first <= last[rows, None])
                     & (lo[rows, None] < hi) & (lo < hi[rows, None]) & (r < np.arange(n)))
            clash &= (parent[rows, None] != np.arange(n)) & (parent != r)
            if clash.any():
                i, j = np.argwhere(clash)[0]
                a, b = members[start + i], members[j]
                raise AllocationError(
                    f"tensors {a.tensor.name!r} (steps {a.first}..{a.last}, bytes [{a.offset}, {a.offset + a.size})) "
                    f"and {b.tensor.name!r} (steps {b.first}..{b.last}, bytes [{b.offset}, {b.offset + b.size})) "
                    f"are alive together and share bytes in buffer {buffer_id} chunk {chunk}")

    # ----- presentation ---------------------------------------------------------------------------

    def to_json(self) -> dict:
        """A JSON-ready description: buffers with their numbers, tensors with placement and lifetime."""
        return {
            "planner": self.planner,
            "n_steps": self.n_steps,
            "buffers": [{"buffer_id": i, "size": b.size, "chunk_sizes": list(b.chunk_sizes),
                         "lower_bound": b.lower_bound, "ggml_size": b.ggml_size, "planner": b.planner,
                         "shared_with": b.shared_with} for i, b in enumerate(self.buffers)],
            "tensors": [{"name": p.tensor.name, "buffer_id": p.buffer_id, "chunk": p.chunk, "offset": p.offset,
                         "size": p.size, "first": p.first, "last": p.last,
                         "inplace_parent": None if p.inplace_parent is None else p.inplace_parent.name}
                        for p in self.tensors],
        }

    def plot(self, path, buffer_id: int = 0, chunk: int = 0, title: str | None = None) -> None:
        """Draw one chunk's tensors as rectangles over (step, offset), with the lower bound as a line.

        Needs matplotlib (the `plot` extra); it is imported here so that planning never pays for it.
        """
        plot_plans(path, [(self, title)], buffer_id, chunk)

    def draw(self, ax, buffer_id: int = 0, chunk: int = 0, title: str | None = None) -> float:
        """Draw one chunk of this plan on a matplotlib Axes (see `plot`); returns the top of its offset axis."""
        from matplotlib.collections import PatchCollection
        from matplotlib.patches import Rectangle

        shared = self.buffers[buffer_id].shared_with
        members = [p for p in self.tensors if self.buffers[p.buffer_id].shared_with == shared and p.chunk == chunk]
        fresh, inplace = "tab:blue", "tab:red"
        drawn = [p for p in members if p.size]
        ax.add_collection(PatchCollection(
            [Rectangle((p.first, p.offset), p.last - p.first + 1, p.size) for p in drawn],
            facecolors=[fresh if p.inplace_parent is None else inplace for p in drawn],
            edgecolor="k", linewidth=0.2, alpha=0.8))
        ax.add_patch(Rectangle((0, 0), 0, 0, color=fresh, label="tensor (own bytes)"))
        ax.add_patch(Rectangle((0, 0), 0, 0, color=inplace, label="tensor (took over its parent's bytes)"))
        chunks = self.buffers[shared].chunk_sizes
        height = chunks[chunk] if chunk < len(chunks) else 0
        ax.axhline(height, color="k", label=f"chunk size {height:,}")
        ax.axhline(self.buffers[shared].lower_bound, color="g", linestyle="--",
                   label=f"lower bound {self.buffers[shared].lower_bound:,}")
        ax.set_xlim(0, max(self.n_steps, 1))
        top = max(height, self.buffers[shared].lower_bound, 1) * 1.05
        ax.set_ylim(0, top)
        ax.set_xlabel("step (node index)")
        ax.set_ylabel("offset (bytes)")
        ax.set_title(title or f"buffer {buffer_id} chunk {chunk}: planner {self.buffers[shared].planner}")
        ax.legend(loc="upper right", fontsize="small")
        return top


def plot_plans(path, plans: list[tuple[Plan, str | None]], buffer_id: int = 0, chunk: int = 0) -> None:
    """Draw plans side by side in one figure on a shared offset axis (e.g. ggml's order and a reordered one).

    Needs matplotlib (the `plot` extra); it is imported here so that planning never pays for it.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("Plan.plot needs matplotlib: pip install 'pyggml[plot]'") from e
    fig, axes = plt.subplots(1, len(plans), figsize=(12 * len(plans), 6), squeeze=False)
    top = max(plan.draw(ax, buffer_id, chunk, title) for ax, (plan, title) in zip(axes[0], plans, strict=False))
    for ax in axes[0]:
        ax.set_ylim(0, top)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def compute_poisoned(backend: Backend, galloc, graph: Graph) -> None:
    """Compute the graph node by node, filling each tensor's bytes with 0xFF (NaN) as soon as its lifetime
    ends, so that a plan which lets a tensor be overwritten while still needed shows up as wrong results.

    The graph must be the one `galloc` planned last and must be allocated (`galloc.alloc_graph(graph)`).
    Tensors handed over in place are left alone (their bytes now belong to the child), and so are
    tensors that live to the end (outputs and whatever ggml never frees).
    """
    plan = galloc.plan
    if plan is None:
        raise AllocationError("compute_poisoned: the graph allocator has no plan; reserve or alloc_graph first")
    stray = [n for n in graph.nodes if n.view_src is None and plan.get(n) is None and n.buffer is not None
             and n.buffer.usage == BufferUsage.COMPUTE]
    if stray:
        raise AllocationError(f"compute_poisoned: node {stray[0].name!r} lives in a compute buffer but not in the "
                              f"allocator's latest plan; plan this graph first")
    handed_over = {id(p.inplace_parent) for p in plan.tensors if p.inplace_parent is not None}
    dying: dict[int, list[Tensor]] = {}
    for p in plan.tensors:
        if p.last < plan.n_steps - 1 and id(p.tensor) not in handed_over:
            dying.setdefault(p.last, []).append(p.tensor)
    for i in range(graph.n_nodes):
        backend.graph_compute(graph.view(i, i + 1))
        for t in dying.get(i, ()):
            tensor_memset(t, POISON)
