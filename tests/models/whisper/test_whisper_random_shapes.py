"""The model shapes people download now, on random weights (tests/models/whisper/random_whisper.py): large-v3-turbo
(128 mel bins, 4 decoder layers, 51866 tokens), distil-large-v3 and distil-small.en (2 decoder layers). The small
variants with the same traits give whisper.cpp's greedy tokens (committed, data/random_refs.json) from the ggml
.bin, the GGUF and a CTranslate2 directory alike; the per-step KL against whisper.cpp is checked live, and the
exact shapes in a long run. CTranslate2 itself loads the directory pyggml writes and gives pyggml's logits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyggml.models.whisper.decoding import log_softmax
from pyggml.core import GGMLType
from tests.models.whisper.random_whisper import (
    REFERENCES, SMALL, SPEECH, STEPS, greedy_steps, whisper_cpp_rows, write)
from tests.models.whisper.test_whisper_transcribe import installed

REFS = json.loads(REFERENCES.read_text())


def _load(name: str, path, fmt: str = "ggml", **options):
    from pyggml.models.whisper.transcribe import load_whisper

    if not installed("base" if "turbo" in name or "large" in name else "tiny.en"):
        pytest.skip("the random models take their text tokens from the installed base / tiny.en")
    return load_whisper(str(write(name, path, fmt)), **{"gelu": "tanh", **options})


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


@pytest.mark.parametrize("name", SMALL)
def test_small_variants_from_ctranslate2_decode_as_the_bin(name, tmp_path):
    """The same random weights as a CTranslate2 directory (F16 throughout, q|k|v fused) and as a whisper.cpp .bin
    (norms and biases F32): the matrices arrive byte for byte, the decoder's steps agree to the F16 rounding of
    the norms and biases, and the greedy tokens are whisper.cpp's."""
    from pyggml.models.whisper.audio import load_audio
    from pyggml.models.whisper.reader import load_whisper_file

    ct2, binf = _load(name, tmp_path / name, "ct2"), _load(name, tmp_path / f"{name}.bin")
    ct2_file, bin_file = load_whisper_file(tmp_path / name), load_whisper_file(tmp_path / f"{name}.bin")
    assert ct2_file.format == "ct2" and ct2_file.hparams == bin_file.hparams
    for tensor, w in bin_file.tensors.items():
        if w.type != GGMLType.F32:
            assert ct2_file.tensors[tensor].type == w.type and np.array_equal(ct2_file.tensors[tensor].data, w.data)
    samples = load_audio(SPEECH)
    prefix, tokens, rows = greedy_steps(ct2, samples)
    assert prefix == REFS[name]["prefix"] and tokens == REFS[name]["whisper.cpp greedy"]
    assert _kl(greedy_steps(binf, samples)[2], rows).max() < 1e-5


def _against_ctranslate2(name: str, tmp_path) -> np.ndarray:
    """Per-step KL(CTranslate2 || pyggml) on the CTranslate2 directory pyggml writes, CTranslate2's greedy tokens
    checked equal to pyggml's; pyggml attends over the 1500 audio positions alone, as CTranslate2 does."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="CTranslate2 (faster-whisper) is not installed")
    from pyggml.models.whisper.audio import load_audio

    w = _load(name, tmp_path / name, "ct2", gelu="erf", audio_ctx_pad=1)
    samples = load_audio(SPEECH)
    prefix, tokens, rows = greedy_steps(w, samples)
    peer = ctranslate2.models.Whisper(str(tmp_path / name), device="cpu", compute_type="float32", intra_threads=2)
    mel = ctranslate2.StorageView.from_array(np.ascontiguousarray(w.log_mel(samples)[0][None, :, :3000]))
    out = peer.generate(mel, [prefix], beam_size=1, max_length=2 * STEPS, return_logits_vocab=True,  # half: steps
                        suppress_blank=False, suppress_tokens=[])[0]
    assert out.sequences_ids[0] == tokens
    return _kl(np.array(out.logits[0]), rows)


@pytest.mark.peer
@pytest.mark.parametrize("name", SMALL)
def test_ctranslate2_loads_the_written_directory(name, tmp_path):
    """CTranslate2 (faster-whisper's engine) on the directory pyggml writes: the same greedy tokens and logits."""
    assert _against_ctranslate2(name, tmp_path).max() < 1e-6


@pytest.mark.peer
@pytest.mark.long_only("writes the exact shapes as CTranslate2 directories (distil-small.en 0.3 GB F16, "
                       "large-v3-turbo 1.6 GB)")
@pytest.mark.parametrize("name", ["distil-small.en", "distil-large-v3", "large-v3-turbo"])
def test_exact_shapes_through_ctranslate2(name, tmp_path):
    assert _against_ctranslate2(name, tmp_path).max() < 1e-4


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
