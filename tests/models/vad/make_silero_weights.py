"""Regenerate pyggml/models/vad/silero_vad_v6.npz, the Silero VAD v6 weights (MIT, snakers4/silero-vad) pyggml
ships, from faster-whisper's bundled silero_vad_v6.onnx (needs faster-whisper and onnx; run once):

    python -m tests.models.vad.make_silero_weights

tests/models/vad/test_silero_weights.py checks that the shipped file holds exactly the ONNX file's weights."""

from __future__ import annotations

from pyggml.models.vad.files import SHIPPED, faster_whisper_onnx, read_silero_onnx, write_npz


def main() -> None:
    source = faster_whisper_onnx()
    if source is None:
        raise SystemExit("faster-whisper (its assets/silero_vad_v6.onnx) is not installed")
    write_npz(read_silero_onnx(source), SHIPPED)
    print(f"wrote {SHIPPED} ({SHIPPED.stat().st_size} bytes) from {source}")


if __name__ == "__main__":
    main()
