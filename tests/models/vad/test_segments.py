"""Speech segments from probabilities (whisper.cpp's and faster-whisper's rules), the speech-only audio and its
time map, `transcribe(vad=True)` and `pyggml vad`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyggml.errors import WhisperError
from pyggml.models.vad.segments import SpeechAudio, VadOptions, speech_segments

REFS = np.load(Path(__file__).parent / "data" / "silero_refs.npz")
W = 512


def test_whisper_cpp_segments_from_its_own_probabilities():
    """whisper.cpp's probabilities on the mixed clip -> the segments whisper.cpp cut from them (to its 10 ms)."""
    probs = REFS["mixed.wcpp_probs"]
    segs = speech_segments(probs, probs.size * W, VadOptions.whisper_cpp())
    np.testing.assert_allclose(np.array(segs) / 16000, REFS["mixed.wcpp_segments"], atol=0.006)


@pytest.mark.parametrize("name", ["en1", "synthetic", "mixed"])
def test_faster_whisper_segments_from_onnxruntime_probabilities(name):
    """faster-whisper's defaults on ONNX Runtime's probabilities -> faster-whisper's segments, sample for sample."""
    from tests.support.vad_audio import clips

    probs = REFS[f"{name}.ort"]
    n = clips()[name].size
    segs = speech_segments(probs, n, VadOptions.faster_whisper())
    assert segs == [tuple(s) for s in REFS[f"{name}.fw_segments"].tolist()]


def test_rules_on_made_up_probabilities():
    """Start at >= threshold; a dip below neg_threshold shorter than min_silence does not end speech; short
    speech is dropped; padding; whisper.cpp's merge of close segments; a hard cut at max_speech (which
    whisper.cpp's merge of segments less than 200 ms apart joins again, as in whisper.cpp)."""
    p = np.zeros(100)
    p[10:30] = 0.9
    p[32:50] = 0.9          # a 2-window (64 ms) dip: under min_silence 100 ms
    p[60:62] = 0.9          # 64 ms of speech: under min_speech 250 ms
    p[80:95] = 0.9
    opts = VadOptions.whisper_cpp(speech_pad_ms=0)
    assert speech_segments(p, 100 * W, opts) == [(10 * W, 50 * W), (80 * W, 95 * W)]
    padded = speech_segments(p, 100 * W, VadOptions.whisper_cpp(speech_pad_ms=30))
    assert padded == [(10 * W - 480, 50 * W + 480), (80 * W - 480, 95 * W + 480)]
    q = np.zeros(60)
    q[5:20], q[25:40] = 0.9, 0.9         # 5 windows (160 ms) apart: merged by whisper.cpp, not faster-whisper
    assert speech_segments(q, 60 * W, VadOptions.whisper_cpp(speech_pad_ms=0)) == [(5 * W, 40 * W)]
    assert len(speech_segments(q, 60 * W, VadOptions.faster_whisper(min_silence_ms=100, speech_pad_ms=0))) == 2
    long = np.full(200, 0.9)
    cut = speech_segments(long, 200 * W, VadOptions.faster_whisper(max_speech_s=2.0, speech_pad_ms=0))
    assert len(cut) >= 2 and all(b - a <= 2 * 16000 for a, b in cut)
    assert speech_segments(np.full(10, 0.4), 10 * W) == []


def test_bad_options():
    for bad in (dict(threshold=1.5), dict(min_speech_ms=-1), dict(max_speech_s=0), dict(neg_threshold=0.9)):
        with pytest.raises(WhisperError, match="VAD"):
            VadOptions.whisper_cpp(**bad)


def test_speech_audio_maps_times_back():
    """Segments laid end to end with 0.1 s overlap and 0.1 s of zeros; times map back piecewise linearly, and a
    time between two segments is the next one's start as a start, the previous one's end as an end."""
    audio = np.arange(10 * 16000, dtype=np.float32)
    sa = SpeechAudio(audio, [(16000, 32000), (80000, 96000)], samples_overlap=0.1)
    assert sa.audio.size == 16000 + 1600 + 1600 + 16000
    assert sa.audio[0] == 16000 and sa.audio[16000 + 1600 + 1600] == 80000
    assert np.all(sa.audio[17600:19200] == 0)
    assert sa.original_time(0.0) == 1.0 and sa.original_time(0.5) == 1.5
    assert sa.original_time(1.05, end=True) == 2.0 and sa.original_time(1.15, end=True) == 2.0
    assert sa.original_time(1.05) == 5.0 and sa.original_time(1.15) == 5.0
    assert sa.original_time(1.2) == 5.0 and sa.original_time(1.7) == 5.5
    assert SpeechAudio(audio, []).audio.size == 0


def test_faster_whisper_options_join_segments_without_a_gap():
    """faster-whisper's collect_chunks joins the speech with nothing between: with its options the speech audio
    is the segments' samples end to end, read through its front end; times still map back per segment."""
    audio = np.arange(10 * 16000, dtype=np.float32)
    opts = VadOptions.faster_whisper()
    assert (opts.gap_s, opts.samples_overlap, opts.padding) == (0.0, 0.0, "faster-whisper")
    assert VadOptions.whisper_cpp().gap_s == 0.1 and VadOptions.whisper_cpp().padding == "whisper.cpp"
    segments = [(16000, 32000), (80000, 96000)]
    sa = SpeechAudio(audio, segments, opts.samples_overlap, 0.0, opts.gap_s)
    np.testing.assert_array_equal(sa.audio, np.concatenate([audio[a:b] for a, b in segments]))
    assert sa.original_time(0.5) == 1.5 and sa.original_time(1.5) == 5.5
    assert sa.original_span(1.2, 1.8) == (5.2, 5.8)
    with pytest.raises(WhisperError, match="padding"):
        VadOptions.faster_whisper(padding="openai")
    with pytest.raises(WhisperError, match="gap_s"):
        VadOptions.whisper_cpp(gap_s=-0.1)


def test_transcribe_with_vad_decodes_speech_only_and_maps_times():
    """The mixed clip (silence, en2, noise, en3, silence): the same words as without VAD, segment times inside
    the speech, and the VAD's share of the time reported; silence alone gives nothing."""
    from tests.models.whisper.test_whisper_transcribe import whisper
    from tests.support.vad_audio import mixed
    from tests.support.whisper_peers import wer

    w = whisper("tiny.en")
    x = mixed()
    try:
        w.vad()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no Silero VAD weights: {e}")
    plain = " ".join(s.text for s in w.transcribe(x, temperatures=(0.0,)))
    segs = w.transcribe(x, vad=True, temperatures=(0.0,))
    text = " ".join(s.text for s in segs)
    assert wer(plain, text) < 0.1
    assert segs[0].start >= 1.0 and segs[-1].end <= x.size / 16000 - 0.5
    assert w.timings.vad_s > 0 and w.timings.audio_s == pytest.approx(x.size / 16000)
    assert w.transcribe(np.zeros(16000 * 3, np.float32), vad=True) == []


def test_cli_vad_prints_segments(capsys, tmp_path):
    from pyggml.cli.main import main
    from tests.models.vad.test_silero import vad

    vad()
    speech = Path(__file__).resolve().parents[2] / "data" / "speech" / "en1.wav"
    assert main(["vad", str(speech), "--vad-defaults", "faster-whisper"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("Speech segment 0: start = 0.00") and "1 speech segment(s)" in err
    assert main(["vad", "--write-ggml", str(tmp_path / "vad.bin")]) == 0
    assert (tmp_path / "vad.bin").stat().st_size == 885_098


def test_transcribe_vad_cuts_with_faster_whisper_rules_by_default(monkeypatch):
    """transcribe(vad=True) and `transcribe --vad` cut with faster-whisper's rules (400 ms padding), which keep
    each segment's first sounds that whisper.cpp's 30 ms lose (WER 0.113 against 0.151 on the long benchmark);
    `pyggml vad` keeps whisper.cpp's defaults, and either can be asked for."""
    import pyggml.models.vad.segments as segments
    from pyggml.cli.main import build_parser
    from pyggml.cli.vad import vad_options
    from tests.models.whisper.test_whisper_transcribe import whisper

    seen = []
    monkeypatch.setattr(segments, "speech_segments", lambda probs, n, opts: seen.append(opts) or [])
    w = whisper("tiny.en")
    try:
        w.vad()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no Silero VAD weights: {e}")
    assert w.transcribe(np.zeros(16000, np.float32), vad=True) == []
    assert seen == [VadOptions.faster_whisper()] and seen[0].speech_pad_ms == 400
    parse = build_parser().parse_args
    assert vad_options(parse(["transcribe", "a.wav", "--vad"])) == VadOptions.faster_whisper()
    assert vad_options(parse(["transcribe", "a.wav", "--vad", "--vad-defaults", "whisper.cpp"])) == \
        VadOptions.whisper_cpp()
    assert vad_options(parse(["vad", "a.wav"])) == VadOptions.whisper_cpp()
