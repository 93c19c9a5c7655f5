"""The VAD benchmark's per-sentence error attribution (errors land on the sentence they fall in and add up to
the WER's numerator) and its per-round time ratios."""

from benchmarks.vad_vs_peers import print_ratios, print_sentence_errors
from tests.support.whisper_peers import sentence_errors, wer, words

SENTENCES = ["The old bridge was painted green.", "Our neighbour keeps three goats.", "Please send the invoice."]


def test_exact_transcript_has_no_errors():
    out = sentence_errors(SENTENCES, " ".join(SENTENCES))
    assert [n for n, _ in out] == [0, 0, 0]
    assert [ws for _, ws in out] == [words(s) for s in SENTENCES]


def test_errors_are_charged_to_their_sentence_and_sum_to_the_wer():
    hyp = "The old bridge was painted green. Our neighbor keeps free goats and a dog. Please send invoice."
    out = sentence_errors(SENTENCES, hyp)
    assert [n for n, _ in out] == [0, 5, 1]      # neighbor, free, +and +a +dog; -the
    assert out[1][1] == ["our", "neighbor", "keeps", "free", "goats", "and", "a", "dog"]
    ref = " ".join(SENTENCES)
    assert sum(n for n, _ in out) == round(wer(ref, hyp) * len(words(ref)))


def test_lost_sentence_and_empty_hypothesis():
    out = sentence_errors(SENTENCES, "The old bridge was painted green. Please send the invoice.")
    assert [n for n, _ in out] == [0, 5, 0] and out[1][1] == []
    assert [n for n, _ in sentence_errors(SENTENCES, "")] == [len(words(s)) for s in SENTENCES]


def test_print_lists_only_differing_sentences(capsys):
    print_sentence_errors(SENTENCES, {"a": " ".join(SENTENCES), "b": "The old bridge was painted green. "
                                      "Our neighbour keeps three goats. Please send the voice."})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("  2 Please send the invoice.")
    assert lines[1].split()[:2] == ["a", "0"] and lines[2].split()[:2] == ["b", "1"] and len(lines) == 3


def test_ratios_are_taken_within_each_round(capsys):
    rounds = [{"pyggml-vad": {"wall_s": 30.0}, "pyggml": {"wall_s": 50.0}, "whisper.cpp-vad": {"wall_s": 60.0}},
              {"pyggml-vad": {"wall_s": 40.0}, "pyggml": {"wall_s": 80.0}},
              {"pyggml": {"wall_s": 10.0}}]
    print_ratios(rounds)
    assert capsys.readouterr().out.splitlines() == ["round 1: pyggml-vad / pyggml wall time 0.600",
                                                    "round 1: pyggml-vad / whisper.cpp-vad wall time 0.500",
                                                    "round 2: pyggml-vad / pyggml wall time 0.500"]
