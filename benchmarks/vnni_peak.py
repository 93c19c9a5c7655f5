"""The ceiling of the integer products: how many AVX-512 VNNI vpdpbusd (64 u8·s8 products into 16 int32 lanes,
128 operations) one core retires a second, from registers, with --chains independent accumulators.

A product's GOPS over this figure times the threads is the share of the core's int8 peak it reaches (the prompt's
Q4_K tiles, `benchmarks/cpu_step_profile.py`). Needs a CPU with AVX-512 VNNI (the kernel compiles on AVX2 too,
tests/test_vnni_peak_benchmark.py, but there LLVM hoists the loop-invariant product out of the loop).

    python -m benchmarks.vnni_peak [--chains 16] [--iterations 20000000]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backend.cpu.jit.ir.int8_ir import AVX512_VNNI, VI8, VI32, dot_products, int8_instructions


def spin_kernel(chains: int):
    """A compiled f(n, out): n rounds of one vpdpbusd on each of `chains` accumulators, their sum stored in out
    (its first LANES int32 are read as the signed operand, so that nothing folds)."""

    @intrinsic
    def spin(typingctx, n, out):
        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[1])(context, builder, args[1]).data
            vector = builder.bitcast(data, VI32.as_pointer())
            signed = builder.bitcast(builder.load(vector, align=4), VI8)
            unsigned = ir.Constant(VI8, [3] * VI8.count)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(VI32, [i] * VI32.count)) for i in range(chains)]
            with cgutils.for_range(builder, args[0]):
                for acc in accs:
                    builder.store(dot_products(builder, builder.load(acc), [(unsigned, signed)]), acc)
            total = builder.load(accs[0])
            for acc in accs[1:]:
                total = builder.add(total, builder.load(acc))
            builder.store(total, vector, align=4)
            return context.get_dummy_value()

        return types.none(n, out), codegen

    @njit(nogil=True)
    def run(n, out):
        spin(n, out)

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chains", type=int, default=16, help="independent accumulators (default 16)")
    p.add_argument("--iterations", type=int, default=20_000_000)
    p.add_argument("--rounds", type=int, default=5, help="the best of this many runs is shown")
    args = p.parse_args()
    if int8_instructions() != AVX512_VNNI:  # AVX2's form is plain IR: LLVM hoists the loop-invariant product
        raise SystemExit("vnni_peak needs a CPU with AVX-512 VNNI")
    run, out = spin_kernel(args.chains), np.ones(VI32.count, np.int32)
    run(10, out)  # compiles
    best = min(_timed(run, args.iterations, out) for _ in range(args.rounds))
    per_second = args.iterations * args.chains / best
    print(f"load average {os.getloadavg()}; {args.chains} accumulators: {per_second / 1e9:.2f} G vpdpbusd/s on one "
          f"core, {per_second * 128 / 1e9:.0f} GOPS")


def _timed(run, n: int, out: np.ndarray) -> float:
    start = time.perf_counter()
    run(n, out)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
