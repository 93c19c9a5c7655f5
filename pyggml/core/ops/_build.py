"""What every op builder shares: making the result tensor and refusing bad input clearly."""

from __future__ import annotations

from pyggml.core.context import Context
from pyggml.core.tensor import Op, Tensor
from pyggml.errors import ShapeError, GGMLTypeError


def describe(t: Tensor) -> str:
    return f"{t.name or '<unnamed>'!r} {t.type.name}{list(t.ne)}"


def check_shape(ok: bool, op: str, why: str, *tensors: Tensor) -> None:
    """Raise ShapeError naming the op, the rule broken and the tensors involved."""
    if not ok:
        raise ShapeError(f"{op}: {why} ({', '.join(describe(t) for t in tensors)})")


def check_type(ok: bool, op: str, why: str, *tensors: Tensor) -> None:
    if not ok:
        raise GGMLTypeError(f"{op}: {why} ({', '.join(describe(t) for t in tensors)})")


def new_result(ctx: Context, op: Op, type_, ne, srcs=(), params=(), inplace_of: Tensor | None = None) -> Tensor:
    """The result tensor of an op: fresh and contiguous, or (inplace) a view of all of `inplace_of`.

    `params` are the leading op_params words: ints stay ints, floats are bit-cast (ggml's layout).
    """
    t = ctx.view_tensor(inplace_of) if inplace_of is not None else ctx.new_tensor(type_, ne)
    t.op = op if type(op) is Op else Op(op)
    for i, s in enumerate(srcs):
        t.src[i] = s
    if params:
        t.set_op_params(params)
    return t


def new_view(ctx: Context, a: Tensor, op: Op, ne, nb, offset: int, suffix: str) -> Tensor:
    """A view op result (VIEW, RESHAPE, PERMUTE, TRANSPOSE): aliases a's memory, src[0] = a."""
    t = Tensor(a.type, ne, nb, op=op, view_src=a, view_offs=offset, name=f"{a.name} ({suffix})")
    t.src[0] = a
    return ctx.add(t)
