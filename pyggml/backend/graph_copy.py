"""ggml_backend_graph_copy and ggml_backend_compare_graph_backend: run one graph on two backends.

graph_copy duplicates every tensor reachable from the nodes (same layout, op, op_params,
flags, name and sources), places the non-views in a new buffer of the target backend
(a multi-buffer when the buffer type's max_size splits them), copies their data, and
points the views at their copied roots. compare_graph_backend uses
it to check a backend against another, node by node or on chosen nodes.

Where ggml returns an all-NULL copy, graph_copy raises (GraphError for an unallocated
graph, AllocationError when the buffer cannot be made) and leaves nothing allocated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyggml.backend.base import Backend, Buffer
from pyggml.backend.multi_buffer import multi_buffer
from pyggml.backend.tensor_io import tensor_alloc, tensor_copy, view_init
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import VIEW_OPS, Tensor
from pyggml.errors import AllocationError, GraphError


@dataclass
class GraphCopy:
    """The copied graph, its buffer, and the contexts holding the copied tensors (views apart)."""

    buffer: Buffer
    ctx_allocated: Context
    ctx_unallocated: Context
    graph: Graph

    def free(self) -> None:
        self.buffer.free()


class _Copier:
    def __init__(self):
        self.copies: dict[int, Tensor] = {}
        self.initialised: set[int] = set()
        self.ctx_allocated = Context(no_alloc=True)
        self.ctx_unallocated = Context(no_alloc=True)

    def dup(self, src: Tensor) -> Tensor:
        """The copy of src (made once), with its view root and sources copied too."""
        if src.data is None:
            raise GraphError(f"graph_copy: graph must be allocated: tensor {src.name!r} has no data")
        if id(src) in self.copies:
            return self.copies[id(src)]
        view_src = self.dup(src.view_src) if src.view_src is not None else None
        dst = Tensor(src.type, src.ne, src.nb, op=src.op, view_src=view_src, view_offs=src.view_offs, name=src.name)
        dst.flags = src.flags
        dst.op_params = list(src.op_params)
        self.copies[id(src)] = dst  # before the sources: ggml_cast's node is its own src[1]
        for i, s in enumerate(src.src):
            if s is not None:
                dst.src[i] = self.dup(s)
        (self.ctx_unallocated if view_src is not None else self.ctx_allocated).add(dst)
        return dst

    def init(self, src: Tensor) -> None:
        """Copy src's data into its copy (or bind a view to its copied root), sources first."""
        if id(src) in self.initialised:
            return
        self.initialised.add(id(src))
        dst = self.copies[id(src)]
        if dst.view_src is not None:
            self.init(src.view_src)
            view_init(dst)
        else:
            tensor_copy(src, dst)
        for s in src.srcs:
            self.init(s)

    def allocate(self, backend: Backend) -> Buffer:
        """Place every non-view copy in buffers of the backend's default type, packed in order.

        As ggml_backend_alloc_ctx_tensors does, a new buffer starts when the next tensor would
        pass the type's max_size, and several buffers come back as one multi-buffer.
        """
        buft = backend.default_buffer_type
        chunks: list[list[tuple[Tensor, int]]] = [[]]
        chunk_sizes = [0]
        for t in self.ctx_allocated:
            size = -(-buft.alloc_size(t) // buft.alignment) * buft.alignment
            if chunks[-1] and chunk_sizes[-1] + size > buft.max_size:
                chunks.append([])
                chunk_sizes.append(0)
            chunks[-1].append((t, chunk_sizes[-1]))
            chunk_sizes[-1] += size
        buffers: list[Buffer] = []
        try:
            for chunk, chunk_size in zip(chunks, chunk_sizes, strict=True):
                buffer = buft.alloc_buffer(chunk_size)
                buffers.append(buffer)
                for t, offset in chunk:
                    tensor_alloc(buffer, t, (buffer.base or 0) + offset)
        except BaseException:
            for buffer in buffers:
                buffer.free()
            raise
        return buffers[0] if len(buffers) == 1 else multi_buffer(buffers)


def graph_copy(backend: Backend, graph: Graph) -> GraphCopy:
    """A copy of an allocated graph, with all its data, in a new buffer of `backend`."""
    copier = _Copier()
    for node in graph.nodes:
        copier.dup(node)
    buffer = copier.allocate(backend)
    try:
        for node in graph.nodes:
            copier.init(node)
    except BaseException:
        buffer.free()
        raise
    copy = Graph(size=max(graph.size, graph.n_nodes), order=graph.order)
    for node in graph.nodes:
        copy.add_node(copier.copies[id(node)])
    return GraphCopy(buffer, copier.ctx_allocated, copier.ctx_unallocated, copy)


def compare_graph_backend(backend1: Backend, backend2: Backend, graph: Graph,
                          callback: Callable[[int, Tensor, Tensor], bool | None],
                          test_nodes: list[Tensor] | None = None) -> bool:
    """Run `graph` on backend1 and a copy on backend2, handing callback(i, t1, t2) the node pairs.

    Without test_nodes every node runs alone on both backends and the callback sees each
    non-view node (returning False stops early); with test_nodes both graphs run whole and the
    callback sees only those nodes. False only when the copy could not be allocated.
    """
    try:
        copy = graph_copy(backend2, graph)
    except AllocationError:
        return False
    try:
        g1, g2 = graph, copy.graph
        if test_nodes:
            backend1.graph_compute(g1)
            backend2.graph_compute(g2)
            wanted = {id(t) for t in test_nodes}
            matched = [i for i, t1 in enumerate(g1.nodes) if id(t1) in wanted]
            if not matched:
                raise GraphError(f"compare_graph_backend: none of the {len(test_nodes)} test nodes is in the graph")
            for i in matched:
                callback(i, g1.nodes[i], g2.nodes[i])
        else:
            for i, (t1, t2) in enumerate(zip(g1.nodes, g2.nodes, strict=True)):
                backend1.graph_compute(g1.view(i, i + 1))
                backend2.graph_compute(g2.view(i, i + 1))
                if t1.op in VIEW_OPS:
                    continue
                if not callback(i, t1, t2):
                    break
    finally:
        copy.free()
    return True
