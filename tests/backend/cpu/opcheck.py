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


def run(case: OpCase, seed: int = 0) -> Tensor:
    """Build the case in an allocating context, fill untouched inputs, compute every node on the CPU."""
    ctx = Context(no_alloc=False)
    out = case.build(ctx)
    graph = Graph().build_forward_expand(out)
    rng = np.random.default_rng(seed)
    for t in _inputs(graph):
        if T.is_quantized(t.type) or t.type in (T.GGMLType.F32, T.GGMLType.F16, T.GGMLType.BF16):
            if not host_ndarray(t).any():
                fill_random(t, rng)
    for node in graph.nodes:
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
