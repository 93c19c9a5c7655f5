"""pyggml transcribe against faster-whisper (int8, float32) and whisper.cpp (f16, q8_0, ... of the converted file).

The same audio (the committed English test sentences) and model, 2 threads, greedy without fallback; every
engine runs in a process of its own (so that its peak RSS is its own), one run per round, the engines
interleaved round by round. Reported per engine: load time, transcription wall time, real-time factor
(wall / audio seconds), peak RSS and the WER against the sentences' texts; with the load average and the
CPU, since this machine is shared.

With `--type q8_0` (q5_0, ...) pyggml reads the ggml .bin that `pyggml convert --type` writes, the same file
whisper.cpp-<type> loads (its matrices on pyggml's integer products), and the default engines are those two.

    python -m benchmarks.transcribe_vs_peers [--model tiny.en|base] [--type f16|q8_0|q5_0|...] [--rounds N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.peer_run import blas_kernel, cpu_model

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO / "tests" / "data" / "speech"


ENGINES = ("pyggml", "pyggml-f32", "faster-whisper-int8", "faster-whisper-float32", "whisper.cpp-f16",
           "whisper.cpp-q8_0")
THREADS = 2
TYPES = ("f16", "q8_0", "q5_0", "q5_1", "q4_0", "q4_1")   # pyggml convert --type


def machine_state() -> dict:
    """The load average and CPU model at the time of a measurement."""
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "cpu": cpu_model(), "cpus": os.cpu_count()}


def english_files(quick: bool) -> list[Path]:
    meta = json.loads((SPEECH / "speech.json").read_text())
    files = sorted(SPEECH / n for n, m in meta.items() if m["language"] == "en")
    return files[:1] if quick else files


def worker(engine: str, model: str, files: list[Path], workdir: Path, type_name: str = "f16") -> dict:
    """Load `engine`, transcribe every file; times, texts and the process's peak RSS. pyggml reads the installed
    CTranslate2 model for f16, else the converted ggml .bin of `type_name` (whisper.cpp-<type_name>'s file)."""
    from tests.support import whisper_peers as peers

    if type_name != "f16":   # written before the clock starts, as whisper.cpp's file is
        source = peers.ggml_bin(model, workdir, type_name.upper())
    start = time.perf_counter()
    if engine.startswith("pyggml"):
        from pyggml.models.whisper.transcribe import load_whisper
        w = load_whisper(model if type_name == "f16" else source, f32=engine.endswith("f32"), n_threads=THREADS)
        run = lambda f: " ".join(s.text.strip() for s in w.transcribe(str(f), language="en", temperatures=(0.0,)))
    elif engine.startswith("faster-whisper"):
        from faster_whisper import WhisperModel
        fw = WhisperModel(str(peers.ct2_dir(model, workdir)), device="cpu", compute_type=engine.rsplit("-", 1)[1],
                          cpu_threads=THREADS)
        run = lambda f: peers.faster_whisper_text(None, f, 1, "en", model=fw)
    else:
        from pywhispercpp.model import Model
        wc = Model(str(peers.ggml_bin(model, workdir, engine.rsplit("-", 1)[1].upper())), n_threads=THREADS,
                   print_progress=False, print_realtime=False, temperature_inc=0.0, language="en")
        run = lambda f: peers.join_segments(s.text for s in wc.transcribe(str(f)))
    load_s = time.perf_counter() - start
    texts, start = {}, time.perf_counter()
    for f in files:
        texts[f.name] = run(f)
    wall = time.perf_counter() - start
    return {"engine": engine, "load_s": load_s, "wall_s": wall, "texts": texts,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    from tests.support.whisper_peers import wer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny.en", choices=["tiny.en", "base"])
    ap.add_argument("--type", default="f16", choices=TYPES,
                    help="pyggml's weights: f16 (the installed model) or the converted file of a quantized type")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (default 1); the minimum is reported")
    ap.add_argument("--engines", help="comma-separated subset of " + ", ".join(ENGINES) + ", or whisper.cpp-<type>; "
                    "default: all of them for f16, pyggml and whisper.cpp-<type> for a quantized --type")
    ap.add_argument("--quick", action="store_true", help="one sentence, for a smoke test")
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "pyggml-whisper-bench"),
                    help="where the converted ggml .bin files and base's joined CTranslate2 directory are kept")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    files, workdir = english_files(args.quick), Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, files, workdir, args.type)))
        return
    meta = json.loads((SPEECH / "speech.json").read_text())
    audio_s = sum(meta[f.name]["seconds"] for f in files)
    default = ENGINES if args.type == "f16" else ("pyggml", f"whisper.cpp-{args.type}")
    engines = [e for e in (args.engines or ",".join(default)).split(",") if e]
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), GGML_NO_BACKTRACE="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    results: dict[str, list[dict]] = {e: [] for e in engines}
    for _ in range(args.rounds):
        for engine in engines:
            before = machine_state()
            cmd = [sys.executable, "-m", "benchmarks.transcribe_vs_peers", "--worker", engine, "--model", args.model,
                   "--type", args.type, "--workdir", str(workdir)]
            out = subprocess.run(cmd + (["--quick"] if args.quick else []), capture_output=True, text=True, env=env,
                                 cwd=REPO)
            if out.returncode != 0:
                print(f"{engine}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["machine_before"], r["machine_after"] = before, machine_state()
            results[engine].append(r)
    print(f"model {args.model} ({args.type}), {len(files)} sentence(s), {audio_s:.1f} s of audio, {THREADS} threads, "
          f"greedy; {machine_state()['cpu']}; BLAS: {blas_kernel()}")
    print(f"{'engine':<24}{'load s':>8}{'wall s':>9}{'RTF':>8}{'peak RSS MiB':>14}{'WER':>7}  load avg (1 min) "
          f"before/after")
    summary = {}
    for engine, runs in results.items():
        if not runs:
            continue
        best = min(runs, key=lambda r: r["wall_s"])
        mean_wer = sum(wer(meta[n]["text"], t) for n, t in best["texts"].items()) / len(best["texts"])
        summary[engine] = dict(best, rtf=best["wall_s"] / audio_s, wer=mean_wer)
        print(f"{engine:<24}{best['load_s']:>8.2f}{best['wall_s']:>9.2f}{best['wall_s'] / audio_s:>8.3f}"
              f"{best['peak_rss_mib']:>14.0f}{mean_wer:>7.3f}  {best['machine_before']['loadavg'][0]:.2f}/"
              f"{best['machine_after']['loadavg'][0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "type": args.type, "audio_s": audio_s,
                                               "results": summary}, indent=1))


if __name__ == "__main__":
    main()
