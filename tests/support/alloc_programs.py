"""Random small graph programs for the allocator's property tests: element-wise ops, cont, views, reshapes,
permutes, inputs, constant leafs and preallocated weights, and OUTPUT flags. A program is a list of steps (plain
data, so hypothesis can shrink it); `build` turns it into tensors on a context."""

from hypothesis import strategies as st

from pyggml import Context, GGMLType
from pyggml.core import ops

SHAPE = (4, 3)
UNARY = {"relu": ops.relu, "neg": ops.neg, "sqr": ops.sqr, "scale": lambda ctx, a: ops.scale(ctx, a, 0.5)}
BINARY = {"add": ops.add, "sub": ops.sub, "mul": ops.mul}


def build(spec: list[tuple], ctx: Context, weights: Context | None = None) -> tuple[list, list, list]:
    """Run a program spec: returns (inputs, outputs, every value in order).

    Inputs are INPUT leafs, consts (leafs without the flag) and weights; all three get their values after
    allocation. Weights go to the `weights` context when given (to be allocated outside the graph
    allocator, as model weights are), else to ctx like every other tensor.
    """
    values, inputs, outputs = [], [], []
    for step in spec:
        kind, args = step[0], step[1:]
        if kind in ("input", "const", "weight"):
            home = weights if kind == "weight" and weights is not None else ctx
            t = home.new_tensor_2d(GGMLType.F32, *SHAPE, f"{kind}{len(inputs)}")
            inputs.append(t.set_input() if kind == "input" else t)
        elif kind == "unary":
            t = UNARY[args[0]](ctx, values[args[1]])
        elif kind == "binary":
            t = BINARY[args[0]](ctx, values[args[1]], values[args[2]])
        elif kind == "cont":
            t = ops.cont(ctx, values[args[0]])
        elif kind == "permute":
            t = ops.permute(ctx, values[args[0]], 1, 0, 2, 3)
        elif kind == "reshape":
            a = values[args[0]]
            t = ops.reshape_2d(ctx, a, a.ne[1], a.ne[0])
        elif kind == "view":
            t = ops.view_1d(ctx, values[args[0]], args[1], 0)
        elif kind == "output":
            outputs.append(values[args[0]].set_output())
            continue
        values.append(t)
    outputs.append(values[-1].set_output())
    return inputs, outputs, values


def _packed(t) -> bool:
    """Contiguous with packed elements: what unary ops, reshapes and 1-d views accept."""
    return t.is_contiguous and t.nb[0] == 4


@st.composite
def programs(draw):
    """A random valid program spec; shapes are tracked by building it on a scratch context."""
    spec = [("input",)]
    values = build(spec, Context(no_alloc=True))[2]
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["input", "const", "weight", "unary", "binary", "binary", "cont", "permute",
                                     "reshape", "view", "output"]))
        i = draw(st.integers(0, len(values) - 1))
        a = values[i]
        if kind in ("input", "const", "weight"):
            step = (kind,)
        elif kind == "unary" and _packed(a):
            step = ("unary", draw(st.sampled_from(sorted(UNARY))), i)
        elif kind == "binary":
            partners = [j for j, b in enumerate(values) if b.ne == a.ne]
            step = ("binary", draw(st.sampled_from(sorted(BINARY))), i, draw(st.sampled_from(partners)))
        elif kind in ("unary", "reshape", "view") and not _packed(a):
            step = ("cont", i)
        elif kind == "view":
            step = ("view", i, draw(st.integers(1, a.nelements)))
        elif kind == "output":
            spec.append(("output", i))
            continue
        else:
            step = (kind, i)
        spec.append(step)
        values = build(spec, Context(no_alloc=True))[2]
    return spec
