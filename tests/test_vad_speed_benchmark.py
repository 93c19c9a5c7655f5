"""benchmarks/vad_speed.py on seconds of test speech: both sides timed every round, their segments compared."""

import pytest

from benchmarks import vad_speed
from tests.support.vad_audio import clips


def test_rounds_time_both_sides_and_compare_segments():
    pytest.importorskip("faster_whisper")
    pytest.importorskip("onnxruntime")
    audio = clips()["mixed"]   # speech with pauses and noise
    out = vad_speed.run(audio, rounds=2)
    assert len(out["rounds"]) == 2 and out["audio_s"] == audio.size / 16000
    assert all(r["segments"] > 1 for r in out["rounds"])
    assert all(r["pyggml_s"] > 0 and r["faster_whisper_s"] > 0 for r in out["rounds"])
    assert all(r["same_segments"] for r in out["rounds"])   # the same network and rules on both sides
    assert out["median_ratio"] > 0
