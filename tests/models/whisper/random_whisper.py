"""Random-weight Whisper models of the shapes people download now, for checking pyggml against whisper.cpp where
no such model is installable: large-v3-turbo (128 mel bins, 32 encoder and 4 decoder layers, the 51866-token
vocabulary of large-v3), distil-large-v3 (the same with 2 decoder layers) and distil-small.en (small's encoder,
2 decoder layers, English-only). Their exact shapes are large (turbo F16: 1.6 GB), so tests use small-width
variants with the same traits (128 mels, few decoder layers, the same vocabularies); the exact shapes are
written by the command below for a long run, as a whisper.cpp .bin, a GGUF or a CTranslate2 directory (F16
throughout, as faster-whisper's float16 downloads are).

    python -m tests.models.whisper.random_whisper NAME OUT [--format ggml|gguf|ct2] [--seed S]
    python -m tests.models.whisper.random_whisper --refs      # whisper.cpp's greedy tokens on the small variants
    python -m tests.models.whisper.random_whisper --mel-refs  # whisper.cpp's 128- and 80-bin log-mel of en1.wav

The references (data/random_refs.json) are whisper.cpp's (pywhispercpp 1.5.1) greedy tokens on en1.wav for the
small variants' F16 .bin, teacher-forced one token a call after the prefix: test_whisper_random_shapes.py checks
pyggml's greedy tokens against them, and the per-step KL live when pywhispercpp is installed.

The text tokens are the installed models' (base's for multilingual vocabularies, tiny.en's for English-only);
the special tokens follow from n_vocab. Weights: normal, scaled by 1/sqrt(fan-in) (norms near 1), with token and
text-position embeddings of 0.5 so that the logits spread about as a trained model's do (std about 4 at
width 64), and successive steps differ.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pyggml.models.whisper.hparams import WhisperHParams

LARGE_V3_TURBO = WhisperHParams(n_vocab=51866, n_audio_state=1280, n_audio_head=20, n_audio_layer=32,
                                n_text_state=1280, n_text_head=20, n_text_layer=4, n_mels=128)
SHAPES = {
    "large-v3-turbo": LARGE_V3_TURBO,
    "distil-large-v3": WhisperHParams(**{**LARGE_V3_TURBO.__dict__, "n_text_layer": 2}),
    "distil-small.en": WhisperHParams(n_vocab=51864, n_audio_state=768, n_audio_head=12, n_audio_layer=12,
                                      n_text_state=768, n_text_head=12, n_text_layer=2, n_mels=80),
    # small widths, the same traits: what the tests run
    "turbo-like": WhisperHParams(n_vocab=51866, n_audio_state=64, n_audio_head=2, n_audio_layer=2,
                                 n_text_state=64, n_text_head=2, n_text_layer=4, n_mels=128),
    "distil-like.en": WhisperHParams(n_vocab=51864, n_audio_state=64, n_audio_head=2, n_audio_layer=2,
                                     n_text_state=64, n_text_head=2, n_text_layer=2, n_mels=80),
}


def random_whisper(name: str, seed: int = 0):
    """A WhisperFile of SHAPES[name] with seeded random F32 weights (writers convert them to the file's types)."""
    from pyggml.core import GGMLType
    from pyggml.models.whisper.files import Weight, WhisperFile, expected_tensors
    from pyggml.models.whisper.reader import load_whisper_file
    from pyggml.models.whisper.tokenizer import n_text_tokens, special_tokens

    hp = SHAPES[name]
    text = load_whisper_file("base" if hp.is_multilingual else "tiny.en").vocab[:n_text_tokens(hp.n_vocab)]
    rng = np.random.default_rng(seed)
    tensors = {}
    for tensor, ne in expected_tensors(hp).items():
        shape = tuple(reversed(ne))
        if tensor.endswith("ln.weight") or tensor.endswith("ln_post.weight"):
            values = 1.0 + 0.1 * rng.standard_normal(shape)
        elif tensor == "decoder.token_embedding.weight":
            values = 0.5 * rng.standard_normal(shape)
        elif tensor == "decoder.positional_embedding":
            values = 2.0 * rng.standard_normal(shape)
        elif tensor.endswith(".weight"):
            fan_in = ne[0] * (ne[1] if len(ne) == 3 else 1)
            values = rng.standard_normal(shape) / np.sqrt(fan_in)
        else:                                   # biases, the encoder's positional embedding
            values = 0.1 * rng.standard_normal(shape)
        tensors[tensor] = Weight.from_float(GGMLType.F32, values.astype(np.float32))
    return WhisperFile(hparams=hp, tensors=tensors, vocab=list(text) + special_tokens(hp.n_vocab))


def write(name: str, path: Path, fmt: str = "ggml", seed: int = 0) -> Path:
    """The random model as an F16 whisper.cpp .bin, GGUF or CTranslate2 directory (``path`` then a folder)."""
    from pyggml.models.whisper.ct2 import write_ct2
    from pyggml.models.whisper.ggml_bin import write_ggml_bin
    from pyggml.models.whisper.gguf_whisper import write_gguf

    {"ggml": write_ggml_bin, "gguf": write_gguf, "ct2": write_ct2}[fmt](random_whisper(name, seed), path)
    return path


SMALL = ("turbo-like", "distil-like.en")
REFERENCES = Path(__file__).resolve().parent / "data" / "random_refs.json"
MEL_REFERENCES = Path(__file__).resolve().parent / "data" / "whisper_cpp_mel.npz"
MEL_FRAME_STEP = 8  # every 8th frame of whisper.cpp's log-mel is committed
SPEECH = Path(__file__).resolve().parents[2] / "data" / "speech" / "en1.wav"
STEPS = 12


def greedy_steps(w, samples, steps: int = STEPS) -> tuple[list[int], list[int], np.ndarray]:
    """(prefix, greedy tokens, each step's logits) of a loaded Whisper on the first window of samples, without
    timestamps or suppression: the decoder alone, as whisper.cpp's teacher-forced logits are compared with."""
    mel, _ = w.log_mel(samples)
    w.model.encode(mel[:, :3000])
    prefix = w.tokenizer.sot_sequence("en" if w.is_multilingual else None, "transcribe", False)
    tokens, rows = list(prefix), []
    for i in range(steps):
        if i == 0:
            logits = w.model.decode(tokens, np.arange(len(tokens)))[0]
        else:
            logits = w.model.decode([tokens[-1]], [len(tokens) - 1])[0]
        rows.append(logits)
        tokens.append(int(np.argmax(logits)))
    return prefix, tokens[len(prefix):], np.array(rows)


def whisper_cpp_rows(bin_path: Path, samples, prefix: list[int], tokens: list[int]) -> np.ndarray:
    """whisper.cpp's logits for the same steps, its prefix fed one token a call (see docs/whisper.md: its
    several-token call differs from its own one-token calls by a KL of 3e-3 to 6e-3 on these weights)."""
    from tests.support.whisper_peers import whisper_cpp_logits

    rows = whisper_cpp_logits(bin_path, samples, prefix + tokens, 1)
    return rows[len(prefix) - 1:len(prefix) - 1 + len(tokens)]


def make_refs() -> None:
    import json
    import tempfile

    from pyggml.models.whisper.audio import load_audio
    from pyggml.models.whisper.transcribe import load_whisper

    samples, refs = load_audio(SPEECH), {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SMALL:
            path = write(name, Path(tmp) / f"{name}.bin")
            prefix, tokens, _ = greedy_steps(load_whisper(str(path), gelu="tanh"), samples)
            rows = whisper_cpp_rows(path, samples, prefix, tokens)
            refs[name] = {"prefix": prefix, "whisper.cpp greedy": [int(np.argmax(r)) for r in rows]}
    REFERENCES.write_text(json.dumps(refs, indent=1) + "\n")
    print(refs)


def make_mel_refs() -> None:
    """whisper.cpp's log-mel of en1.wav (every MEL_FRAME_STEP-th frame), 128 bins through turbo-like's .bin and
    80 through distil-like.en's: the filters are the file's (pyggml writes the Slaney filters into it)."""
    import tempfile

    from pyggml.models.whisper.audio import load_audio
    from tests.support.whisper_peers import whisper_cpp_mel

    samples, refs = load_audio(SPEECH), {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SMALL:
            mel = whisper_cpp_mel(write(name, Path(tmp) / f"{name}.bin"), samples)
            refs[f"mel_{mel.shape[0]}"] = mel[:, ::MEL_FRAME_STEP]
    np.savez_compressed(MEL_REFERENCES, **refs)
    print({k: v.shape for k, v in refs.items()})


if __name__ == "__main__":
    import sys

    if sys.argv[1:] in (["--refs"], ["--mel-refs"]):
        make_refs() if sys.argv[1] == "--refs" else make_mel_refs()
        sys.exit()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--format", choices=["ggml", "gguf", "ct2"], default="ggml")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    write(a.name, a.out, a.format, a.seed)
