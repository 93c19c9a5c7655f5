"""test-backend-ops in miniature: build one op graph, fill its inputs, run the CPU kernels, measure NMSE.

An OpCase is a plain function from a Context to the output tensor, so the same cases can be replayed
on other backends (and on real ggml by the peer harness). Inputs the build left all-zero are filled
uniformly in [-1, 1] (raw random blocks for quantized types); inputs the build set itself (positions,
expert ids, masks) are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from pyggml.backend.cpu import kernels
from pyggml.core import ops
from pyggml.core import types as T
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import Op, Tensor, host_ndarray

DEFAULT_NMSE = 1e-7


@dataclass(frozen=True)
class OpCase:
    name: str
    build: Callable[[Context], Tensor]
    tol: float = DEFAULT_NMSE
    reference: Callable[[Tensor], np.ndarray] | None = None  # float64 expected values from out's srcs


def nmse(expected, actual) -> float:
    """ggml's error: sum((a - b)^2) / sum(a^2), with a the reference."""
    a = np.asarray(expected, dtype=np.float64)
    b = np.asarray(actual, dtype=np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(a ** 2), np.finfo(np.float64).tiny))


def values(t: Tensor) -> np.ndarray:
    """A tensor's values as float64 in ggml's reversed shape (dequantized for block types)."""
    v = host_ndarray(t)
    if t.type in (T.GGMLType.I32, T.GGMLType.I16, T.GGMLType.I8, T.GGMLType.I64):
        return v.astype(np.float64)
    return T.to_float(t.type, v).reshape(tuple(reversed(t.ne))).astype(np.float64)


def fill_random(t: Tensor, rng: np.random.Generator) -> None:
    """Uniform [-1, 1] values; for quant types random blocks with bit 6 of every byte cleared (finite f16 scales)."""
    dst = host_ndarray(t)
    if T.is_quantized(t.type):
        dst[...] = rng.integers(0, 256, size=dst.shape, dtype=np.uint8) & 0xBF
    else:
        dst[...] = T.encode(t.type, rng.uniform(-1, 1, size=dst.shape).astype(np.float32))


def _inputs(graph: Graph) -> list[Tensor]:
    return [t for t in graph.leafs if t.op == Op.NONE and t.view_src is None]


def prepare(case: OpCase, seed: int = 0) -> tuple[Tensor, Graph]:
    """Build the case in an allocating context and fill untouched inputs: the state before any kernel
    runs (the ggml peer harness replays it on real ggml)."""
    ctx = Context(no_alloc=False)
    out = case.build(ctx)
    graph = Graph().build_forward_expand(out)
    rng = np.random.default_rng(seed)
    for t in _inputs(graph):
        floating = T.is_quantized(t.type) or t.type in (T.GGMLType.F32, T.GGMLType.F16, T.GGMLType.BF16)
        if floating and not host_ndarray(t).any():
                fill_random(t, rng)
    return out, graph


def run(case: OpCase, seed: int = 0) -> Tensor:
    """Prepare the case, then compute every node on the CPU."""
    out, graph = prepare(case, seed)
    return compute(out, graph)


def compute(out: Tensor, graph: Graph | None = None) -> Tensor:
    """Run every node of out's graph (built here unless given) with the CPU kernels; returns out."""
    for node in (graph or Graph().build_forward_expand(out)).nodes:
        kernels.compute(node)
    return out


def check(case: OpCase, seed: int = 0) -> float:
    """Run the case and return its NMSE against case.reference (asserting no NaN, matching infinities)."""
    out = run(case, seed)
    expected = np.asarray(case.reference(out), dtype=np.float64)
    actual = values(out)
    assert actual.shape == expected.shape, f"{case.name}: shape {actual.shape} != expected {expected.shape}"
    assert not np.isnan(actual).any(), f"{case.name}: NaN in the output"
    inf = np.isinf(expected)
    assert np.array_equal(inf, np.isinf(actual)) and np.array_equal(expected[inf], actual[inf]), \
        f"{case.name}: infinities differ"
    err = nmse(expected[~inf], actual[~inf])
    assert err <= case.tol, f"{case.name}: NMSE {err:.3g} > {case.tol:g}"
    return err


LAYOUTS = ("cont", "perm", "pad")
ROW_LAYOUTS = ("cont", "pad")  # elements packed within rows: what most of ggml's CPU kernels require of src0


def new_input(ctx: Context, type_, ne, layout: str = "cont", name: str = "x") -> Tensor:
    """An input tensor of shape ne whose memory is laid out as asked: "cont" (contiguous), "perm" (dims 0 and 1
    swapped in memory: strided rows) or "pad" (contiguous rows with a gap after each: a strided view)."""
    ne = list(ne) + [1] * (4 - len(ne))
    if layout == "cont":
        return ctx.new_tensor(type_, ne, name=name)
    if layout == "perm":
        base = ctx.new_tensor(type_, [ne[1], ne[0], *ne[2:]], name=f"{name}_base")
        return ops.permute(ctx, base, 1, 0, 2, 3)
    if layout == "pad":
        gap = T.blck_size(type_)
        base = ctx.new_tensor(type_, [ne[0] + gap, *ne[1:]], name=f"{name}_base")
        return ops.view_4d(ctx, base, *ne, base.nb[1], base.nb[2], base.nb[3], T.type_size(type_))
    raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")


def stored_as(t: Tensor, x: np.ndarray) -> np.ndarray:
    """Exact values x rounded the way storing them into t's type rounds them (F16, BF16, ints); float64 out."""
    x = np.asarray(x, dtype=np.float64)
    if t.type == T.GGMLType.F32:
        return x.astype(np.float32).astype(np.float64)
    if t.type in (T.GGMLType.F16, T.GGMLType.BF16):
        return T.to_float(t.type, T.from_float(t.type, x.astype(np.float32))).astype(np.float64)
    return x
