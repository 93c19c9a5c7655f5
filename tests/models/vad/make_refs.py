"""Regenerate tests/models/vad/data/silero_refs.npz: what the peers say on tests.support.vad_audio's clips.

    python -m tests.models.vad.make_refs

- `<clip>.ort`: ONNX Runtime's speech probabilities on faster-whisper's silero_vad_v6.onnx, fed as
  faster-whisper feeds it.
- `<clip>.fw_segments`: faster-whisper's `get_speech_timestamps` (its defaults) in samples, [n, 2].
- `mixed.wcpp_probs` / `mixed.wcpp_segments`: whisper.cpp's own probabilities on pyggml's ggml VAD file
  (libwhisper 1.8.5 through pywhispercpp) and the segments it cuts from them (seconds, its defaults).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from tests.support.numpy_silero import onnxruntime_probs
from tests.support.vad_audio import clips
from tests.support.whisper_peers import whisper_cpp_vad

OUT = Path(__file__).parent / "data" / "silero_refs.npz"


def main() -> None:
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    from pyggml.models.vad.files import faster_whisper_onnx, load_silero, write_ggml_vad

    refs = {}
    for name, audio in clips().items():
        refs[f"{name}.ort"] = onnxruntime_probs(faster_whisper_onnx(), audio).astype(np.float32)
        segs = get_speech_timestamps(audio, VadOptions())
        refs[f"{name}.fw_segments"] = np.array([[s["start"], s["end"]] for s in segs], np.int64).reshape(-1, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ggml-silero-v6.bin"
        write_ggml_vad(load_silero(), path)
        probs, segs = whisper_cpp_vad(path, clips()["mixed"])
    refs["mixed.wcpp_probs"] = probs.astype(np.float32)
    refs["mixed.wcpp_segments"] = np.array(segs, np.float64).reshape(-1, 2)
    np.savez_compressed(OUT, **refs)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
