"""Unary activations (Op.UNARY, op_params[0] = UnaryOp) and gated linear units (Op.GLU).

ggml has one named builder per activation (ggml_relu, ggml_relu_inplace, ggml_swiglu, ...);
they are generated here from the UnaryOp / GluOp enums so that the two lists cannot drift apart.
"""

from __future__ import annotations

import numpy as np

from pyggml.core.context import Context
from pyggml.core.ops._build import check_shape, check_type, new_result
from pyggml.core.ops.elementwise import export, same_as
from pyggml.core.tensor import GluOp, Op, Tensor, UnaryOp

__all__ = ["unary", "unary_inplace", "xielu", "glu", "glu_split", "swiglu_oai"]


def unary(ctx: Context, a: Tensor, op: UnaryOp, inplace: bool = False) -> Tensor:
    check_shape(a.is_contiguous_rows, "unary", "a's rows must be contiguous", a)
    return same_as(ctx, Op.UNARY, a, (a,), (int(UnaryOp(op)),), inplace)


def unary_inplace(ctx: Context, a: Tensor, op: UnaryOp) -> Tensor:
    return unary(ctx, a, op, inplace=True)


def _softplus(x: float) -> float:
    """ggml_compute_softplus_f32, in float32 like ggml."""
    x = np.float32(x)
    return float(x if x > 20 else np.log(np.float32(1) + np.exp(x)))


def xielu(ctx: Context, a: Tensor, alpha_n: float, alpha_p: float, beta: float, eps: float) -> Tensor:
    """xIELU; ggml stores the activation's effective coefficients: [XIELU, beta + softplus(alpha_n),
    softplus(alpha_p), beta, eps]."""
    t = same_as(ctx, Op.UNARY, a, (a,), (int(UnaryOp.XIELU),))
    for i, v in enumerate((np.float32(beta) + np.float32(_softplus(alpha_n)), _softplus(alpha_p), beta, eps), 1):
        t.set_op_params_f32(i, float(v))
    return t


def _glu(ctx: Context, a: Tensor, b: Tensor | None, op: GluOp, swapped: bool) -> Tensor:
    """One tensor: the halves of a's rows are (x, gate) (or (gate, x) when swapped); two tensors: a is x, b the gate."""
    name = GluOp(op).name.lower()
    check_shape(a.is_contiguous_n(1), name, "a must be contiguous apart from its rows' stride", a)
    if b is not None:
        check_shape(b.is_contiguous_n(1), name, "b must be contiguous apart from its rows' stride", b)
        check_shape(a.same_shape(b), name, "a and b must have the same shape", a, b)
        check_type(a.type == b.type, name, "a and b must have the same type", a, b)
        ne = a.ne
    else:
        ne = [a.ne[0] // 2, *a.ne[1:]]
    return new_result(ctx, Op.GLU, a.type, ne, (a, b) if b is not None else (a,), (int(GluOp(op)), int(swapped)))


def glu(ctx: Context, a: Tensor, op: GluOp, swapped: bool) -> Tensor:
    return _glu(ctx, a, None, op, swapped)


def glu_split(ctx: Context, a: Tensor, b: Tensor, op: GluOp) -> Tensor:
    return _glu(ctx, a, b, op, False)


def swiglu_oai(ctx: Context, a: Tensor, b: Tensor | None, alpha: float, limit: float) -> Tensor:
    """gpt-oss's clamped SwiGLU: x*sigmoid(alpha*x) * (gate + 1) with x <= limit, |gate| <= limit."""
    t = _glu(ctx, a, b, GluOp.SWIGLU_OAI, False)
    t.set_op_params_f32(2, alpha)
    t.set_op_params_f32(3, limit)
    return t


def _define_unary(op: UnaryOp) -> None:
    name = op.name.lower()
    export(globals(), __all__, name, lambda ctx, a: unary(ctx, a, op))
    export(globals(), __all__, f"{name}_inplace", lambda ctx, a: unary_inplace(ctx, a, op))


def _define_glu(op: GluOp) -> None:
    name = op.name.lower()
    export(globals(), __all__, name, lambda ctx, a: glu(ctx, a, op, False))
    export(globals(), __all__, f"{name}_swapped", lambda ctx, a: glu(ctx, a, op, True))
    export(globals(), __all__, f"{name}_split", lambda ctx, a, b: glu_split(ctx, a, b, op))


for _op in UnaryOp:
    if _op != UnaryOp.XIELU:  # xielu takes parameters: its own builder above
        _define_unary(_op)
for _op in GluOp:
    if _op != GluOp.SWIGLU_OAI:  # has its own builder with alpha and limit
        _define_glu(_op)
