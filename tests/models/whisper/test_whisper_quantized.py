"""Quantized Whisper on the CPU's integer path: `pyggml convert --type q8_0|q5_0|...` files, their matrices (the
tied head too) interleaved for the integer products; logits against the same weights multiplied in float, greedy
texts against the float model's and against whisper.cpp's on the same quantized files (committed references,
`python -m tests.support.whisper_peers`), per-step KL against whisper.cpp's logits (peer)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from tests.models.whisper.test_whisper_transcribe import ENGLISH, GREEDY, REFS, SPEECH, installed, transcript
from pyggml.backend.cpu.interleave import has_int8_products
from pyggml.backend.cpu.jit.ir.vnni_ir import ROWS
from pyggml.backend.cpu.kernels._common import INTERLEAVED
from pyggml.core import GGMLType

pytestmark = pytest.mark.skipif(not installed("tiny.en"), reason="Whisper tiny.en is not installed")
QUANTIZED = ["q8_0", "q5_0"]            # checked against whisper.cpp
WRITE_TYPES = ["q8_0", "q5_0", "q5_1", "q4_0", "q4_1"]   # every quantized type `pyggml convert` writes
# Where pyggml's greedy text on a quantized file is not the float model's, though it is whisper.cpp's on that
# file, and the same weights multiplied in float say it too: the weights' rounding moves the words, not the
# integer products. en4: " damage" -0.98 against " average" -2.36 (log-prob) in float, -1.82 against -1.43 in Q5_0.
WEIGHTS_MOVE = [("q5_0", "en3.wav"), ("q5_0", "en4.wav")]
# Q8_0 on en3 is neither: at its 5th token pyggml says " Village" (log-prob -0.679) over " village" (-0.728),
# whisper.cpp (teacher-forced on the same tokens) " village" (-0.692) over " Village" (-0.714); the words after
# follow from it. The float model says " Village" too.
NEAR_TIE = ("q8_0", "en3.wav")
STEPS = 12   # decoder steps the logits are compared over


class QuantizedModels:
    """tiny.en's files as `pyggml convert --type` writes them (whisper.cpp's .bin) in `workdir`, each loaded once."""

    def __init__(self, workdir: Path):
        self.workdir, self.loaded = workdir, {}

    def path(self, type_name: str) -> Path:
        from tests.support.whisper_peers import ggml_bin
        return ggml_bin("tiny.en", self.workdir, type_name.upper())

    def __call__(self, type_name: str, f32: bool = False):
        from pyggml.models.whisper.transcribe import load_whisper

        if (type_name, f32) not in self.loaded:
            self.loaded[type_name, f32] = load_whisper(self.path(type_name), f32=f32)
        return self.loaded[type_name, f32]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> QuantizedModels:
    return QuantizedModels(tmp_path_factory.mktemp("quantized-whisper"))


def text_of(w, name: str) -> str:
    return " ".join(s.text.strip() for s in w.transcribe(str(SPEECH / name), **GREEDY))


@pytest.mark.parametrize("type_name", WRITE_TYPES)
def test_convert_writes_whisper_cpps_quantized_files(type_name, tmp_path):
    """The CLI writes whisper.cpp's layout: matrices in the type, conv kernels F16, the rest F32, and the
    header's ftype as whisper.cpp's quantize stores it (ggml_ftype + 1000 · GGML_QNT_VERSION)."""
    from pyggml.cli.main import main as cli
    from pyggml.models.whisper.files import layout_type
    from pyggml.models.whisper.reader import load_whisper_file

    out = tmp_path / f"tiny-{type_name}.bin"
    assert cli(["convert", "tiny.en", str(out), "--type", type_name]) == 0
    wtype = GGMLType[type_name.upper()]
    model = load_whisper_file(out)
    for name, w in model.tensors.items():
        assert w.type == layout_type(name, w.ne, wtype), name
    ftype = struct.unpack("<11i", out.read_bytes()[4:48])[-1]
    assert ftype == 2000 + {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9}[type_name]


@pytest.mark.skipif(not has_int8_products(), reason="the integer products need AVX-512 VNNI or AVX2")
@pytest.mark.parametrize("type_name", WRITE_TYPES)
def test_matrices_and_head_are_interleaved(type_name, quantized):
    """Every quantized matrix, encoder and decoder, and the tied head (51864 rows, padded with 8 zero rows to
    whole 16-row groups; whole 8-row groups already on AVX2) is in CPU_INTERLEAVED; conv kernels, norms and biases
    are not; `f32` keeps none."""
    from pyggml.models.whisper.files import is_matrix

    model = quantized(type_name).model
    tensors = model.weights.tensors
    wtype = GGMLType[type_name.upper()]
    matrices = {n for n, t in tensors.items() if is_matrix(n, tuple(t.ne[:2])) and t.type == wtype}
    assert len(matrices) == 4 * 6 + 4 * 10 + 1
    assert {n for n, t in tensors.items() if t.extra is INTERLEAVED} == matrices
    pad = -model.n_vocab % ROWS
    assert model.weights.head_padding == pad and model.tok_emb.ne[1] == model.n_vocab + pad
    assert not any(t.extra is INTERLEAVED for t in quantized(type_name, f32=True).model.weights.tensors.values())


@pytest.mark.skipif(not has_int8_products(), reason="the integer products need AVX-512 VNNI or AVX2")
@pytest.mark.parametrize("type_name", WRITE_TYPES)
def test_integer_path_logits_match_the_same_weights_in_float(type_name, quantized):
    """Encoder and decoder on the integer path against the same file's weights expanded to F32 (float products),
    teacher-forced along the first tokens of en2's text, the padded head's logits cut to n_vocab. Each product is
    within test-backend-ops' 5e-4 NMSE (tests/backend/cpu/test_interleave.py); through the encoder, 8 layers and
    the head, measured along the float path's 33 greedy steps: per-step KL median 1.7e-5 (Q5_0) and 3.3e-5
    (Q8_0), max 1.8e-3; logits' NMSE median 2.1e-4 and 3.9e-4."""
    from tests.support.whisper_peers import kl_rows, teacher_forced_logits
    from pyggml.models.whisper.audio import load_audio

    ints, floats = quantized(type_name), quantized(type_name, f32=True)
    samples = load_audio(SPEECH / "en2.wav")
    prefix = ints.tokenizer.sot_sequence(None)
    tokens = prefix + ints.tokenizer.encode(" " + transcript("tiny.en", "en2.wav"))[:STEPS]
    want = teacher_forced_logits(floats, samples, tokens, len(prefix))
    got = teacher_forced_logits(ints, samples, tokens, len(prefix))
    assert got.shape == want.shape == (STEPS + 1, ints.model.n_vocab)
    kl, nmse = kl_rows(want, got), ((got - want) ** 2).mean(-1) / (want ** 2).mean(-1)
    assert np.median(kl) < 1e-4 and kl.max() < 5e-3 and np.median(nmse) < 1e-3, (np.median(kl), kl.max())


@pytest.mark.parametrize("type_name, name", [(t, n) for t in QUANTIZED for n in ENGLISH if (t, n) != NEAR_TIE])
def test_greedy_text_is_whisper_cpps_on_the_same_file(type_name, name, quantized):
    """pyggml's greedy text on a quantized file is whisper.cpp's on that file (committed), and the float model's
    but for WEIGHTS_MOVE."""
    text = text_of(quantized(type_name), name)
    assert text == REFS["whisper.cpp"][f"tiny.en-{type_name}"]["1"][name]
    assert (text == transcript("tiny.en", name)) == ((type_name, name) not in WEIGHTS_MOVE)


@pytest.mark.parametrize("type_name, name", WEIGHTS_MOVE)
def test_the_weights_not_the_integer_products_move_the_words(type_name, name, quantized):
    """Where a quantized file's text is not the float model's (WEIGHTS_MOVE), its weights multiplied in float
    (`f32`) give the integer path's text."""
    assert text_of(quantized(type_name, f32=True), name) == text_of(quantized(type_name), name)


@pytest.mark.skipif(not has_int8_products(), reason="the near-tie is the integer path's")
def test_q8_0_en3_is_a_near_tie(quantized):
    """NEAR_TIE: where pyggml's Q8_0 text on en3 may part from whisper.cpp's, its two best tokens are " Village"
    and " village", under 0.1 apart in log-probability (whisper.cpp's are the same two, 0.02 apart): on one CPU
    pyggml's choice is " Village" (0.05 ahead), on another " village"."""
    from tests.support.whisper_peers import greedy_tokens, teacher_forced_logits
    from pyggml.models.whisper.audio import load_audio
    from pyggml.models.whisper.decoding import log_softmax

    w = quantized("q8_0")
    samples = load_audio(SPEECH / "en3.wav")
    tokens, n_prefix = greedy_tokens(w, samples), len(w.tokenizer.sot_sequence(None))
    tie = {" Village", " village"}
    step = next(i for i, t in enumerate(tokens[n_prefix:]) if w.tokenizer.decode([t]) in tie)
    logp = log_softmax(teacher_forced_logits(w, samples, tokens[:n_prefix + step], n_prefix)[-1])
    best = np.argsort(logp)[::-1][:2]
    assert {w.tokenizer.decode([int(t)]) for t in best} == tie  # which side wins varies with the CPU's kernels
    assert logp[best[0]] - logp[best[1]] < 0.1


@pytest.mark.peer
@pytest.mark.parametrize("type_name", QUANTIZED)
def test_logits_agree_with_whisper_cpp_on_the_same_file(type_name, quantized):
    """Teacher-forced logits along pyggml's greedy tokens (en1, en4) against whisper.cpp's on the same quantized
    file. Measured median KL 1.2e-4 to 1.9e-4, max 6e-4 to 2.5e-3 (F16 file: median 6e-6 to 1.3e-5): both sides
    round their activations to Q8_0 before every product, so a float difference of the last bit upstream
    (summation order) can move a value across a rounding step of 1/127 of its block's largest."""
    pytest.importorskip("pywhispercpp")
    from tests.support.whisper_peers import teacher_forced_kl
    from pyggml.models.whisper.audio import load_audio

    for name in ("en1.wav", "en4.wav"):
        kl = teacher_forced_kl(quantized(type_name), quantized.path(type_name), load_audio(SPEECH / name))
        assert np.median(kl) < 5e-4 and kl.max() < 1e-2, (name, np.median(kl), kl.max())


def test_without_vnni_quantized_weights_stay_in_the_file(monkeypatch, quantized):
    """On a CPU without AVX-512 VNNI nothing is interleaved (nor padded), and the float products give the text."""
    from pyggml.backend.cpu import interleave
    from pyggml.models.whisper.transcribe import load_whisper

    monkeypatch.setattr(interleave, "has_int8_products", lambda: False)
    w = load_whisper(quantized.path("q8_0"))
    assert w.model.weights.head_padding == 0 and w.model.tok_emb.ne[1] == w.model.n_vocab
    assert not any(t.extra is INTERLEAVED for t in w.model.weights.tensors.values())
    assert text_of(w, "en1.wav") == REFS["whisper.cpp"]["tiny.en-q8_0"]["1"]["en1.wav"]
