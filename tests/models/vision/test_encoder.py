"""The SigLIP encoder and its projectors against the float64 NumPy reference (reference.py), and the mmproj reader's
refusals."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from pyggml.core import GGMLType
from pyggml.errors import GGUFError
from pyggml.models.vision.encoder import VisionEncoder
from pyggml.testing.synthetic_vision import TINY_GEMMA3, TINY_IDEFICS3, write_mmproj

from tests.models.vision.reference import encode, read_mmproj

PROJECTORS = {"idefics3": TINY_IDEFICS3, "gemma3": TINY_GEMMA3}


@pytest.mark.parametrize("flash_attn", [False, True], ids=["plain", "flash"])
@pytest.mark.parametrize("qtype", [None, Q.F16, Q.Q8_0], ids=["f32", "f16", "q8_0"])
@pytest.mark.parametrize("projector", list(PROJECTORS))
def test_encoder_matches_the_numpy_reference(tmp_path, projector, qtype, flash_attn):
    path = write_mmproj(tmp_path / "mmproj.gguf", **PROJECTORS[projector], qtype=qtype)
    pixels = np.random.default_rng(0).normal(size=(3, 32, 32)).astype(np.float32)
    encoder = VisionEncoder(path, flash_attn=flash_attn)
    got = encoder.encode(pixels)
    want = encode(*read_mmproj(path), pixels.astype(np.float64))
    assert got.shape == want.shape == (4, 64) == (encoder.n_tokens, encoder.n_embd_out)
    # ggml's gelu reads an F16 table, flash attention F16 keys and values, quantized weights Q8_0 activations
    bound = 3e-2 if qtype is not None else 1e-2 if flash_attn else 2e-3
    assert np.abs(got - want).max() / np.abs(want).max() < bound
    if qtype is not None:  # the matrices stay in the file's type
        assert encoder.weights.tensors["v.blk.0.attn_q.weight"].type == GGMLType(int(qtype))


def test_compute_buffer_is_planned_once_and_reused(tmp_path):
    encoder = VisionEncoder(write_mmproj(tmp_path / "m.gguf", **TINY_IDEFICS3))
    size = encoder.compute_buffer_size
    pixels = np.zeros((3, 32, 32), np.float32)
    first = encoder.encode(pixels)
    assert np.array_equal(first, encoder.encode(pixels)) and encoder.compute_buffer_size == size > 0


@pytest.mark.parametrize("change, message", [
    (dict(drop=("clip.vision.patch_size",)), "clip.vision.patch_size"),
    (dict(drop=("mm.model.fc.weight",)), "mm.model.fc.weight"),
    (dict(scale_factor=1), "scale_factor"),
    (dict(projector="qwen2vl_merger"), "projector type 'qwen2vl_merger' is not supported"),
])
def test_bad_mmproj_files_are_refused_naming_what_is_wrong(tmp_path, change, message):
    path = write_mmproj(tmp_path / "bad.gguf", **{**TINY_IDEFICS3, **change})
    with pytest.raises(GGUFError, match=message):
        VisionEncoder(path)
