"""Parity on speech no test uses: pyggml's greedy text against whisper.cpp's and faster-whisper's, sentence by
sentence, and for every sentence where the words differ, the decoding step that decides it.

The set: the 60 sentences of benchmarks/data/vad_sentences.txt, each spoken by espeak-ng with one of four
voices and speeds, every third with white noise at about 20 dB SNR (seeded per sentence). Engines: pyggml
tiny.en with its defaults (whisper.cpp's mel padding and padded audio attention), pyggml with faster-whisper's
conventions (`padding="faster-whisper", audio_ctx_pad=1`), whisper.cpp f16 of the same weights (pywhispercpp)
and faster-whisper float32; greedy, no fallback, English.

Where pyggml's words differ from whisper.cpp's: whisper.cpp's logits along pyggml's tokens (teacher-forced,
libwhisper's C API), per-step KL, and the first text step where whisper.cpp would pick another token, with
both engines' log-probabilities of the two tokens.

Where pyggml's words differ from faster-whisper's: `convention`, the first token where pyggml's default
tokens and its tokens with faster-whisper's conventions part, with the log-probabilities of both tokens under
each convention (teacher-forced, after each window's logit filters); if pyggml with faster-whisper's
conventions still differs from faster-whisper, `peer`, the first token where the two part, with pyggml's
log-probabilities of both and CTranslate2's (its own greedy run's filtered logits, `return_logits_vocab`).

    python -m benchmarks.parity_unseen [--n 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.vad_vs_peers import SENTENCES, SPEEDS, VOICES, say

SR = 16000
FASTER_WHISPER = dict(padding="faster-whisper", audio_ctx_pad=1)   # pyggml with faster-whisper's conventions


def texts() -> list[str]:
    return [t.strip() for t in SENTENCES.read_text().splitlines() if t.strip()]


def sentence_audio(i: int, text: str, workdir: Path) -> np.ndarray:
    """Sentence i as the set speaks it: its voice and speed, 0.25 s of silence either side, noise on every third."""
    audio = say(text, VOICES[(i + 1) % len(VOICES)], SPEEDS[(i + 3) % len(SPEEDS)], workdir / f"p{i}.wav")
    audio = np.concatenate([np.zeros(SR // 4, np.float32), audio, np.zeros(SR // 4, np.float32)])
    if i % 3 == 2:
        rms = float(np.sqrt(np.mean(audio ** 2)))
        audio = audio + (0.1 * rms * np.random.default_rng([99, i]).standard_normal(audio.size)).astype(np.float32)
    return audio.astype(np.float32)


@dataclass
class Window:
    """One decoded 30 s window: the prompt before it, the tokens chosen, and what decides each choice (pyggml: the
    encoded log-mel and the logit filter, to teacher-force; CTranslate2: its filtered logits per step)."""

    prompt: list[int]
    tokens: list[int]
    mel: np.ndarray | None = None
    logit_filter: object = None
    logits: np.ndarray | None = None


def pyggml_windows(w, audio: np.ndarray, padding: str) -> tuple[str, list[Window]]:
    """pyggml's greedy text and its windows, recorded around Whisper's encoder and decoding calls."""
    from tests.support.whisper_peers import join_segments

    windows, mel = [], []
    encode, decode = w.model.encode, w._decode_with_fallback

    def recording_encode(window):
        mel[:] = [np.array(window)]
        return encode(window)

    def recording_decode(flt, prefix, opts, rng):
        result = decode(flt, prefix, opts, rng)
        windows.append(Window(list(prefix), list(result.tokens), mel[0], flt))
        return result

    w.model.encode, w._decode_with_fallback = recording_encode, recording_decode
    try:
        segments = w.transcribe(audio, padding=padding, temperatures=(0.0,))
    finally:
        del w.model.encode, w._decode_with_fallback
    return join_segments(s.text for s in segments), windows


class _RecordingCT2:
    """CTranslate2's Whisper with every generate() asked for its filtered logits, and its windows kept."""

    def __init__(self, model):
        self.model, self.windows = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def generate(self, features, prompts, **kwargs):
        results = self.model.generate(features, prompts, return_logits_vocab=True, **kwargs)
        r = results[0]
        self.windows.append(Window(list(prompts[0]), list(r.sequences_ids[0]),
                                   logits=np.array([np.array(x) for x in r.logits[0]])))
        return results


def faster_whisper_windows(fw, audio: np.ndarray) -> tuple[str, list[Window]]:
    from tests.support.whisper_peers import join_segments

    model, fw.model = fw.model, _RecordingCT2(fw.model)
    try:
        segments = list(fw.transcribe(audio, language="en", beam_size=1, temperature=0.0)[0])
        windows = fw.model.windows
    finally:
        fw.model = model
    return join_segments(s.text for s in segments), windows


def forced_logprobs(w, window: Window) -> np.ndarray:
    """pyggml's log-probabilities for each of the window's tokens (row k: the choice of tokens[k]) along its own
    tokens, after the window's logit filter, as greedy decoding chose them."""
    from pyggml.models.whisper.decoding import log_softmax

    w.model.encode(window.mel)
    n = len(window.prompt)
    rows = [w.model.decode(window.prompt, np.arange(n))[0]]
    rows += [w.model.decode([t], [i])[0] for i, t in enumerate(window.tokens[:-1], n)]
    return np.array([log_softmax(window.logit_filter.apply(row.astype(np.float64), window.tokens[:k]))
                     for k, row in enumerate(rows)])


def first_difference(a: list[Window], b: list[Window]) -> tuple[int, int] | None:
    """(window, step) of the first token where two runs part (their windows having the same prompt), or None."""
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x.prompt != y.prompt:
            return None
        step = next((i for i, (s, t) in enumerate(zip(x.tokens, y.tokens, strict=False)) if s != t), None)
        if step is None and len(x.tokens) != len(y.tokens):
            step = min(len(x.tokens), len(y.tokens))
        if step is not None:
            return k, step
    return None


def choice(tok, step: int, pair: tuple[int, int], **logprobs: np.ndarray) -> dict:
    """One decoding step where two runs part: the two tokens and each run's log-probabilities of both."""
    name = [tok.decode([t]) if t < tok.eot else f"<|{t}|>" for t in pair]
    out = {"step": step, "tokens": name, "token_ids": list(pair)}
    for key, row in logprobs.items():
        out[key] = [round(float(row[t]), 4) for t in pair]
    return out


def token_at(window: Window, step: int, eot: int) -> int:
    return window.tokens[step] if step < len(window.tokens) else eot


def vs_faster_whisper(w_default, w_fw, default: list[Window], conv: list[Window], conv_text: str,
                      peer: list[Window], peer_text: str) -> dict:
    """Why pyggml's words differ from faster-whisper's: the convention step, then (if still different) the peer
    step; `explained_by` says which one accounts for the difference."""
    from pyggml.models.whisper.decoding import log_softmax
    from tests.support.whisper_peers import words

    tok = w_default.tokenizer
    out: dict = {"pyggml_fw_conventions": conv_text, "convention": None, "peer": None}
    at = first_difference(default, conv)
    if at is not None:
        k, step = at
        pair = (token_at(default[k], step, tok.eot), token_at(conv[k], step, tok.eot))
        out["convention"] = {"window": k, **choice(tok, step, pair,
                                                   default_logprobs=forced_logprobs(w_default, default[k])[step],
                                                   fw_conventions_logprobs=forced_logprobs(w_fw, conv[k])[step])}
    if words(conv_text) == words(peer_text):
        out["explained_by"] = "convention"
        return out
    at = first_difference(conv, peer)
    if at is None:
        out["explained_by"] = "unexplained: the runs' windows have different prompts"
        return out
    k, step = at
    pair = (token_at(conv[k], step, tok.eot), token_at(peer[k], step, tok.eot))
    out["peer"] = {"window": k, **choice(tok, step, pair, pyggml_logprobs=forced_logprobs(w_fw, conv[k])[step],
                                         faster_whisper_logprobs=log_softmax(peer[k].logits[step]))}
    out["explained_by"] = "peer near-tie"
    return out


def vs_whisper_cpp(w, bin_path: Path, samples: np.ndarray, tokens: list[int]) -> dict:
    """Teacher-forced along pyggml's tokens: KL per step, and the first text step where whisper.cpp's best
    text token is another one, with both engines' log-probabilities of the two."""
    from pyggml.models.whisper.decoding import log_softmax
    from tests.support import whisper_peers as peers

    prefix = w.tokenizer.sot_sequence(None)
    seq = prefix + tokens
    theirs = peers.whisper_cpp_logits(bin_path, samples, seq, len(prefix))
    ours = peers.teacher_forced_logits(w, samples, seq, len(prefix))
    p, q = (np.array([log_softmax(row) for row in x]) for x in (theirs, ours))
    kl = peers.kl_rows(theirs, ours)
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
    w = load_whisper("tiny.en", n_threads=2)
    w_fw = load_whisper("tiny.en", n_threads=2, audio_ctx_pad=FASTER_WHISPER["audio_ctx_pad"])
    bin_path = peers.ggml_bin("tiny.en", workdir)
    wc = Model(str(bin_path), n_threads=2, print_progress=False, print_realtime=False, temperature_inc=0.0,
               language="en")
    fw = WhisperModel(str(peers.ct2_dir("tiny.en", workdir)), device="cpu", compute_type="float32", cpu_threads=2)
    rows, errs = [], {"pyggml": [], "whisper.cpp": [], "faster-whisper": [], "pyggml_fw_conventions": []}
    for i, ref in enumerate(texts()[:args.n]):
        audio = sentence_audio(i, ref, workdir)
        text, default = pyggml_windows(w, audio, "whisper.cpp")
        conv_text, conv = pyggml_windows(w_fw, audio, FASTER_WHISPER["padding"])
        fw_text, fw_windows = faster_whisper_windows(fw, audio)
        found = {"pyggml": text, "whisper.cpp": peers.join_segments(s.text for s in wc.transcribe(audio)),
                 "faster-whisper": fw_text, "pyggml_fw_conventions": conv_text}
        row = {"i": i, "reference": ref, **found,
               "fw_conventions_same_tokens": [(x.prompt, x.tokens) for x in conv]
               == [(x.prompt, x.tokens) for x in fw_windows]}
        for k, t in found.items():
            errs[k].append((peers.wer(ref, t), len(peers.words(ref))))
        if peers.words(text) != peers.words(found["whisper.cpp"]):
            row["vs_whisper_cpp"] = vs_whisper_cpp(w, bin_path, audio, [t for x in default for t in x.tokens])
        if peers.words(text) != peers.words(fw_text):
            row["vs_faster_whisper"] = vs_faster_whisper(w, w_fw, default, conv, conv_text, fw_windows, fw_text)
        rows.append(row)
        print(f"{i:2d} pg {errs['pyggml'][-1][0]:.2f} wc {errs['whisper.cpp'][-1][0]:.2f} "
              f"fw {errs['faster-whisper'][-1][0]:.2f} pg-fw {errs['pyggml_fw_conventions'][-1][0]:.2f}"
              + "".join(f"\n    {k}: {json.dumps(row[k])}" for k in ("vs_whisper_cpp", "vs_faster_whisper")
                        if k in row), flush=True)
    total = {k: sum(e * n for e, n in v) / sum(n for _, n in v) for k, v in errs.items()}
    print("WER over the set (word errors / reference words): " + ", ".join(f"{k} {v:.4f}" for k, v in total.items()))
    for peer, key in (("whisper.cpp", "vs_whisper_cpp"), ("faster-whisper", "vs_faster_whisper")):
        print(f"sentences where pyggml's words differ from {peer}'s: {sum(key in r for r in rows)}")
    print(f"sentences where pyggml with faster-whisper's conventions chose faster-whisper's tokens, timestamps "
          f"included, in every window: {sum(r['fw_conventions_same_tokens'] for r in rows)} of {len(rows)}")
    print(explanation_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"wer": total, "sentences": rows}, indent=1))


def explanation_table(rows: list[dict]) -> str:
    """A markdown table of the sentences where pyggml's words differ from faster-whisper's."""
    def pair(d: dict | None, a: str, b: str) -> str:
        if d is None:
            return "-"
        return (f"w{d['window']} s{d['step']} {d['tokens'][0]!r}/{d['tokens'][1]!r}: "
                f"{d[a][0]:.2f}/{d[a][1]:.2f}; {d[b][0]:.2f}/{d[b][1]:.2f}")

    lines = ["| # | explained by | convention step: default; faster-whisper's conventions | "
             "peer step: pyggml; CTranslate2 |", "|---|---|---|---|"]
    for r in rows:
        d = r.get("vs_faster_whisper")
        if d:
            lines.append(f"| {r['i']} | {d['explained_by']} | "
                         f"{pair(d['convention'], 'default_logprobs', 'fw_conventions_logprobs')} | "
                         f"{pair(d['peer'], 'pyggml_logprobs', 'faster_whisper_logprobs')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
