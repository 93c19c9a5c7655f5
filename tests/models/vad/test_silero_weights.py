"""The Silero VAD weights pyggml ships (so `--vad` works with the whisper extra alone) are exactly the ones in
faster-whisper's bundled ONNX file, and load without onnx."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pyggml.errors import WhisperFileError
from pyggml.models.vad.files import SHIPPED, faster_whisper_onnx, load_silero


def test_the_shipped_weights_equal_the_onnx_ones():
    pytest.importorskip("onnx")
    source = faster_whisper_onnx()
    if source is None:
        pytest.skip("faster-whisper (its bundled silero_vad_v6.onnx) is not installed")
    from pyggml.models.vad.files import read_silero_onnx

    shipped, onnx_weights = load_silero(), read_silero_onnx(source)
    assert shipped.source == str(SHIPPED) and shipped.version == onnx_weights.version
    for name in ("stft_basis", "w_ih", "w_hh", "b_ih", "b_hh", "dec_w", "dec_b"):
        np.testing.assert_array_equal(getattr(shipped, name), getattr(onnx_weights, name), err_msg=name)
    for mine, theirs in zip(shipped.conv_w + shipped.conv_b, onnx_weights.conv_w + onnx_weights.conv_b, strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_the_default_weights_load_without_onnx_or_faster_whisper():
    code = ("import sys; sys.modules['onnx'] = None; sys.modules['faster_whisper'] = None\n"
            "from pyggml.models.vad.files import load_silero\n"
            "print(load_silero().w_ih.shape)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(512, 128)"


def test_a_damaged_npz_is_named(tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, stft_basis=np.zeros((258, 256), np.float32))
    with pytest.raises(WhisperFileError, match=r"bad.npz: not a Silero VAD .npz"):
        load_silero(bad)
