"""`pyggml plan GRAPH.json`: plan a ggml-graph-json file's compute memory and compare with the lower bound and ggml.

Planning needs no memory: the preallocated tensors (weights, KV cache) are bound to an address-only buffer
type with the file's alignment, so the graph allocator leaves them alone exactly as ggml did.
"""

from __future__ import annotations

from pyggml.alloc import GraphAllocator, alloc_ctx_tensors_from_buft
from pyggml.alloc.plan import plot_plans
from pyggml.alloc.gallocr import PLANNERS
from pyggml.backend.base import Buffer, BufferType
from pyggml.core.graph_json import load_graph_json


class AddressOnlyBufferType(BufferType):
    """Buffers with addresses but no bytes behind them: enough to plan, never to compute."""

    def __init__(self, name: str, alignment: int):
        super().__init__()
        self.name = name
        self.alignment = alignment

    def _alloc_buffer(self, size: int) -> Buffer:
        return Buffer(self, size)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plan", help="plan a graph file's compute buffer and compare planners")
    p.add_argument("graph", help="a ggml-graph-json/1 file (see tests/data/graphs/FORMAT.md)")
    p.add_argument("--planner", choices=PLANNERS, default="best",
                   help="offset planner: ggml's own, or best (never worse than ggml's; --reorder adds a timed search)")
    p.add_argument("--reorder", action="store_true",
                   help="also let the planner choose the node order (memory-aware) and report both orders")
    p.add_argument("--plot", metavar="PNG", help="draw the plan (tensors over step and offset) to this file; "
                   "with --reorder, ggml's order and the chosen one side by side")
    p.set_defaults(run=run)


def _ratio(size: int, lower_bound: int) -> str:
    return f"{size / lower_bound:.4f}" if lower_bound else "n/a"


def run(args) -> int:
    lg = load_graph_json(args.graph)
    buft = AddressOnlyBufferType(lg.doc.get("buffer_type", "CPU"), lg.doc.get("alignment", 32))
    alloc_ctx_tensors_from_buft(lg.preallocated, buft)
    galloc = GraphAllocator(buft, planner=args.planner)
    galloc.reserve(lg.graph)
    plan = galloc.plan
    print(f"graph {lg.name}: {lg.graph.n_nodes} nodes, {lg.graph.n_leafs} leafs "
          f"(buffer type {buft.name}, alignment {buft.alignment})")
    for i, b in enumerate(plan.buffers):
        print(f"buffer {i}: {b.size:,} bytes in {len(b.chunk_sizes)} chunk(s) {b.chunk_sizes} "
              f"(planner {args.planner}, placement from {b.planner})")
    print(f"lower bound: {plan.lower_bound:,} bytes; size / lower bound = {_ratio(plan.size, plan.lower_bound)}")
    recorded = lg.expected.compute_buffer_size if lg.expected else None
    print(f"ggml's planner: {plan.ggml_size:,} bytes (ratio {_ratio(plan.ggml_size, plan.lower_bound)})"
          + (f"; recorded by ggml {lg.doc.get('ggml_version', '?')}: {recorded:,}" if recorded is not None else ""))
    print(f"planned in {plan.time_s * 1000:.1f} ms")
    plots = [(plan, f"{lg.name}: ggml's order, planner {args.planner}")]
    if args.reorder:
        reordering = GraphAllocator(buft, planner=args.planner, reorder=True)
        reordering.reserve(lg.graph)
        chosen = reordering.plan
        print(f"LOAD in ggml's order: {chosen.ggml_order_lower_bound:,} bytes; in the chosen order: "
              f"{chosen.lower_bound:,} bytes; reordered plan: {chosen.size:,} bytes "
              f"(ratio to ggml's LOAD {_ratio(chosen.size, chosen.ggml_order_lower_bound)}), "
              f"planned in {chosen.time_s * 1000:.1f} ms")
        plots.append((chosen, f"{lg.name}: chosen order, planner {args.planner}"))
    if args.plot:
        plot_plans(args.plot, plots)
        print(f"plot: {args.plot}")
    return 0
