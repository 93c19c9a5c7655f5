"""`pyggml demo`: build a small transformer block, plan its memory with both planners, compute it."""

from __future__ import annotations

import json
import math
import time

import numpy as np

from pyggml import Context, GGMLType, Graph, ops
from pyggml.alloc import GraphAllocator, alloc_ctx_tensors
from pyggml.backend import BufferUsage, init_by_name, tensor_get, tensor_set
from pyggml.cli.args import positive_int
from pyggml.errors import ParameterError


def build_block(n_embd: int, n_head: int, n_tokens: int, n_ff: int):
    """A pre-norm attention + SwiGLU block over n_tokens, as llama.cpp builds one (causal mask, RoPE)."""
    head = n_embd // n_head
    w = Context(no_alloc=True)
    weights = {name: w.new_tensor(GGMLType.F32, shape, name) for name, shape in (
        ("attn_norm", (n_embd,)), ("wq", (n_embd, n_embd)), ("wk", (n_embd, n_embd)), ("wv", (n_embd, n_embd)),
        ("wo", (n_embd, n_embd)), ("ffn_norm", (n_embd,)), ("w_gate", (n_embd, n_ff)), ("w_up", (n_embd, n_ff)),
        ("w_down", (n_ff, n_embd)))}
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor(GGMLType.F32, (n_embd, n_tokens), "x").set_input()
    pos = ctx.new_tensor(GGMLType.I32, (n_tokens,), "pos").set_input()
    mask = ctx.new_tensor(GGMLType.F32, (n_tokens, n_tokens), "mask").set_input()
    W = weights
    h = ops.mul(ctx, ops.rms_norm(ctx, x, 1e-6), W["attn_norm"])

    def heads(t):
        return ops.rope_ext(ctx, ops.reshape_3d(ctx, t, head, n_head, n_tokens), pos, None, head, 2, 0,
                            10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)

    q = ops.permute(ctx, heads(ops.mul_mat(ctx, W["wq"], h)), 0, 2, 1, 3)
    k = ops.permute(ctx, heads(ops.mul_mat(ctx, W["wk"], h)), 0, 2, 1, 3)
    v = ops.cont(ctx, ops.permute(ctx, ops.reshape_3d(ctx, ops.mul_mat(ctx, W["wv"], h), head, n_head, n_tokens),
                                  1, 2, 0, 3))
    kq = ops.soft_max_ext(ctx, ops.mul_mat(ctx, k, q), mask, 1.0 / math.sqrt(head), 0.0)
    attn = ops.cont_2d(ctx, ops.permute(ctx, ops.mul_mat(ctx, v, kq), 0, 2, 1, 3), n_embd, n_tokens)
    x2 = ops.add(ctx, x, ops.mul_mat(ctx, W["wo"], attn))
    f = ops.mul(ctx, ops.rms_norm(ctx, x2, 1e-6), W["ffn_norm"])
    ff = ops.swiglu_split(ctx, ops.mul_mat(ctx, W["w_gate"], f), ops.mul_mat(ctx, W["w_up"], f))
    out = ops.add(ctx, x2, ops.mul_mat(ctx, W["w_down"], ff)).set_name("out").set_output()
    return w, dict(x=x, pos=pos, mask=mask), out


def run(args) -> int:
    backend = init_by_name("CPU")
    if args.n_embd % args.n_head or (args.n_embd // args.n_head) % 2:
        raise ParameterError(f"--n-embd ({args.n_embd}) must be --n-head ({args.n_head}) heads of an even width")
    wctx, inputs, out = build_block(args.n_embd, args.n_head, args.n_tokens, 4 * args.n_embd)
    graph = Graph().build_forward_expand(out)
    weights = alloc_ctx_tensors(wctx, backend)
    weights.usage = BufferUsage.WEIGHTS
    rng = np.random.default_rng(0)
    for t in wctx:
        tensor_set(t, rng.uniform(-0.1, 0.1, tuple(reversed(t.ne[:t.n_dims]))).astype(np.float32))

    galloc = GraphAllocator(backend.default_buffer_type)
    t0 = time.perf_counter()
    galloc.alloc_graph(graph)
    plan_ms = (time.perf_counter() - t0) * 1e3
    n = args.n_tokens
    tensor_set(inputs["x"], rng.standard_normal((n, args.n_embd)).astype(np.float32))
    tensor_set(inputs["pos"], np.arange(n, dtype=np.int32))
    tensor_set(inputs["mask"], np.triu(np.full((n, n), -np.inf, np.float32), 1))
    t0 = time.perf_counter()
    backend.graph_compute(graph)
    compute_ms = (time.perf_counter() - t0) * 1e3
    result = tensor_get(out)

    plan = galloc.plan
    size = galloc.get_buffer_size(0)
    print(f"transformer block: n_embd {args.n_embd}, {args.n_head} heads, {n} tokens")
    print(f"graph: {graph.n_nodes} nodes, {graph.n_leafs} leafs; weights {weights.size / 2**20:.2f} MiB")
    print(f"compute buffer: {size} bytes (planner {plan.planner}), ggml's planner: {plan.ggml_size} bytes, "
          f"lower bound {plan.lower_bound} bytes ({size / max(plan.lower_bound, 1):.3f}x)")
    print(f"planned in {plan_ms:.1f} ms, computed in {compute_ms:.1f} ms; output {result.shape}, "
          f"mean {result.mean():+.5f}, std {result.std():.5f}")
    if args.verbose:
        print(json.dumps(plan.to_json(), indent=1))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="plan and compute a small transformer block on the CPU backend")
    p.add_argument("--n-embd", type=positive_int, default=256, help="embedding width (a multiple of --n-head)")
    p.add_argument("--n-head", type=positive_int, default=4)
    p.add_argument("--n-tokens", type=positive_int, default=32)
    p.add_argument("-v", "--verbose", action="store_true", help="print the whole plan")
    p.set_defaults(run=run)
