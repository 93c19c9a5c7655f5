"""whisper.cpp's language detection (whisper_lang_auto_detect through pywhispercpp 1.5.1) on the test speech
in five languages, with the multilingual base model's F16 ggml file that write_ggml_bin makes.

`python -m tests.models.whisper.language_refs` regenerates data/language_refs.json (each clip's language as
espeak-ng spoke it and whisper.cpp's five most likely languages with their probabilities), so that CI needs no
peer; test_whisper_language.py compares pyggml with it, and calls the same function live when pywhispercpp is
installed.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
SPEECH = TESTS / "data" / "speech"
REFERENCES = Path(__file__).resolve().parent / "data" / "language_refs.json"
CLIPS = {"en1.wav": "en", "de1.wav": "de", "fr1.wav": "fr", "es1.wav": "es", "it1.wav": "it"}
TOP = 5


def whisper_cpp_languages(bin_path: Path, wav: Path) -> dict[str, float]:
    """whisper.cpp's {language: probability} for the first 30 s of wav, the TOP most likely, in order."""
    from tests.support.whisper_peers import in_child

    return in_child(_whisper_cpp_languages, bin_path, wav)


def _whisper_cpp_languages(bin_path: Path, wav: Path) -> dict[str, float]:
    from pywhispercpp.model import Model

    model = Model(str(bin_path), n_threads=2, print_progress=False, print_realtime=False)
    _, probs = model.auto_detect_language(str(wav))
    ranked = sorted(probs.items(), key=lambda kv: -float(kv[1]))[:TOP]
    return {lang: round(float(p), 6) for lang, p in ranked}


def main() -> None:
    from tests.support.whisper_peers import ggml_bin

    with tempfile.TemporaryDirectory() as tmp:
        bin_path = ggml_bin("base", Path(tmp))
        refs = {name: {"spoken": lang, "whisper.cpp": whisper_cpp_languages(bin_path, SPEECH / name)}
                for name, lang in CLIPS.items()}
    REFERENCES.write_text(json.dumps(refs, indent=1) + "\n")
    print(json.dumps(refs, indent=1))


if __name__ == "__main__":
    main()
