"""pyggml against llama.cpp on every random-weight parity case (tests/support/parity_cases.py), one row per
case, as docs/models.md's architecture table reports it: teacher-forced mean and max KL(llama.cpp || pyggml),
top-1 agreement, and for quantized files the yardstick (llama.cpp on the same weights converted to F32) and
the ratio to it.

By default llama.cpp's logits are the committed ones (tests/models/data/llamacpp_logits.npz, with the
yardsticks of llamacpp_parity.json); --live recomputes them with llama-cpp-python and adds, for each
quantized case, "F32 both sides": pyggml against llama.cpp on the F32 copy (KV F32 on both, bound 1e-6).

    python -m benchmarks.arch_kld_table [--live] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from pyggml.models import load_model
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.testing.agreement import agreement
from pyggml.testing.synthetic import write_f32_copy

from tests.support.parity_cases import CASES, N_BATCH, write_case

DATA = Path(__file__).resolve().parents[1] / "tests" / "models" / "data"


def weight_types(path) -> str:
    """The file's matrix types, most used first (F32 norms and vectors left out unless all are F32)."""
    with GGUFFile.open(path) as f:
        counts = Counter(t.type.name for t in f.tensors if t.ne[1] > 1)
    return ", ".join(name for name, _ in counts.most_common())


def pyggml_logits(case, path, tokens) -> np.ndarray:
    model = load_model(path, n_ctx=case.n_ctx, n_batch=N_BATCH, kv_type="F32")
    return model.decode(list(map(int, tokens)), all_logits=True)


def measure(case, path, args, committed, summary) -> dict:
    tokens = case.tokens()
    row = {"case": case.name, "arch": case.name.split("-")[0], "weights": weight_types(path), "positions": len(tokens)}
    if args.live:
        from pyggml.testing.llamacpp import llamacpp_logits
        reference = llamacpp_logits(path, tokens)
    else:
        reference = committed[f"{case.name}/logits"]
    row["pyggml"] = agreement(reference, pyggml_logits(case, path, tokens))
    if case.quantized:
        if args.live:
            f32 = path.with_suffix(".f32.gguf")
            write_f32_copy(path, f32)
            f32_reference = llamacpp_logits(f32, tokens)
            row["yardstick"] = agreement(reference, f32_reference)
            row["f32_both_sides"] = agreement(f32_reference, pyggml_logits(case, f32, tokens))
        else:
            row["yardstick"] = summary["cases"][case.name]["yardstick"]
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| case | weights | positions | mean KLD | max KLD | top-1 | yardstick | ratio | F32 both sides |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        got, yard, f32 = r["pyggml"], r.get("yardstick"), r.get("f32_both_sides")
        lines.append(f"| {r['case']} | {r['weights']} | {r['positions']} | {got['kld_mean']:.2e} | "
                     f"{got['kld_max']:.2e} | {100 * got['top1']:.1f}% | "
                     + (f"{yard['kld_mean']:.2e} | {got['kld_mean'] / yard['kld_mean']:.3f} | " if yard else "- | - | ")
                     + (f"{f32['kld_mean']:.2e} |" if f32 else "- |"))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--live", action="store_true", help="llama.cpp's logits from llama-cpp-python, not the committed")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()
    summary = json.loads((DATA / "llamacpp_parity.json").read_text())
    load_before = os.getloadavg()
    with np.load(DATA / "llamacpp_logits.npz") as f, tempfile.TemporaryDirectory() as tmp:
        committed = dict(f)
        rows = [measure(case, write_case(case, Path(tmp)), args, committed, summary) for case in CASES]
    load_after = os.getloadavg()
    source = "llama-cpp-python (live)" if args.live else f"committed logits of llama-cpp-python " \
                                                         f"{summary['llama_cpp_python_version']}"
    print(f"llama.cpp: {source}; KV F32 on both sides; 1-min load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after\n")
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"source": source, "loadavg": [load_before, load_after], "rows": rows},
                                              indent=1) + "\n")


if __name__ == "__main__":
    main()
