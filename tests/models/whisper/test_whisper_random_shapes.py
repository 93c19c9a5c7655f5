"""The model shapes people download now, on random weights (tests/models/whisper/random_whisper.py): large-v3-turbo
(128 mel bins, 4 decoder layers, 51866 tokens), distil-large-v3 and distil-small.en (2 decoder layers). The small
variants with the same traits give whisper.cpp's greedy tokens (committed, data/random_refs.json) from the ggml
.bin and the GGUF alike; the per-step KL against whisper.cpp is checked live, and the exact shapes in a long run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyggml.models.whisper.decoding import log_softmax
from tests.models.whisper.random_whisper import REFERENCES, SMALL, SPEECH, greedy_steps, whisper_cpp_rows, write
from tests.models.whisper.test_whisper_transcribe import installed

REFS = json.loads(REFERENCES.read_text())


def _load(name: str, path, fmt: str = "ggml"):
    from pyggml.models.whisper.transcribe import load_whisper

    if not installed("base" if "turbo" in name or "large" in name else "tiny.en"):
        pytest.skip("the random models take their text tokens from the installed base / tiny.en")
    return load_whisper(str(write(name, path, fmt)), gelu="tanh")


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("fmt", ["ggml", "gguf"])
def test_small_variants_give_whisper_cpps_greedy_tokens(name, fmt, tmp_path):
    from pyggml.models.whisper.audio import load_audio

    w = _load(name, tmp_path / f"{name}.{fmt}", fmt)
    assert w.model.n_mels == (128 if "turbo" in name else 80)
    assert w.log_mel(load_audio(SPEECH))[0].shape[0] == w.model.n_mels
    prefix, tokens, _ = greedy_steps(w, load_audio(SPEECH))
    assert prefix == REFS[name]["prefix"]
    assert tokens == REFS[name]["whisper.cpp greedy"]


def _kl(ref_rows: np.ndarray, rows: np.ndarray) -> np.ndarray:
    p, q = log_softmax(ref_rows), log_softmax(rows)
    return np.sum(np.exp(p) * (p - q), axis=-1)


def _against_whisper_cpp(name: str, tmp_path) -> np.ndarray:
    from pyggml.models.whisper.audio import load_audio

    pytest.importorskip("pywhispercpp.model", reason="pywhispercpp (whisper.cpp) is not installed")
    samples = load_audio(SPEECH)
    w = _load(name, tmp_path / f"{name}.bin")
    prefix, tokens, rows = greedy_steps(w, samples)
    ref = whisper_cpp_rows(tmp_path / f"{name}.bin", samples, prefix, tokens)
    assert [int(np.argmax(r)) for r in ref] == tokens
    return _kl(ref, rows)


@pytest.mark.peer
@pytest.mark.parametrize("name", SMALL)
def test_small_variants_per_step_kl_against_whisper_cpp(name, tmp_path):
    kl = _against_whisper_cpp(name, tmp_path)
    assert kl.max() < 2e-3 and np.median(kl) < 5e-4


@pytest.mark.peer
@pytest.mark.long_only("writes and runs the exact shapes (distil-small.en 0.3 GB F16, large-v3-turbo 1.6 GB)")
@pytest.mark.parametrize("name", ["distil-small.en", "distil-large-v3", "large-v3-turbo"])
def test_exact_shapes_against_whisper_cpp(name, tmp_path):
    kl = _against_whisper_cpp(name, tmp_path)
    assert kl.max() < 2e-2 and np.median(kl) < 5e-3
