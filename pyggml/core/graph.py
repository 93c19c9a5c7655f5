"""Graph: ggml_cgraph — nodes in execution order and leafs, built by post-order DFS."""

from __future__ import annotations

import functools
from enum import IntEnum

from pyggml.core.tensor import Op, Tensor, TensorFlag
from pyggml.errors import GraphError, GraphSizeError

DEFAULT_GRAPH_SIZE = 2048


def reachable_tensors(roots) -> list[Tensor]:
    """The roots and every tensor they reach through src or view_src, each once (order unspecified)."""
    seen: dict[int, Tensor] = {}
    todo = list(roots)
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen[id(t)] = t
        todo.extend(t.srcs)
        if t.view_src is not None:
            todo.append(t.view_src)
    return list(seen.values())


_PARAM = int(TensorFlag.PARAM)
_COMPUTE = int(TensorFlag.COMPUTE)


@functools.cache
def _with_compute(flags: int) -> TensorFlag:
    return TensorFlag(flags) | TensorFlag.COMPUTE


def _mark_compute(t: Tensor) -> None:
    """Flag COMPUTE on an op's result (int tests and a cached result: IntFlag arithmetic costs microseconds)."""
    if t.op != Op.NONE and not int(t.flags) & _COMPUTE:
        t.flags = _with_compute(int(t.flags))


class EvalOrder(IntEnum):
    LEFT_TO_RIGHT = 0
    RIGHT_TO_LEFT = 1


class Graph:
    """Nodes (computed tensors, in the order ggml runs them) and leafs (op NONE, not PARAM).

    `size` bounds both lists as in ggml; going past it raises GraphSizeError instead of aborting.
    """

    def __init__(self, size: int = DEFAULT_GRAPH_SIZE, order: EvalOrder = EvalOrder.LEFT_TO_RIGHT):
        if size < 0:
            raise GraphError(f"graph size must be >= 0, got {size}")
        self.size = size
        self.order = EvalOrder(order)
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self._visited: set[int] = set()

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)

    def node(self, i: int) -> Tensor:
        """ggml_graph_node: negative i counts from the end."""
        return self.nodes[i]

    def __repr__(self) -> str:
        return f"Graph({self.n_nodes} nodes, {self.n_leafs} leafs, size {self.size})"

    def build_forward_expand(self, tensor: Tensor) -> Graph:
        """Add tensor and everything it depends on, post-order (src[0] first), like ggml_build_forward_expand."""
        n_old = self.n_nodes
        self._visit(tensor)
        if self.n_nodes > n_old and self.nodes[-1] is not tensor:
            raise GraphError(f"internal: the last added node must be {tensor.name!r}")
        return self

    def _slots(self, t: Tensor) -> list[Tensor]:
        """t's sources in visiting order (src[0] first, or last for RIGHT_TO_LEFT)."""
        srcs = [s for s in t.src if s is not None]
        if self.order == EvalOrder.RIGHT_TO_LEFT:
            srcs.reverse()
        return srcs

    def _visit(self, root: Tensor) -> None:
        """Iterative DFS (graphs can be deeper than Python's recursion limit). A stack entry is
        (tensor, its sources or None before the first visit, index of the next source); a source
        visited before only has its COMPUTE flags refreshed, without a trip through the stack."""
        visited = self._visited
        _mark_compute(root)
        if id(root) in visited:
            self._refresh_compute(root)
            return
        stack: list[tuple[Tensor, list | None, int]] = [(root, None, 0)]
        while stack:
            t, srcs, i = stack.pop()
            if srcs is None:
                visited.add(id(t))
                srcs = self._slots(t)
            while i < len(srcs):
                src = srcs[i]
                i += 1
                _mark_compute(src)
                if id(src) in visited:
                    self._refresh_compute(src)
                else:
                    stack.append((t, srcs, i))
                    stack.append((src, None, 0))
                    break
            else:
                self._append(t)

    def _refresh_compute(self, t: Tensor) -> None:
        """A visited tensor's sources still get the COMPUTE flag if they lack it (ggml does the same)."""
        todo = [s for s in t.srcs if not int(s.flags) & _COMPUTE]
        while todo:
            s = todo.pop()
            if s.op != Op.NONE and not int(s.flags) & _COMPUTE:
                _mark_compute(s)
                todo.extend(x for x in s.srcs if not int(x.flags) & _COMPUTE)

    def _append(self, t: Tensor) -> None:
        if t.op == Op.NONE and not int(t.flags) & _PARAM:
            if len(self.leafs) >= self.size:
                raise GraphSizeError(f"graph is full: {self.size} leafs; create the Graph with a larger size")
            if not t.name:
                t.set_name(f"leaf_{len(self.leafs)}")
            self.leafs.append(t)
        else:
            if len(self.nodes) >= self.size:
                raise GraphSizeError(f"graph is full: {self.size} nodes; create the Graph with a larger size")
            if not t.name:
                t.set_name(f"node_{len(self.nodes)}")
            self.nodes.append(t)

    def add_node(self, t: Tensor) -> None:
        """ggml_graph_add_node: append without visiting sources."""
        if self.n_nodes >= self.size:
            raise GraphSizeError(f"graph is full: {self.size} nodes")
        self._visited.add(id(t))
        self.nodes.append(t)

    def view(self, i0: int, i1: int) -> Graph:
        """Nodes [i0, i1) and no leafs (ggml_graph_view). The node list is a copy; tensors are shared."""
        if not 0 <= i0 <= i1 <= self.n_nodes:
            raise GraphError(f"graph view [{i0}, {i1}) outside 0..{self.n_nodes}")
        g = Graph(size=0, order=self.order)
        g.size = i1 - i0
        g.nodes = self.nodes[i0:i1]
        return g
