"""Op graphs for unary activations and GLUs, with float64 NumPy references written from the formulas."""

from __future__ import annotations

import math

import numpy as np
from tests.support.opcases_elementwise import retyped
from tests.support.opcheck import OpCase, new_input, stored_as, values

from pyggml.core import ops
from pyggml.core.tensor import GluOp, UnaryOp
from pyggml.core.types import GGMLType as G

erf = np.vectorize(math.erf)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * x * (1 + 0.044715 * x * x)))


def gelu_erf(x):
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def gelu_quick(x):
    return x * sigmoid(1.702 * x)


def through_f16_table(fn):
    """ggml's CPU evaluates fn at the input rounded to F16 and rounds the result to F16 (a 64K-entry table)."""
    def tabled(x):
        return fn(x.astype(np.float16).astype(np.float64)).astype(np.float16).astype(np.float64)
    return tabled


def gelu_cpu(x):
    """GGML_GELU_FP16: the table inside (-10, 10), 0 below, x above."""
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, through_f16_table(gelu)(x)))


gelu_quick_cpu = through_f16_table(gelu_quick)  # GGML_GELU_QUICK_FP16: the table everywhere


REFERENCES = {
    UnaryOp.ABS: np.abs, UnaryOp.SGN: np.sign, UnaryOp.NEG: np.negative, UnaryOp.STEP: lambda x: (x > 0) * 1.0,
    UnaryOp.TANH: np.tanh, UnaryOp.ELU: lambda x: np.where(x > 0, x, np.expm1(x)), UnaryOp.RELU: lambda x: x * (x > 0),
    UnaryOp.SIGMOID: sigmoid, UnaryOp.GELU: gelu_cpu, UnaryOp.GELU_ERF: gelu_erf, UnaryOp.GELU_QUICK: gelu_quick_cpu,
    UnaryOp.SILU: lambda x: x * sigmoid(x), UnaryOp.HARDSWISH: lambda x: x * np.clip((x + 3) / 6, 0, 1),
    UnaryOp.HARDSIGMOID: lambda x: np.clip((x + 3) / 6, 0, 1), UnaryOp.EXP: np.exp, UnaryOp.EXPM1: np.expm1,
    UnaryOp.SOFTPLUS: lambda x: np.log1p(np.exp(x)), UnaryOp.FLOOR: np.floor, UnaryOp.CEIL: np.ceil,
    UnaryOp.ROUND: lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5), UnaryOp.TRUNC: np.trunc,
}
# (src, dst) type pairs of ggml's CPU unary template; the GELUs and SiLU have F32 and F16 kernels only
TYPE_PAIRS = [(G.F32, G.F32), (G.F16, G.F16), (G.BF16, G.BF16), (G.F16, G.F32), (G.BF16, G.F32)]
F32_F16_ONLY = {UnaryOp.GELU, UnaryOp.GELU_ERF, UnaryOp.GELU_QUICK, UnaryOp.SILU}


def type_pairs(op):
    return TYPE_PAIRS[:2] if op in F32_F16_ONLY else TYPE_PAIRS


def unary_case(op: UnaryOp, types, ne=(16, 5, 3, 2), layout="cont", scale=1.0):
    """op on inputs uniform in [-scale, scale] (the scaling is folded into the case's input, not a graph node)."""
    src_type, dst_type = types

    def build(ctx):
        x = new_input(ctx, src_type, ne, layout, "x")
        return retyped(ctx, getattr(ops, op.name.lower())(ctx, x), dst_type)

    def ref(out):
        return stored_as(out, REFERENCES[op](values(out.src[0])))

    return OpCase(f"{op.name.lower()}_{src_type.name}_{dst_type.name}_{'x'.join(map(str, ne))}_{layout}", build,
                  reference=ref)


GLU_REFERENCES = {
    GluOp.REGLU: lambda x: x * (x > 0), GluOp.GEGLU: gelu_cpu, GluOp.SWIGLU: lambda x: x * sigmoid(x),
    GluOp.GEGLU_ERF: gelu_erf, GluOp.GEGLU_QUICK: gelu_quick_cpu,
}


def glu_case(op: GluOp, type_, form, ne=(16, 5, 3), layout="cont"):
    """form: "fused" (x | gate halves of each row), "swapped" (gate | x) or "split" (two tensors)."""
    name = op.name.lower()

    def build(ctx):
        a = new_input(ctx, type_, ne, layout, "a")
        if form == "split":
            return getattr(ops, f"{name}_split")(ctx, a, new_input(ctx, type_, ne, layout, "g"))
        return getattr(ops, name if form == "fused" else f"{name}_swapped")(ctx, a)

    def ref(out):
        a = values(out.src[0])
        if form == "split":
            x, g = a, values(out.src[1])
        else:
            n = a.shape[-1] // 2
            x, g = (a[..., :n], a[..., n:]) if form == "fused" else (a[..., n:], a[..., :n])
        return stored_as(out, GLU_REFERENCES[op](x) * g)

    return OpCase(f"{name}_{form}_{type_.name}_{'x'.join(map(str, ne))}_{layout}", build, reference=ref)


def swiglu_oai_case(split, alpha=1.702, limit=0.4):
    def build(ctx):
        a = ctx.new_tensor(G.F32, (16, 6, 2), name="a")
        return ops.swiglu_oai(ctx, a, ctx.new_tensor(G.F32, (16, 6, 2), name="g") if split else None, alpha, limit)

    def ref(out):
        a = values(out.src[0])
        x, g = (a, values(out.src[1])) if split else (a[..., :8], a[..., 8:])
        x, g = np.minimum(x, limit), np.clip(g, -limit, limit)
        return x * sigmoid(alpha * x) * (g + 1)

    return OpCase(f"swiglu_oai_{'split' if split else 'fused'}", build, reference=ref)


def xielu_case(types, alpha_n=0.8, alpha_p=0.6, beta=0.5, eps=-1e-6):
    def build(ctx):
        return retyped(ctx, ops.xielu(ctx, new_input(ctx, types[0], (16, 5, 3), "cont", "x"), alpha_n, alpha_p, beta,
                                      eps), types[1])

    def ref(out):
        x = values(out.src[0])
        a_n, a_p = beta + np.log1p(np.exp(alpha_n)), np.log1p(np.exp(alpha_p))
        negative = (np.expm1(np.minimum(x, eps)) - x) * a_n + beta * x
        return stored_as(out, np.where(x > 0, a_p * x * x + beta * x, negative))

    return OpCase(f"xielu_{types[0].name}_{types[1].name}", build, reference=ref)


UNARY_OPS = [op for op in UnaryOp if op != UnaryOp.XIELU]
CASES = [
    *(unary_case(op, types) for op in UNARY_OPS for types in type_pairs(op)),
    *(unary_case(op, (G.F32, G.F32), ne, layout) for op in UNARY_OPS
      for ne, layout in [((7, 3), "pad"), ((1, 1, 1, 1), "cont"), ((64, 4, 2, 3), "cont")]),
    *(glu_case(op, t, form, layout=layout) for op in GLU_REFERENCES for t in (G.F32, G.F16)
      for form in ("fused", "swapped", "split") for layout in ("cont", "pad")),
    swiglu_oai_case(False), swiglu_oai_case(True),
    *(xielu_case(types) for types in TYPE_PAIRS),
]
