"""Parity on speech no test uses: pyggml's greedy text against whisper.cpp's and faster-whisper's, sentence by
sentence, and where pyggml and whisper.cpp differ, teacher-forced logits to show whether it is a near-tie.

The set: the 60 sentences of benchmarks/data/vad_sentences.txt, each spoken by espeak-ng with one of four
voices and speeds, every third with white noise at about 20 dB SNR. Engines: pyggml tiny.en (its defaults:
whisper.cpp's mel padding and padded audio attention), whisper.cpp f16 of the same weights (pywhispercpp) and
faster-whisper float32; greedy, no fallback, English.

For a sentence where pyggml's text differs from whisper.cpp's: whisper.cpp's logits along pyggml's tokens
(teacher-forced, libwhisper's C API), per-step KL, and the first text step where whisper.cpp would pick another
token, with both engines' log-probabilities of the two tokens (a near-tie: the two are close in both).

    python -m benchmarks.parity_unseen [--n 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.vad_vs_peers import SENTENCES, SPEEDS, VOICES, say

SR = 16000


def sentences(workdir: Path, n: int) -> list[tuple[str, np.ndarray]]:
    texts = [t.strip() for t in SENTENCES.read_text().splitlines() if t.strip()][:n]
    rng = np.random.default_rng(99)
    out = []
    for i, text in enumerate(texts):
        audio = say(text, VOICES[(i + 1) % len(VOICES)], SPEEDS[(i + 3) % len(SPEEDS)], workdir / "p.wav")
        audio = np.concatenate([np.zeros(SR // 4, np.float32), audio, np.zeros(SR // 4, np.float32)])
        if i % 3 == 2:
            rms = float(np.sqrt(np.mean(audio ** 2)))
            audio = audio + (0.1 * rms * rng.standard_normal(audio.size)).astype(np.float32)
        out.append((text, audio.astype(np.float32)))
    return out


def divergence(w, bin_path: Path, samples: np.ndarray, tokens: list[int]) -> dict:
    """Teacher-forced along pyggml's tokens: KL per step, and the first text step where whisper.cpp's best
    text token is another one, with both engines' log-probabilities of the two."""
    from pyggml.models.whisper.decoding import log_softmax
    from tests.support import whisper_peers as peers

    prefix = w.tokenizer.sot_sequence(None)
    seq = prefix + tokens
    theirs = peers.whisper_cpp_logits(bin_path, samples, seq, len(prefix))
    w.model.encode(w.log_mel(samples)[0][:, :3000])
    ours = [w.model.decode(seq[:len(prefix)], np.arange(len(prefix)))[0]]
    ours += [w.model.decode([t], [i])[0] for i, t in enumerate(seq[len(prefix):], len(prefix))]
    p, q = (np.array([log_softmax(row) for row in x]) for x in (theirs, np.array(ours)))
    kl = (np.exp(p) * (p - q)).sum(-1)
    eot = w.tokenizer.eot
    first = None
    for i, tok in enumerate(tokens):
        if tok >= eot:
            continue
        best = int(np.argmax(p[i][:eot]))
        if best != tok:
            first = {"step": i, "pyggml_token": w.tokenizer.decode([tok]),
                     "whisper_cpp_token": w.tokenizer.decode([best]),
                     "pyggml_logprobs": [round(float(q[i][tok]), 4), round(float(q[i][best]), 4)],
                     "whisper_cpp_logprobs": [round(float(p[i][tok]), 4), round(float(p[i][best]), 4)]}
            break
    return {"kl_median": float(np.median(kl)), "kl_max": float(kl.max()), "first_text_divergence": first}


def main() -> None:
    from faster_whisper import WhisperModel
    from pywhispercpp.model import Model

    from pyggml.models.whisper.transcribe import load_whisper
    from tests.support import whisper_peers as peers

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "pyggml-parity"))
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    data = sentences(workdir, args.n)
    w = load_whisper("tiny.en", n_threads=2)
    bin_path = peers.ggml_bin("tiny.en", workdir)
    wc = Model(str(bin_path), n_threads=2, print_progress=False, print_realtime=False, temperature_inc=0.0,
               language="en")
    fw = WhisperModel(str(peers.ct2_dir("tiny.en", workdir)), device="cpu", compute_type="float32", cpu_threads=2)
    rows, errs = [], {"pyggml": [], "whisper.cpp": [], "faster-whisper": []}
    for i, (ref, audio) in enumerate(data):
        segs = w.transcribe(audio, temperatures=(0.0,))
        texts = {"pyggml": peers.join_segments(s.text for s in segs),
                 "whisper.cpp": peers.join_segments(s.text for s in wc.transcribe(audio)),
                 "faster-whisper": peers.join_segments(
                     s.text for s in fw.transcribe(audio, language="en", beam_size=1, temperature=0.0)[0])}
        row = {"i": i, "reference": ref, **texts}
        for k, t in texts.items():
            errs[k].append((peers.wer(ref, t), len(peers.words(ref))))
        if peers.words(texts["pyggml"]) != peers.words(texts["whisper.cpp"]):
            row["vs_whisper_cpp"] = divergence(w, bin_path, audio, [t for s in segs for t in s.tokens])
        rows.append(row)
        mark = "" if "vs_whisper_cpp" not in row else f"  DIFF {row['vs_whisper_cpp']['first_text_divergence']}"
        print(f"{i:2d} pg {errs['pyggml'][-1][0]:.2f} wc {errs['whisper.cpp'][-1][0]:.2f} "
              f"fw {errs['faster-whisper'][-1][0]:.2f}{mark}", flush=True)
    total = {k: sum(e * n for e, n in v) / sum(n for _, n in v) for k, v in errs.items()}
    print("WER over the set (word errors / reference words): " + ", ".join(f"{k} {v:.4f}" for k, v in total.items()))
    print(f"sentences where pyggml's words differ from whisper.cpp's: {sum('vs_whisper_cpp' in r for r in rows)}, "
          f"from faster-whisper's: {sum(peers.words(r['pyggml']) != peers.words(r['faster-whisper']) for r in rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"wer": total, "sentences": rows}, indent=1))


if __name__ == "__main__":
    main()
