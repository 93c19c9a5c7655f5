"""Silero VAD on pyggml's graphs: probabilities against ONNX Runtime (committed, and live as a peer), against the
independent NumPy reference with random weights, streaming in pieces, and the weight files (ONNX, whisper.cpp's
ggml VAD file written and read back, and run by whisper.cpp itself)."""

from __future__ import annotations

from functools import lru_cache
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from pyggml.errors import AudioError, WhisperFileError
from tests.support.numpy_silero import silero_probs
from tests.support.vad_audio import clips

REFS = np.load(Path(__file__).parent / "data" / "silero_refs.npz")
CLIPS = ("en1", "synthetic", "mixed")


@lru_cache(maxsize=None)
def audio(name: str) -> np.ndarray:
    return clips()[name]


@lru_cache(maxsize=None)
def vad():
    from pyggml.models.vad.files import faster_whisper_onnx
    from pyggml.models.vad.silero import SileroVAD

    if faster_whisper_onnx() is None:
        pytest.skip("faster-whisper (its bundled silero_vad_v6.onnx) is not installed")
    pytest.importorskip("onnx")
    return SileroVAD()


def random_weights(seed: int = 0):
    """Silero-shaped weights of a plausible scale, for tests that need no installed model."""
    from pyggml.models.vad.files import CONV_CHANNELS, SileroWeights

    rng = np.random.default_rng(seed)

    def r(*shape, scale=0.1):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    return SileroWeights(stft_basis=r(258, 256), conv_w=[r(o, i, 3) for i, o in CONV_CHANNELS],
                         conv_b=[r(o) for _, o in CONV_CHANNELS], w_ih=r(512, 128), w_hh=r(512, 128),
                         b_ih=r(512), b_hh=r(512), dec_w=r(128, scale=0.5), dec_b=r(scale=0.5)).check()


@pytest.mark.parametrize("name", CLIPS)
def test_probabilities_equal_onnxruntime(name):
    """Real speech, a synthetic signal and speech with pauses and noise: within 1e-4 of ONNX Runtime's
    probabilities (committed by make_refs.py)."""
    probs = vad().probs(audio(name))
    ref = REFS[f"{name}.ort"]
    assert probs.shape == ref.shape
    assert np.abs(probs - ref).max() <= 1e-4


def test_graph_equals_numpy_reference_with_random_weights():
    """The graph (STFT convolution, four conv blocks, the LSTM unrolled over a block, the output layer) against
    the float64 NumPy reference, on weights of no installed model, across blocks of 5 windows."""
    from pyggml.models.vad.silero import SileroVAD

    w = random_weights()
    x = np.random.default_rng(1).standard_normal(512 * 12 + 100).astype(np.float32) * 0.3
    probs = SileroVAD(w, block=5).probs(x)
    ref = silero_probs(w, x)
    assert probs.shape == (13,) and np.abs(probs - ref).max() < 1e-5
    assert probs.std() > 0.05  # the weights say something, not a constant


def test_stream_in_pieces_equals_whole():
    """process() in uneven pieces continues the LSTM state and context: the same probabilities as the whole."""
    from pyggml.models.vad.silero import SileroVAD

    w = random_weights(3)
    x = np.random.default_rng(2).standard_normal(512 * 9).astype(np.float32) * 0.3
    v = SileroVAD(w, block=4)
    whole = v.probs(x)
    v.reset()
    cuts = [0, 100, 700, 701, 2600, x.size]
    parts = [v.process(x[a:b]) for a, b in pairwise(cuts)]
    assert [p.size for p in parts] == [0, 1, 0, 4, 4]
    np.testing.assert_allclose(np.concatenate(parts), whole, atol=1e-6)
    assert v.flush().size == 0


def test_ggml_vad_file_round_trip(tmp_path):
    """whisper.cpp's ggml VAD file: its converter's size for v6 (885,098 bytes), read back equal (F16 kernels
    rounded), and the probabilities from it close to the ONNX ones."""
    from pyggml.models.vad.files import load_silero, read_ggml_vad, write_ggml_vad
    from pyggml.models.vad.silero import SileroVAD

    w = vad().weights
    path = tmp_path / "ggml-silero-v6.bin"
    assert write_ggml_vad(w, path) == 885_098
    back = load_silero(path)
    np.testing.assert_array_equal(back.w_ih, w.w_ih)
    np.testing.assert_array_equal(back.conv_w[1], w.conv_w[1].astype(np.float16).astype(np.float32))
    assert float(back.dec_b) == float(w.dec_b) and back.version == w.version
    probs = SileroVAD(read_ggml_vad(path)).probs(audio("en1"))
    assert np.abs(probs - REFS["en1.ort"]).max() < 0.02


def test_bad_files_and_audio(tmp_path):
    from pyggml.models.vad.files import load_silero, write_ggml_vad

    with pytest.raises(WhisperFileError, match="no such file"):
        load_silero(tmp_path / "missing.onnx")
    path = tmp_path / "vad.bin"
    write_ggml_vad(random_weights(), path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(WhisperFileError, match="truncated"):
        load_silero(path)
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    pytest.importorskip("onnx")
    with pytest.raises(WhisperFileError, match="ONNX"):
        load_silero(tmp_path / "junk.onnx")
    from pyggml.models.vad.silero import SileroVAD
    with pytest.raises(AudioError, match="NaN"):
        SileroVAD(random_weights()).probs(np.array([0.0, np.nan] * 600, np.float32))


@pytest.mark.peer
@pytest.mark.parametrize("name", CLIPS)
def test_live_onnxruntime(name):
    pytest.importorskip("onnxruntime")
    from tests.support.numpy_silero import onnxruntime_probs

    from pyggml.models.vad.files import faster_whisper_onnx

    probs = vad().probs(audio(name))  # skips without faster-whisper
    ref = onnxruntime_probs(faster_whisper_onnx(), audio(name))  # the ONNX file the shipped weights came from
    assert np.abs(probs - ref).max() <= 1e-4


@pytest.mark.peer
def test_whisper_cpp_runs_our_ggml_file(tmp_path):
    """whisper.cpp loads pyggml's ggml VAD file; its probabilities are its own variant of the network (each
    window reflect-padded on both sides, no context) on these weights, as the NumPy reference computes it;
    the committed ones are what it said before."""
    pytest.importorskip("pywhispercpp")
    from pyggml.models.vad.files import read_ggml_vad, write_ggml_vad
    from tests.support.whisper_peers import whisper_cpp_vad

    path = tmp_path / "vad.bin"
    write_ggml_vad(vad().weights, path)
    probs, _ = whisper_cpp_vad(path, audio("mixed"))
    np.testing.assert_allclose(probs, REFS["mixed.wcpp_probs"], atol=1e-6)
    ref = silero_probs(read_ggml_vad(path), audio("mixed"), whisper_cpp=True)
    assert np.abs(probs - ref).max() < 0.01
