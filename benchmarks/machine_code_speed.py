"""The parallel kernels as Numba's own flow compiles them against pyggml.core.machine_code's (each library optimized
and generated once, in the kernel that runs it): the same results, and the speed of both, in one process, the two
alternating round after round (median per call and the median of the per-round ratios).

    python -m benchmarks.machine_code_speed                # one thread (least distorted by a loaded machine)
    python -m benchmarks.machine_code_speed --threads 2 --rounds 31

The serial kernels need no such check: their machine code is the same instructions either way.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="pyggml-machine-code-")  # compile both flows here

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba.parfors import parfor_lowering  # noqa: E402

from pyggml.backend.cpu.jit import mul_mat, repack  # noqa: E402
from pyggml.backend.cpu.jit.ir.vnni_ir import FORMATS  # noqa: E402
from pyggml.backend.cpu.jit.ir.vnni_k_ir import K_FORMATS  # noqa: E402
from pyggml.core import machine_code  # noqa: E402
from pyggml.core.types import GGMLType  # noqa: E402

Q4_1, Q8_0, Q4_K, Q6_K = (int(t) for t in (GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K))
rng = np.random.default_rng(0)


def blocks(qtype: int, rows: int, k: int, block_values: int, block_bytes: int, scales) -> np.ndarray:
    """Random blocks whose fp16 fields (at the offsets `scales`) are small, finite values."""
    nb = k // block_values
    raw = rng.integers(0, 256, (rows, nb, block_bytes), dtype=np.uint8)
    for offset in scales:
        raw[:, :, offset:offset + 2] = np.float16(rng.uniform(0.001, 0.01, (rows, nb))).view(np.uint8).reshape(
            rows, nb, 2)
    return raw.reshape(rows, nb * block_bytes)


def gemm_q8_0(qtype: int, rows: int, k: int, n: int) -> tuple:
    raw = blocks(qtype, rows, k, 32, FORMATS[qtype][0], [off for off, size in FORMATS[qtype][1] if size == 2])
    nb = k // 32
    xq, xd, xs, xm = (np.empty(n * k, np.uint8), np.empty(n * nb, np.float32), np.empty(n * nb, np.int32),
                      np.empty(n * nb, np.float32))
    repack.quantize_q8_0(rng.standard_normal((n, k), dtype=np.float32), xq, xd, xs, xm)
    return (repack.repack_16x4(qtype, raw).reshape(-1), np.zeros(1, np.int64), nb, rows // 16, xq, xd, xs, xm,
            np.array([0, n], np.int64), np.empty((n, rows), np.float32))


def gemm_q8_K(qtype: int, rows: int, k: int, n: int) -> tuple:
    raw = blocks(qtype, rows, k, 256, K_FORMATS[qtype][0], [off for off, size in K_FORMATS[qtype][1] if size == 2])
    nb = k // 256
    xq, xd, xb = np.empty(n * k, np.uint8), np.empty(n * nb, np.float32), np.empty(n * nb * 16, np.int32)
    repack.quantize_q8_K(rng.standard_normal((n, k), dtype=np.float32), xq, xd, xb)
    return (repack.repack_16x4(qtype, raw).reshape(-1), np.zeros(1, np.int64), nb, rows // 16, xq, xd, xb,
            np.array([0, n], np.int64), np.empty((n, rows), np.float32))


def vec(qtype: int, rows: int, k: int, ncols: int) -> tuple:
    block_bytes = FORMATS[qtype][0]
    src = blocks(qtype, rows, k, 32, block_bytes, [off for off, size in FORMATS[qtype][1] if size == 2]).reshape(-1)
    src.setflags(write=False)
    return (src, np.zeros(1, np.uint64), k // 32 * block_bytes, rows, k // 32,
            rng.standard_normal((1, ncols, k), dtype=np.float32), np.empty((1, ncols, rows), np.float32), 8)


def kv_f16(planes: int, rows: int, k: int, ncols: int) -> tuple:
    a = rng.integers(0x3000, 0x3C00, planes * rows * k, dtype=np.uint16)  # F16 bits of values in [0.125, 1)
    a.setflags(write=False)
    return (a, (np.arange(planes) * rows * k).astype(np.uint64), k, rows, k,
            rng.standard_normal((planes, ncols, k), dtype=np.float32), np.empty((planes, ncols, rows), np.float32), 4)


CASES = {  # name: (kernel, arguments; the output is the second last or the last argument)
    "gemm_16x4_q8_0 Q4_1 1536x576, 1 token": (repack.gemm_16x4_q8_0[Q4_1], gemm_q8_0(Q4_1, 1536, 576, 1)),
    "gemm_16x4_q8_0 Q4_1 1536x576, 64 tokens": (repack.gemm_16x4_q8_0[Q4_1], gemm_q8_0(Q4_1, 1536, 576, 64)),
    "gemm_16x4_q8_0 Q8_0 49152x576, 1 token": (repack.gemm_16x4_q8_0[Q8_0], gemm_q8_0(Q8_0, 49152, 576, 1)),
    "gemm_16x4_q8_K Q4_K 2048x2048, 1 token": (repack.gemm_16x4_q8_K[Q4_K], gemm_q8_K(Q4_K, 2048, 2048, 1)),
    "gemm_16x4_q8_K Q6_K 2048x8192, 1 token": (repack.gemm_16x4_q8_K[Q6_K], gemm_q8_K(Q6_K, 2048, 8192, 1)),
    "mul_mat_vec Q8_0 2048x2048, 1 column": (mul_mat.mul_mat_vec[Q8_0], vec(Q8_0, 2048, 2048, 1)),
    "mul_mat_float_columns F16 3x512x64, 3 columns": (mul_mat.mul_mat_float_columns, kv_f16(3, 512, 64, 3)),
    "mul_mat_float_columns F16 8x4096x128, 4 columns": (mul_mat.mul_mat_float_columns, kv_f16(8, 4096, 128, 4)),
}


def numbas_own_flow() -> None:
    """Undo machine_code.install() (for the kernels compiled next)."""
    for attr in ("finalize", "_get_compiled_object", "get_asm_str", "get_llvm_str"):
        delattr(machine_code._Library, attr)
    machine_code._Library.get_pointer_to_function = machine_code._get_pointer_to_function
    parfor_lowering._create_gufunc_for_parfor_body = machine_code._create_gufunc_for_parfor_body


def output(name: str, args: tuple) -> np.ndarray:
    return args[-1] if name.startswith("gemm") else args[-2]


def per_call_s(kernel, args: tuple, reps: int) -> float:
    start = time.process_time()
    for _ in range(reps):
        kernel(*args)
    return (time.process_time() - start) / reps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1, help="Numba's threads (default 1)")
    p.add_argument("--rounds", type=int, default=15, help="alternating rounds (default 15)")
    args = p.parse_args(argv)
    numbas_own_flow()
    own = {}
    for name, (kernel, call) in CASES.items():
        kernel(*call)
        own[name] = kernel
    machine_code.install()
    lazy, fresh = {}, {}
    for name, (kernel, call) in CASES.items():
        if id(kernel) not in fresh:
            options = {k: v for k, v in kernel.targetoptions.items() if k not in ("cache", "nopython")}
            fresh[id(kernel)] = numba.njit(kernel.py_func, **options)
        lazy[name] = fresh[id(kernel)]
        results = []
        for flow in (own, lazy):
            flow[name](*call)
            results.append(output(name, call).copy())
        assert np.array_equal(*results, equal_nan=True), f"{name}: the two flows' results differ"
    numba.set_num_threads(args.threads)
    print(f"{args.threads} thread(s); per call, CPU time of the process; load average {os.getloadavg()[0]:.2f}")
    for name, (_, call) in CASES.items():
        reps = max(5, int(0.05 / max(per_call_s(own[name], call, 5), 1e-7)))
        times = {"own": [], "lazy": []}
        for r in range(args.rounds):
            for flow, kernel in (("own", own[name]), ("lazy", lazy[name]))[:: 1 if r % 2 else -1]:
                times[flow].append(per_call_s(kernel, call, reps))
        ratios = [b / a for a, b in zip(times["own"], times["lazy"], strict=True)]
        print(f"{name:48s} Numba's flow {statistics.median(times['own']) * 1e6:9.1f} us, machine_code "
              f"{statistics.median(times['lazy']) * 1e6:9.1f} us: {statistics.median(ratios):.3f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f})")
    print(f"load average now: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
