"""What a quantized KV cache costs in accuracy (llama.cpp's -ctk / -ctv), pyggml beside llama.cpp.

A text (default: benchmarks/data/GPL-3.txt) is tokenized by pyggml, cut into --chunks chunks of --ctx tokens
from BOS, and evaluated teacher-forced (all logits) from an empty cache with each KV setting: F16 K and V (the
reference), then Q8_0 and Q4_0. Each side is compared with its own F16 run, all with flash attention (which
llama.cpp needs for a quantized V and pyggml uses for any quantized cache): KL(F16 run || quantized run) mean,
p99, max and top-1 agreement, and the cache bytes against F16's. llama.cpp runs in a subprocess of
--llama-python (a Python that has llama_cpp) on the same token ids; without it, pyggml's side alone.

    python -m benchmarks.kv_cache_kld --llama-python PYTHON --json benchmarks/data/kv_cache_kld.json
    python -m benchmarks.kv_cache_kld --chunks 1 --ctx 128          # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pyggml.core import GGMLType
from pyggml.models import load_model
from pyggml.testing.agreement import Agreement

TEXT = Path(__file__).parent / "data" / "GPL-3.txt"
SETTINGS = [("F16", "F16"), ("Q8_0", "Q8_0"), ("Q4_0", "Q4_0"), ("Q8_0", "F16")]  # (K, V); the first is the ref

LLAMA_SCRIPT = """
import sys
import numpy as np
from llama_cpp import Llama
path, chunks_file, out_file, ctx, threads, type_k, type_v = sys.argv[1:8]
chunks = np.load(chunks_file)
llm = Llama(path, n_ctx=int(ctx), n_batch=int(ctx), n_ubatch=int(ctx), n_threads=int(threads),
            n_threads_batch=int(threads), logits_all=True, type_k=int(type_k), type_v=int(type_v), flash_attn=True,
            verbose=False)
out = np.lib.format.open_memmap(out_file, "w+", np.float32, (len(chunks), int(ctx), llm.n_vocab()))
for i, chunk in enumerate(chunks):
    llm.reset()  # eval then drops the cache from position 0 on
    llm.eval(chunk.tolist())
    out[i] = np.asarray(llm.scores[:len(chunk)], np.float32)
out.flush()
"""


def pyggml_logits(path: str, chunks: np.ndarray, ctx: int, type_k: str, type_v: str) -> tuple[np.ndarray, int]:
    model = load_model(path, n_ctx=ctx, n_batch=ctx, kv_type_k=type_k, kv_type_v=type_v, flash_attn=True)
    out = []
    for chunk in chunks:
        model.reset()
        out.append(np.asarray(model.decode(chunk.tolist(), all_logits=True), np.float32))
    return np.stack(out), model.kv.nbytes


def llama_logits(python: str, path: str, chunks: np.ndarray, ctx: int, threads: int, type_k: str, type_v: str,
                 tmp: Path) -> np.ndarray:
    np.save(tmp / "chunks.npy", chunks)
    out = tmp / f"llama_{type_k}_{type_v}.npy"
    subprocess.run([python, "-c", LLAMA_SCRIPT, path, str(tmp / "chunks.npy"), str(out), str(ctx), str(threads),
                    str(int(GGMLType[type_k])), str(int(GGMLType[type_v]))], check=True, timeout=3600)
    return np.load(out, mmap_mode="r")


def compared(ref: np.ndarray, other: np.ndarray, chunks: np.ndarray) -> dict:
    a = Agreement()
    for r, o, chunk in zip(ref, other, chunks, strict=True):
        a.add(r[:-1], o[:-1], chunk[1:])
    return a.summary()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="GGUF file (default: load_model's default)")
    p.add_argument("--text", default=str(TEXT))
    p.add_argument("--ctx", type=int, default=512, help="tokens per chunk (default 512)")
    p.add_argument("--chunks", type=int, default=2, help="chunks (default 2)")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp's threads")
    p.add_argument("--llama-python", help="a Python with llama_cpp installed (no peer: pyggml's side alone)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    model = load_model(args.model, n_ctx=args.ctx)
    path = model.gguf.path
    tokens = model.tokenize(Path(args.text).read_text(encoding="utf-8"))
    n = min(args.chunks, len(tokens) // args.ctx)
    chunks = np.asarray(tokens[:n * args.ctx], np.int32).reshape(n, args.ctx).copy()
    chunks[:, 0] = tokens[0]
    del model
    loads = {"start": os.getloadavg()[0]}
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="kv_cache_kld_") as tmp:
        ref, ref_bytes = pyggml_logits(path, chunks, args.ctx, *SETTINGS[0])
        llama_ref = (llama_logits(args.llama_python, path, chunks, args.ctx, args.threads, *SETTINGS[0], Path(tmp))
                     if args.llama_python else None)
        for type_k, type_v in SETTINGS[1:]:
            name = f"K {type_k}, V {type_v}"
            logits, nbytes = pyggml_logits(path, chunks, args.ctx, type_k, type_v)
            results[name] = {"cache_bytes_vs_f16": nbytes / ref_bytes, "pyggml": compared(ref, logits, chunks)}
            if llama_ref is not None:
                theirs = llama_logits(args.llama_python, path, chunks, args.ctx, args.threads, type_k, type_v,
                                      Path(tmp))
                results[name]["llama.cpp"] = compared(llama_ref, theirs, chunks)
    loads["end"] = os.getloadavg()[0]

    print(f"model {Path(path).name}: {n} chunks of {args.ctx} tokens, flash attention, each side against its own "
          f"F16-cache run; load average {loads['start']:.2f} -> {loads['end']:.2f}")
    print(f"{'setting':18}{'bytes':>7}{'side':>11}{'KLD mean':>11}{'p99':>11}{'max':>11}{'top-1':>9}")
    for name, r in results.items():
        for side in ("pyggml", "llama.cpp"):
            if side in r:
                s = r[side]
                print(f"{name:18}{r['cache_bytes_vs_f16']:6.2f}x{side:>11}{s['kld_mean']:11.3e}{s['kld_p99']:11.3e}"
                      f"{s['kld_max']:11.3e}{100 * s['top1']:8.2f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": Path(path).name, "text": Path(args.text).name, "chunks": n,
                                               "ctx": args.ctx, "loadavg": loads, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
