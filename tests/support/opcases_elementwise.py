"""Op graphs for the element-wise family, with independent float64 NumPy references."""

from __future__ import annotations

import numpy as np
from tests.support.opcheck import LAYOUTS, ROW_LAYOUTS, OpCase, new_input, stored_as, values

from pyggml.core import ops
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType as G

SHAPES = [(16, 5, 3, 2), (7, 1, 1, 1), (32, 4)]
# Rounding error of quantizing uniform [-1, 1] data, as NMSE (ggml judges such results by "one quantum off").
QUANT_NMSE = {G.Q8_0: 5e-5, G.Q5_0: 2e-3, G.Q5_1: 2e-3, G.Q4_0: 1e-2, G.Q4_1: 1e-2, G.MXFP4: 5e-2,
              G.TQ1_0: 0.3, G.TQ2_0: 0.3}
BROADCASTS = [  # (a, b): b repeats into a, ggml style (each dim of b divides a's)
    ((16, 6, 4, 2), (16, 1, 1, 1)),
    ((16, 6, 4, 2), (4, 3, 2, 1)),
    ((16, 6, 4, 2), (1, 6, 1, 2)),
    ((12, 5, 3, 1), (12, 5, 3, 1)),
]
BINARY_TYPES = [(G.F32, G.F32, G.F32), (G.F16, G.F16, G.F16), (G.BF16, G.BF16, G.BF16), (G.BF16, G.F32, G.BF16),
                (G.BF16, G.F32, G.F32), (G.F16, G.F32, G.F16), (G.F16, G.F32, G.F32)]
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def retyped(ctx, t, type_):
    """t's node with another result type (ggml's builders keep a's type; add_cast and graph files need not)."""
    if type_ == t.type:
        return t
    out = ctx.new_tensor(type_, t.ne, name=f"{t.name}_{type_.name}")
    out.op, out.op_params, out.src = t.op, list(t.op_params), list(t.src)
    return out


def tiled(b: np.ndarray, shape) -> np.ndarray:
    """b repeated to shape: element i of each dim is b's element i % b.shape[dim]."""
    return np.tile(b, [n // m for n, m in zip(shape, b.shape, strict=False)])


def binary_case(op, ne_a, ne_b, types, layout_b="cont", layout_a="cont"):
    ta, tb, tdst = types

    def build(ctx):
        a = new_input(ctx, ta, ne_a, layout_a, "a")
        b = new_input(ctx, tb, ne_b, layout_b, "b")
        return retyped(ctx, getattr(ops, op)(ctx, a, b), tdst)

    def ref(out):
        a, b = values(out.src[0]), values(out.src[1])
        with np.errstate(divide="ignore"):
            return stored_as(out, BINARY[op](a, tiled(b, a.shape)))

    names = "_".join(t.name for t in types)
    return OpCase(f"{op}_{names}_{'x'.join(map(str, ne_a))}_by_{'x'.join(map(str, ne_b))}_{layout_a}_{layout_b}",
                  build, reference=ref)


def unary_like_case(name, build_op, ref_fn, type_=G.F32, ne=(16, 5, 3, 2), layout="cont", tol=1e-7):
    """One input x of type_ (values in [-1, 1]) through build_op(ctx, x); reference ref_fn(x as float64)."""
    def build(ctx):
        return build_op(ctx, new_input(ctx, type_, ne, layout, "x"))

    def ref(out):
        with np.errstate(divide="ignore"):
            return stored_as(out, ref_fn(values(out.src[0])))

    return OpCase(f"{name}_{type_.name}_{'x'.join(map(str, ne))}_{layout}", build, tol, ref)


def _add1(ctx, a):
    b = ctx.new_tensor(a.type if a.type != G.BF16 else G.F32, (1,), name="s")
    host_ndarray(b)[...] = np.asarray(0.625, dtype=host_ndarray(b).dtype)
    return ops.add1(ctx, a, b)


def quantized_add_case(op, type_, dst=None, ne=(256, 3, 2)):
    """ggml's add_q_f32 / add1_q_f32: dequantize, add F32, requantize into a's type (or add_cast to dst)."""
    dst = type_ if dst is None else dst

    def build(ctx):
        a = ctx.new_tensor(type_, ne, name="a")
        if op == "add1":
            return ops.add1(ctx, a, ctx.new_tensor(G.F32, (1,), name="s"))
        b = ctx.new_tensor(G.F32, ne, name="b")
        return ops.add(ctx, a, b) if dst == type_ else ops.add_cast(ctx, a, b, dst)

    def ref(out):
        a, b = values(out.src[0]), values(out.src[1])
        return a + (b.reshape(()) if op == "add1" else b)

    return OpCase(f"{op}_{type_.name}_F32_to_{dst.name}", build, QUANT_NMSE.get(dst, 1e-7), ref)


def _add_id_case(n_experts=5, ne=(8, 3, 4)):
    def build(ctx):
        a = ctx.new_tensor(G.F32, ne, name="a")
        b = ctx.new_tensor(G.F32, (ne[0], n_experts), name="bias")
        ids = ctx.new_tensor(G.I32, (ne[1], ne[2]), name="ids")
        host_ndarray(ids)[...] = np.arange(ne[1] * ne[2]).reshape(1, 1, ne[2], ne[1]) * 7 % n_experts
        return ops.add_id(ctx, a, b, ids)

    def ref(out):
        a, b, ids = values(out.src[0]), values(out.src[1]), host_ndarray(out.src[2])[0, 0]
        return a + b[0, 0][ids][None]

    return OpCase("add_id_F32", build, reference=ref)


def math_op(name, positive):
    """ops.<name> of x, or of x*x when the op wants positive inputs (sqrt, log)."""
    def build(ctx, x):
        return getattr(ops, name)(ctx, ops.sqr(ctx, x) if positive else x)
    return build


def layout_cases(layouts_a):
    """Binary ops, leaky_relu and sqr..cos with src0 laid out as in layouts_a (src1 in every layout)."""
    return [
        *(binary_case(op, (16, 6, 4, 2), ne_b, (G.F32, G.F32, G.F32), layout_b, layout_a)
          for op in BINARY for ne_b in [(16, 6, 4, 2), (8, 3, 2, 1)]
          for layout_a in layouts_a for layout_b in LAYOUTS),
        *(unary_like_case("leaky_relu", lambda ctx, x: ops.leaky_relu(ctx, x, 0.1),
                          lambda x: np.where(x > 0, x, 0.1 * x), t, layout=lay)
          for t in (G.F32, G.F16) for lay in layouts_a),
        *(unary_like_case(name, math_op(name, pos), fn, t, ne, lay)
          for name, fn, pos in [("sqr", np.square, False), ("sqrt", np.sqrt, True), ("log", np.log, True),
                                ("sin", np.sin, False), ("cos", np.cos, False)]
          for t in (G.F32, G.F16, G.BF16) for ne in SHAPES[:2] for lay in layouts_a),
    ]


CASES = [
    *(binary_case(op, ne_a, ne_b, types) for op in BINARY for ne_a, ne_b in BROADCASTS for types in BINARY_TYPES),
    *layout_cases(ROW_LAYOUTS),
    *(unary_like_case("add1", _add1, lambda x: x + 0.625, t, ne, lay) for t in (G.F32, G.F16, G.BF16)
      for ne in SHAPES for lay in ("cont", "pad")),
    _add_id_case(),
    *(quantized_add_case(op, t) for op in ("add", "add1") for t in (G.Q4_0, G.Q5_1, G.Q8_0)),
    *(quantized_add_case("add", t, dst) for t, dst in [(G.Q4_K, G.F32), (G.Q8_0, G.F32), (G.F16, G.F32),
                                                        (G.BF16, G.F32)]),
    *(unary_like_case("scale", lambda ctx, x: ops.scale(ctx, x, 1.75), lambda x: x * 1.75, ne=ne) for ne in SHAPES),
    unary_like_case("scale_bias", lambda ctx, x: ops.scale_bias(ctx, x, -0.5, 0.25), lambda x: x * -0.5 + 0.25),
    *(unary_like_case("clamp", lambda ctx, x: ops.clamp(ctx, x, -0.3, 0.6), lambda x: np.clip(x, -0.3, 0.6), t)
      for t in (G.F32, G.F16)),
    *(unary_like_case("fill", lambda ctx, x: ops.fill(ctx, x, -2.5), lambda x: np.full_like(x, -2.5), t)
      for t in (G.F32, G.F16)),
]

# Cases ggml 0.15.3's CPU backend cannot be compared on: inputs whose elements are strided (ggml's kernels
# GGML_ASSERT on them or read them as if packed). pyggml computes them; they are checked against the NumPy
# reference only, and the ggml peer harness (which reads CASES) leaves them out.
EXTRA_CASES = layout_cases(("perm",))
