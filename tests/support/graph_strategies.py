"""Random graphs over every op family, for the reliability tests.

A program is (dims, steps): plain tuples that hypothesis can shrink. `build` runs the steps on a context;
a step whose op refuses its operands (ShapeError/TypeError from the op builders) or that the CPU backend
has no kernel for is skipped, so every drawn program builds, and the same dims-free steps replayed with
other dims give the same topology with other sizes (when every step still applies).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from pyggml import Context, GGMLType, Graph
from pyggml.backend.cpu import kernels
from pyggml.core import ops
from pyggml.errors import GGMLError

UNARY = ["relu", "neg", "abs", "tanh", "gelu", "silu", "sigmoid", "exp", "sqr", "sqrt", "log", "sin", "cos",
         "elu", "hardswish", "step", "sgn"]
INPLACE = ["relu_inplace", "neg_inplace", "silu_inplace", "sqr_inplace", "add_inplace", "mul_inplace",
           "scale_inplace", "soft_max_inplace", "rms_norm_inplace"]
GLU = ["swiglu", "geglu", "reglu", "swiglu_swapped"]
BINARY = ["add", "sub", "mul", "div"]
NORMS = ["norm", "rms_norm", "l2_norm"]
REDUCE = ["sum_rows", "mean", "sum", "cumsum"]
PERMS = [(1, 0, 2, 3), (0, 2, 1, 3), (2, 0, 1, 3), (1, 2, 0, 3)]
NAMES = {"unary": UNARY, "binary": BINARY, "inplace": INPLACE, "glu": GLU, "norm": NORMS, "reduce": REDUCE}
LEAF_SHAPES = ["ab", "abc", "a", "a1", "1b", "a1c", "ab1"]  # letters are dims, 1 broadcasts
STEPS = ["leaf", "leaf", "unary", "binary", "binary", "inplace", "glu", "norm", "reduce", "view_1d", "view_2d",
         "reshape", "permute", "transpose", "cont", "cpy", "get_rows", "mul_mat", "mul_mat_w", "soft_max", "rope",
         "concat", "scale", "output"]


@dataclass
class Leaf:
    """A leaf and how to fill it: 'f32' values, 'rows' (get_rows indices below `bound`) or 'pos' (rope)."""

    tensor: object
    kind: str
    bound: int = 0


@dataclass
class Program:
    leaves: list[Leaf] = field(default_factory=list)
    values: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    skipped: int = 0

    def graph(self) -> Graph:
        graph = Graph()
        for t in self.outputs:
            graph.build_forward_expand(t)
        return graph


def _shape(letters: str, dims) -> list[int]:
    table = {"a": dims[0], "b": dims[1], "c": dims[2], "1": 1}
    return [table[ch] for ch in letters]


def _leaf(ctx, prog: Program, ne, kind="f32", type_=GGMLType.F32, is_input=True, bound=0):
    t = ctx.new_tensor(type_, ne, name=f"leaf{len(prog.leaves)}")
    if is_input:
        t.set_input()
    prog.leaves.append(Leaf(t, kind, bound))
    return t


def _apply(ctx, prog: Program, dims, step):  # noqa: C901
    """The tensor one step makes, or None for 'output'. Raises GGMLError when the op refuses its operands."""
    kind, args = step[0], step[1:]
    pick = [prog.values[i % len(prog.values)] for i in args if isinstance(i, int)] if prog.values else []
    if kind == "leaf":
        return _leaf(ctx, prog, _shape(LEAF_SHAPES[args[0] % len(LEAF_SHAPES)], dims), is_input=bool(args[1] % 2))
    a = prog.values[args[-1] % len(prog.values)]
    b = pick[0] if pick else a
    if kind == "unary":
        return getattr(ops, args[0])(ctx, a)
    if kind == "binary":
        return getattr(ops, args[0])(ctx, b, a)
    if kind == "inplace":
        name = args[0]
        if name in ("add_inplace", "mul_inplace"):
            return getattr(ops, name)(ctx, b, a)
        if name == "scale_inplace":
            return ops.scale_inplace(ctx, a, 0.5)
        if name == "rms_norm_inplace":
            return ops.rms_norm_inplace(ctx, a, 1e-5)
        return getattr(ops, name)(ctx, a)
    if kind == "glu":
        return getattr(ops, args[0])(ctx, a)
    if kind == "norm":
        return getattr(ops, args[0])(ctx, a, 1e-5) if args[0] != "l2_norm" else ops.l2_norm(ctx, a, 1e-6)
    if kind == "reduce":
        return getattr(ops, args[0])(ctx, a)
    if kind == "view_1d":
        n = max(1, a.ne[0] // 2)
        return ops.view_1d(ctx, a, n, args[0] % 2 * (a.ne[0] - n) * a.nb[0])
    if kind == "view_2d":
        rows = max(1, a.ne[1] // 2)
        return ops.view_2d(ctx, a, a.ne[0], rows, a.nb[1], args[0] % 2 * (a.ne[1] - rows) * a.nb[1])
    if kind == "reshape":
        return ops.reshape_2d(ctx, a, a.ne[0] * a.ne[1], a.ne[2] * a.ne[3])
    if kind == "permute":
        return ops.permute(ctx, a, *PERMS[args[0] % len(PERMS)])
    if kind == "transpose":
        return ops.transpose(ctx, a)
    if kind == "cont":
        return ops.cont(ctx, a)
    if kind == "cpy":
        dst = _leaf(ctx, prog, a.ne, type_=GGMLType.F16 if args[0] % 2 else GGMLType.F32, is_input=False)
        return ops.cpy(ctx, a, dst)
    if kind == "get_rows":
        idx = _leaf(ctx, prog, [1 + args[0] % 4, a.ne[2]], "rows", GGMLType.I32, bound=a.ne[1])
        return ops.get_rows(ctx, a, idx)
    if kind == "mul_mat":
        return ops.mul_mat(ctx, b, a)
    if kind == "mul_mat_w":
        w = _leaf(ctx, prog, [a.ne[0], 1 + args[0] % 5], is_input=False)
        return ops.mul_mat(ctx, w, a)
    if kind == "soft_max":
        if args[0] % 2:
            mask = _leaf(ctx, prog, [a.ne[0], a.ne[1]])
            return ops.soft_max_ext(ctx, a, mask, 0.5, 0.0)
        return ops.soft_max(ctx, a)
    if kind == "rope":
        pos = _leaf(ctx, prog, [a.ne[2]], "pos", GGMLType.I32)
        return ops.rope(ctx, a, pos, a.ne[0] - a.ne[0] % 2, 2 * (args[0] % 2))
    if kind == "concat":
        return ops.concat(ctx, b, a, args[0] % 4)
    if kind == "scale":
        return ops.scale(ctx, a, 0.25 * (1 + args[0] % 4))
    raise AssertionError(f"unknown step {step}")


def build(program, ctx: Context) -> Program:
    """Build a (dims, steps) program on ctx; the last value and every 'output' step's value are outputs."""
    dims, steps = program
    prog = Program()
    prog.values.append(_leaf(ctx, prog, _shape("abc", dims)))
    for step in steps:
        if step[0] == "output":
            prog.outputs.append(prog.values[step[1] % len(prog.values)])
            continue
        try:
            t = _apply(ctx, prog, dims, step)
        except GGMLError:
            prog.skipped += 1
            continue
        if t.type != GGMLType.F32 and step[0] != "cpy" or not kernels.supports(t):
            prog.skipped += 1  # kept F32 (or a cpy's F16) so that later steps have operands they accept
            continue
        prog.values.append(t)
    prog.outputs.append(prog.values[-1])
    for t in prog.outputs:
        t.set_output()
    return prog


def fill(prog: Program, seed: int, write) -> None:
    """Give every leaf deterministic data through `write(tensor, ndarray)`."""
    rng = np.random.default_rng(seed)
    for leaf in prog.leaves:
        t = leaf.tensor
        shape = tuple(reversed(t.ne))  # all four: n_dims drops an empty dimension after the first ([1, 0, 1, 1])
        if leaf.kind == "rows":
            values = rng.integers(0, max(leaf.bound, 1), shape).astype(np.int32)
        elif leaf.kind == "pos":
            values = rng.integers(0, 64, shape).astype(np.int32)
        else:
            values = rng.integers(-8, 9, shape).astype(np.float32) / 4
            if t.type == GGMLType.F16:
                values = values.astype(np.float16)
        write(t, values)


def _step(kind: str):
    if kind == "leaf":
        return st.tuples(st.just(kind), st.integers(0, len(LEAF_SHAPES) - 1), st.integers(0, 3))
    index = st.integers(0, 63)
    if kind in NAMES:
        return st.tuples(st.just(kind), st.sampled_from(NAMES[kind]), index, index)
    return st.tuples(st.just(kind), index, index)  # (variant or second operand, operand)


dims = st.tuples(st.integers(1, 6), st.integers(1, 5), st.integers(1, 3))
steps = st.lists(st.sampled_from(STEPS).flatmap(_step), min_size=1, max_size=24)
programs = st.tuples(dims, steps)


WIDTHS = (8, 16, 32, 64)


def build_wide_dag(seed: int, n_nodes: int, ctx: Context, rows: tuple[int, ...] = (2, 32)) -> Program:
    """A wide random DAG in the manner of the wide_dag fixture: every node applies a unary op, a scale, a
    binary op or a product with a weight to values drawn from everything computed so far (half the time
    from those nobody used yet, so that nearly every node is reached), and the values nobody used are the
    outputs. Many tensors are alive at once, and the build order is far from the leanest."""
    rng = np.random.default_rng(seed)
    prog = Program()
    unused: list = []
    for w in WIDTHS:
        for r in rows:
            prog.values.append(_leaf(ctx, prog, [w, r]))

    def draw(pool):
        fresh = [t for t in unused if t in pool]
        choices = fresh if fresh and rng.random() < 0.5 else pool
        return choices[int(rng.integers(len(choices)))]

    while len(prog.values) < len(WIDTHS) * len(rows) + n_nodes:
        kind = rng.choice(["unary", "scale", "binary", "binary", "mul_mat"])
        a = draw(prog.values)
        used = [a]
        if kind == "unary":
            t = getattr(ops, str(rng.choice(["relu", "neg", "tanh", "silu", "gelu", "sin"])))(ctx, a)
        elif kind == "scale":
            t = ops.scale(ctx, a, 0.5)
        elif kind == "binary":
            b = draw([v for v in prog.values if v.ne[:2] == a.ne[:2]])
            used.append(b)
            t = getattr(ops, str(rng.choice(BINARY[:3])))(ctx, a, b)
        else:
            w = _leaf(ctx, prog, [a.ne[0], int(rng.choice(WIDTHS))], is_input=False)
            t = ops.mul_mat(ctx, w, a)
        unused[:] = [v for v in unused if all(v is not u for u in used)] + [t]
        prog.values.append(t)
    prog.outputs = list(unused)
    for t in prog.outputs:
        t.set_output()
    return prog
