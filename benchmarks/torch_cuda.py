"""Benchmark the torch backend on CUDA: mul_mat throughput, host<->device transfers (sync and async), and
Gemma 3 270M generation when its model package is installed.

    python -m benchmarks.torch_cuda                 # CUDA0; says so and exits 0 when there is no CUDA
    python -m benchmarks.torch_cuda --device TORCH_CPU --size 1024   # the same measurements on the CPU
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from pyggml import ops
from pyggml.backend import (BufferUsage, init_by_name, tensor_alloc, tensor_get, tensor_get_async, tensor_set,
                            tensor_set_async)
from pyggml.core import types as T
from pyggml.core.context import Context
from pyggml.core.graph import Graph


def timed(fn, repeat: int) -> float:
    """Best wall time of fn() in seconds, after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def place(backend, *tensors):
    buf = backend.alloc_buffer(sum(-(-t.nbytes // 256) * 256 for t in tensors))
    offset = 0
    for t in tensors:
        tensor_alloc(buf, t, buf.base + offset)
        offset += -(-t.nbytes // 256) * 256
    return buf


def bench_mul_mat(backend, size: int, weight_type, batches, repeat: int) -> None:
    rng = np.random.default_rng(0)
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor(weight_type, (size, size), "w")
    weights = place(backend, w)
    weights.usage = BufferUsage.WEIGHTS
    tensor_set(w, T.encode(weight_type, rng.uniform(-1, 1, (size, size)).astype(np.float32)))
    for batch in batches:
        x = ctx.new_tensor(T.GGMLType.F32, (size, batch), f"x{batch}")
        y = ops.mul_mat(ctx, w, x)
        buf = place(backend, x, y)
        tensor_set(x, rng.uniform(-1, 1, (batch, size)).astype(np.float32))
        graph = Graph().build_forward_expand(y)
        seconds = timed(lambda graph=graph: backend.graph_compute(graph), repeat)
        print(f"  mul_mat {T.type_name(weight_type):>5} {size}x{size} x batch {batch:4d}: {seconds * 1e3:8.3f} ms  "
              f"{2 * size * size * batch / seconds / 1e9:9.1f} GFLOP/s")
        buf.free()
    weights.free()


def bench_transfers(backend, mib: int, repeat: int) -> None:
    n = mib << 20
    t = Context(no_alloc=True).new_tensor(T.GGMLType.I8, (n,), "blob")
    buf = place(backend, t)
    data = np.ones(n, np.int8)
    out = np.empty(n, np.int8)

    def async_set():
        tensor_set_async(backend, t, data)
        backend.synchronize()

    def async_get():
        tensor_get_async(backend, t, out=out)
        backend.synchronize()

    for label, fn in (("set", lambda: tensor_set(t, data)), ("get", lambda: tensor_get(t, out=out)),
                      ("set_async", async_set), ("get_async", async_get)):
        print(f"  {label:>9} {mib} MiB: {n / timed(fn, repeat) / 1e9:7.2f} GB/s")
    buf.free()


def bench_model(device: str, n_tokens: int) -> None:
    try:
        from pyggml.models import load_model
        model = load_model("gemma3-270m", backend=device, n_ctx=512)
    except Exception as e:  # the model package is optional (the `model` extra)
        print(f"  (no Gemma 3 270M run: {e})")
        return
    prompt = "The capital of France is"
    model.generate(prompt, n=2, temperature=0.0)
    start = time.perf_counter()
    text = model.generate(prompt, n=n_tokens, temperature=0.0)
    seconds = time.perf_counter() - start
    print(f"  gemma3 270M Q4_K_M: {n_tokens} tokens in {seconds:.2f} s ({n_tokens / seconds:.1f} tok/s): {text!r}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="CUDA0", help="torch backend device (CUDA0, CUDA1, TORCH_CPU)")
    parser.add_argument("--size", type=int, default=4096, help="square weight size for mul_mat")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args(argv)
    try:
        import torch
        from pyggml.backend import torch as torch_backend  # noqa: F401 (registers the TORCH devices)
    except ImportError:
        print("torch is not installed (pip install 'pyggml[torch]'): nothing to benchmark")
        return 0
    if args.device.upper().startswith("CUDA") and not torch.cuda.is_available():
        print(f"CUDA is not available (torch {torch.__version__}, CUDA build {torch.version.cuda}): "
              f"nothing to benchmark; --device TORCH_CPU runs the same measurements on the CPU")
        return 0
    backend = init_by_name(args.device)
    print(f"{backend.name}: {backend.device.description}, torch {torch.__version__}")
    for weight_type in (T.GGMLType.F32, T.GGMLType.F16, T.GGMLType.Q8_0):
        bench_mul_mat(backend, args.size, weight_type, (1, 32, 512), args.repeat)
    bench_transfers(backend, 256 if backend.device.torch_device.type == "cuda" else 64, args.repeat)
    bench_model(args.device, args.tokens)
    backend.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
