"""ggml-graph-json/1: real ggml graphs (and where ggml placed them) as JSON.

The format is described in tests/data/graphs/FORMAT.md. Loading rebuilds every tensor
from its recorded type, ne, nb, op, op_params, srcs and view, so the graph has
ggml's node and leaf order exactly; no op function is re-run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pyggml.core import types as T
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import MAX_OP_PARAMS, Op, Tensor, TensorFlag, UnaryOp, GluOp
from pyggml.errors import GraphError

FORMAT = "ggml-graph-json/1"
_PLACEMENT_KEYS = ("preallocated", "alloc_size", "buffer_id", "offset")


@dataclass
class Expected:
    """What ggml chose for this graph: compute buffer size and per-tensor (buffer_id, offset)."""

    compute_buffer_size: int | None
    alignment: int
    placement: dict[str, tuple[int, int] | None]  # id -> (buffer_id, offset); None when not placed
    alloc_size: dict[str, int]


@dataclass
class LoadedGraph:
    graph: Graph
    tensors: dict[str, Tensor]
    context: Context  # every tensor of the file (no_alloc)
    preallocated: Context  # the non-view tensors ggml had outside the compute buffer (weights, KV cache)
    expected: Expected | None
    doc: dict = field(repr=False)

    @property
    def name(self) -> str:
        return self.doc.get("graph_name", "graph")

    def ids(self) -> dict[int, str]:
        """id(tensor) -> file id, for mapping plans back to the file."""
        return {id(t): k for k, t in self.tensors.items()}

    def random_values(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Values for every tensor that needs data before compute: the preallocated tensors and the inputs.

        Floats are uniform (inputs and vectors in [-0.5, 0.5), matrices in ±1/sqrt(ne0); masks causal, 0 / -inf);
        I32 tensors get valid indices for what consumes them (rows of a GET_ROWS source, positions otherwise).
        Keys are file ids; arrays are shaped like `Tensor.numpy()`.
        """
        rng = np.random.default_rng(seed)
        consumers: dict[int, list[Tensor]] = {}
        for node in self.graph.nodes:
            for s in node.srcs:
                consumers.setdefault(id(s), []).append(node)
        wanted = [t for t in self.preallocated] + [t for t in self.tensors.values()
                                                  if t.is_input and t.view_src is None]
        out = {}
        for tid, t in self.tensors.items():
            if not any(t is w for w in wanted):
                continue
            shape = tuple(reversed(t.ne[:t.n_dims]))
            if t.type == T.GGMLType.I32:
                rows = [c.src[0].ne[1] for c in consumers.get(id(t), []) if c.op == Op.GET_ROWS and c.src[1] is t]
                out[tid] = rng.integers(0, min(rows) if rows else max(t.nelements, 1), shape, dtype=np.int32)
            elif "mask" in t.name.lower():  # causal over the last two dims (a single row sees everything)
                rows, cols = t.ne[1], t.ne[0]
                out[tid] = np.triu(np.full((rows, cols), -np.inf, np.float32), 1 + cols - rows).reshape(shape)
            else:  # matrices scaled by 1/sqrt(fan-in) so that deep stacks neither explode nor vanish
                scale = 1.0 / np.sqrt(t.ne[0]) if t.n_dims >= 2 and not t.is_input else 0.5
                values = rng.random(shape, dtype=np.float32)  # float32 draws: a 1 GB graph's weights in 1 s, not 7
                values *= 2 * scale
                values -= scale
                out[tid] = values.astype(T.numpy_dtype(t.type), copy=False)
        return out

    def to_json(self) -> dict:
        """The document again, rebuilt from the tensors (placement fields as recorded)."""
        skip = ("leafs", "nodes", "n_leafs", "n_nodes", "format", "graph_name", "name")
        extra = {k: v for k, v in self.doc.items() if k not in skip}
        out = graph_to_json(self.graph, self.name, **extra)
        recorded = {e["id"]: e for e in self.doc["leafs"] + self.doc["nodes"]}
        for e in out["leafs"] + out["nodes"]:
            for k in _PLACEMENT_KEYS:
                if k in recorded[e["id"]]:
                    e[k] = recorded[e["id"]][k]
        return out


def _op_of(entry: dict) -> tuple[Op, list[int]]:
    try:
        return Op[entry["op"]], entry.get("op_params") or [0] * MAX_OP_PARAMS
    except KeyError:
        raise GraphError(f"tensor {entry.get('id')}: unknown op {entry.get('op')!r}") from None


def load_graph_json(path) -> LoadedGraph:
    """Read a ggml-graph-json/1 file into a Graph with ggml's order, shapes, strides, flags, views and op params."""
    doc = json.loads(Path(path).read_text())
    if doc.get("format") != FORMAT:
        raise GraphError(f"{path}: format {doc.get('format')!r}, expected {FORMAT!r}")
    entries = doc["leafs"] + doc["nodes"]
    by_id = {e["id"]: e for e in entries}
    tensors: dict[str, Tensor] = {}
    ctx, pre = Context(no_alloc=True), Context(no_alloc=True)

    def build(tid: str) -> Tensor:
        if tid in tensors:
            return tensors[tid]
        if tid not in by_id:
            raise GraphError(f"{path}: reference to unknown tensor id {tid!r}")
        e = by_id[tid]
        view_src = build(e["view_src"]) if e.get("view_src") else None
        op, params = _op_of(e)
        t = Tensor(e["type"], e["ne"], e["nb"], op=op, view_src=view_src, view_offs=e.get("view_offs", 0),
                   name=e.get("name", ""))
        if len(params) != MAX_OP_PARAMS:
            raise GraphError(f"tensor {tid}: {len(params)} op_params words, expected {MAX_OP_PARAMS}")
        t.op_params = [int(w) for w in params]
        t.flags = TensorFlag(e.get("flags", 0))
        tensors[tid] = t
        ctx.add(t)
        if e.get("preallocated") and view_src is None:
            pre.add(t)
        return t

    for e in entries:
        build(e["id"])
    for e in entries:
        t = tensors[e["id"]]
        for slot, sid in enumerate(e.get("srcs", [])):
            t.src[slot] = None if sid is None else build(sid)
    graph = Graph(size=max(len(doc["nodes"]), len(doc["leafs"]), 1))
    graph.leafs = [tensors[e["id"]] for e in doc["leafs"]]
    graph.nodes = [tensors[e["id"]] for e in doc["nodes"]]
    graph._visited = {id(t) for t in graph.leafs + graph.nodes}
    return LoadedGraph(graph, tensors, ctx, pre, _expected(doc), doc)


def _expected(doc: dict) -> Expected | None:
    entries = doc["leafs"] + doc["nodes"]
    if "compute_buffer_size" not in doc and not any("offset" in e for e in entries):
        return None
    placement = {
        e["id"]: (e["buffer_id"], e["offset"]) if e.get("buffer_id") is not None else None for e in entries
    }
    return Expected(doc.get("compute_buffer_size"), doc.get("alignment", 32), placement,
                    {e["id"]: e["alloc_size"] for e in entries if "alloc_size" in e})


def tensor_entry(t: Tensor, tid: str, ids: dict[int, str]) -> dict:
    e = {"id": tid, "name": t.name, "op": t.op.name}
    if t.op == Op.UNARY:
        e["unary_op"] = UnaryOp(t.op_params[0]).name
    if t.op == Op.GLU:
        e["glu_op"] = GluOp(t.op_params[0]).name
    srcs = list(t.src)
    while srcs and srcs[-1] is None:
        srcs.pop()
    e.update({
        "type": int(t.type), "type_name": T.type_name(t.type), "ne": list(t.ne), "nb": list(t.nb),
        "flags": int(t.flags), "srcs": [None if s is None else _ref(s, ids) for s in srcs],
        "view_src": None if t.view_src is None else _ref(t.view_src, ids), "view_offs": t.view_offs,
        "op_params": list(t.op_params),
    })
    owner = t.memory_owner()
    e["preallocated"] = t.data is not None and t.view_src is None
    if t.data is not None and owner is not None and t.view_src is None:
        e["buffer_id"], e["offset"] = 0, t.data - owner.base
    else:
        e["buffer_id"], e["offset"] = None, None
    return e


def _ref(t: Tensor, ids: dict[int, str]) -> str:
    try:
        return ids[id(t)]
    except KeyError:
        raise GraphError(f"tensor {t.name!r} is referenced but is neither a node nor a leaf of the graph") from None


def graph_to_json(graph: Graph, name: str = "graph", **top_level) -> dict:
    """A ggml-graph-json/1 document. Placement fields describe the tensors' current memory, if any."""
    ids = {id(t): f"L{i}" for i, t in enumerate(graph.leafs)}
    ids.update({id(t): f"N{i}" for i, t in enumerate(graph.nodes)})
    doc = {"format": FORMAT, "graph_name": name}
    doc.update(top_level)
    doc["name"] = name
    doc["n_leafs"], doc["n_nodes"] = graph.n_leafs, graph.n_nodes
    doc["leafs"] = [tensor_entry(t, f"L{i}", ids) for i, t in enumerate(graph.leafs)]
    doc["nodes"] = [tensor_entry(t, f"N{i}", ids) for i, t in enumerate(graph.nodes)]
    return doc


def save_graph_json(graph: Graph, path, name: str = "graph", **top_level) -> None:
    Path(path).write_text(json.dumps(graph_to_json(graph, name, **top_level)))
