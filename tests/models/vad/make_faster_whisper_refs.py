"""faster-whisper's text for the committed pause clip, with vad_filter=True (tiny.en, float32, greedy), so the
VAD tests need no faster-whisper: tests/models/vad/data/faster_whisper_pauses1.json.

    python -m tests.models.vad.make_faster_whisper_refs
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLIP = HERE.parents[1] / "data" / "speech" / "pauses1.flac"
OUT = HERE / "data" / "faster_whisper_pauses1.json"


def main() -> None:
    from faster_whisper import WhisperModel

    from tests.models.vad.pause_audio import load
    from tests.support.whisper_peers import ct2_dir

    audio, _, _ = load(CLIP)
    model = WhisperModel(str(ct2_dir("tiny.en", Path(tempfile.mkdtemp()))), device="cpu", compute_type="float32",
                         cpu_threads=2)
    segments, _ = model.transcribe(audio, language="en", beam_size=1, temperature=0.0, vad_filter=True)
    OUT.write_text(json.dumps({"clip": CLIP.name, "model": "tiny.en", "texts": [s.text for s in segments]},
                              indent=1) + "\n")


if __name__ == "__main__":
    main()
