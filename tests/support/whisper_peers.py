"""The peers on the committed test speech: faster-whisper (the same CTranslate2 weights) and whisper.cpp
(pywhispercpp 1.5.1, loading the ggml .bin that write_ggml_bin makes from those weights).

`python -m tests.support.whisper_peers` regenerates data/peer_transcripts.json, the references the tests
compare with (so that CI needs neither peer); the `peer`-marked tests call the same functions live.
Settings as in the tests: 2 threads, temperature 0 without fallback, timestamps on, VAD off.

whisper.cpp runs in a child process of its own (`in_child`): it brings its own ggml and OpenMP runtime, and in
a process that has already loaded ggml-python's (the ggml peer tests) whisper_full crashed with a segmentation
fault on an Intel Xeon, taking the whole test run with it.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[1]
SPEECH = TESTS / "data" / "speech"
REFERENCES = TESTS / "models" / "whisper" / "data" / "peer_transcripts.json"
MODELS = ("tiny.en", "base")
BEAMS = (1, 5)
QUANTIZED = ("Q8_0", "Q5_0")


def speech_files(model: str) -> list[str]:
    """The committed sentences a model is checked on (the German one only for the multilingual model)."""
    meta = json.loads((SPEECH / "speech.json").read_text())
    return [name for name, m in meta.items() if m["language"] == "en" or model != "tiny.en"]


def language_of(name: str) -> str:
    return json.loads((SPEECH / "speech.json").read_text())[name]["language"]


def ct2_dir(model: str, workdir: Path) -> Path:
    """A CTranslate2 directory faster-whisper can open (base's parts joined into one model.bin)."""
    from pyggml.models.whisper.files import packaged_model_parts

    directory, parts = packaged_model_parts(model)
    if len(parts) == 1:
        return directory
    out = workdir / f"ct2-{model}"
    if not (out / "model.bin").exists():
        out.mkdir(parents=True, exist_ok=True)
        for f in directory.iterdir():
            if f.is_file() and not f.name.startswith("model.bin"):
                shutil.copy(f, out / f.name)
        with open(out / "model.bin", "wb") as dst:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, dst)
    return out


def ggml_bin(model: str, workdir: Path, type_name: str = "F16") -> Path:
    """whisper.cpp's legacy ggml file of the model's weights (F16, or one of the quantized types `pyggml convert`
    writes), written once into workdir."""
    from pyggml.core import GGMLType
    from pyggml.models.whisper.reader import load_whisper_file
    from pyggml.models.whisper.ggml_bin import write_ggml_bin

    out = workdir / f"ggml-{model}-{type_name.lower()}.bin"
    if not out.exists():
        write_ggml_bin(load_whisper_file(model), out, GGMLType[type_name])
    return out


def words(text: str) -> list[str]:
    """Lower-case words without punctuation, as the WER counts them."""
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def wer(ref: str, hyp: str) -> float:
    """Word error rate: word-level Levenshtein distance / reference words."""
    r, h = words(ref), words(hyp)
    d = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        prev, d[0] = d[0], i
        for j, hw in enumerate(h, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (rw != hw))
    return d[len(h)] / max(len(r), 1)


def sentence_errors(sentences: list[str], hyp: str) -> list[tuple[int, list[str]]]:
    """(word errors, hypothesis words) per reference sentence: the hypothesis is aligned to all sentences at
    once (word Levenshtein) and each substitution, deletion or insertion is charged to the sentence it falls
    in (an insertion to the sentence before it). The errors add up to the WER's numerator."""
    ref, owner = [], []
    for k, sentence in enumerate(sentences):
        ref += words(sentence)
        owner += [k] * len(words(sentence))
    h = words(hyp)
    d = np.zeros((len(ref) + 1, len(h) + 1), np.int32)
    d[:, 0], d[0, :] = np.arange(len(ref) + 1), np.arange(len(h) + 1)
    for i in range(1, len(ref) + 1):
        for j in range(1, len(h) + 1):
            d[i, j] = min(d[i - 1, j] + 1, d[i, j - 1] + 1, d[i - 1, j - 1] + (ref[i - 1] != h[j - 1]))
    out = [(0, []) for _ in sentences]
    i, j = len(ref), len(h)
    while i or j:
        if i and j and d[i, j] == d[i - 1, j - 1] + (ref[i - 1] != h[j - 1]):
            k, err, word = owner[i - 1], ref[i - 1] != h[j - 1], h[j - 1]
            i, j = i - 1, j - 1
        elif i and d[i, j] == d[i - 1, j] + 1:
            k, err, word = owner[i - 1], True, None
            i -= 1
        else:
            k, err, word = owner[i - 1] if i else 0, True, h[j - 1]
            j -= 1
        n, ws = out[k]
        out[k] = (n + err, ([word] if word is not None else []) + ws)
    return out


def join_segments(texts) -> str:
    """One line from segment texts (whisper.cpp's segments come without their leading space)."""
    return " ".join(t.strip() for t in texts if t.strip())


def faster_whisper_text(ct2: Path, wav: Path, beam: int, language: str | None, compute_type: str = "float32",
                        model=None) -> str:
    from faster_whisper import WhisperModel

    model = model or WhisperModel(str(ct2), device="cpu", compute_type=compute_type, cpu_threads=2)
    segments, _ = model.transcribe(str(wav), beam_size=beam, language=language, temperature=0.0, vad_filter=False,
                                   condition_on_previous_text=True)
    return join_segments(s.text for s in segments)


def in_child(fn, *args):
    """fn(*args) computed in a fresh (spawned) Python process, its result returned (fn: a module-level function)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def whisper_cpp_text(bin_path: Path, wav: Path, beam: int, language: str | None) -> str:
    """whisper.cpp's text (greedy or beam, no temperature fallback), in a child process."""
    return in_child(_whisper_cpp_text, bin_path, wav, beam, language)


def _whisper_cpp_text(bin_path: Path, wav: Path, beam: int, language: str | None) -> str:
    from pywhispercpp.model import Model

    model = Model(str(bin_path), params_sampling_strategy=0 if beam == 1 else 1, n_threads=2,
                  print_progress=False, print_realtime=False, temperature_inc=0.0,
                  beam_search={"beam_size": beam, "patience": -1.0}, language=language or "auto")
    return join_segments(s.text for s in model.transcribe(str(wav)))


def _libwhisper():
    """whisper.cpp's C library as pywhispercpp ships it (its bindings return only one float of the logits)."""
    import ctypes
    import glob
    import os

    import pywhispercpp

    libs = os.path.join(os.path.dirname(os.path.dirname(pywhispercpp.__file__)), "pywhispercpp.libs")
    lib = None
    for pattern in ("libgomp*", "libggml-base*", "libggml-cpu*", "libggml-[0-9]*", "libwhisper*"):
        for path in glob.glob(os.path.join(libs, pattern)):
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return lib


def greedy_tokens(w, samples) -> list[int]:
    """The start-of-transcript prompt and pyggml's greedy tokens of `samples` with Whisper `w`."""
    return w.tokenizer.sot_sequence(None) + [t for s in w.transcribe(samples, temperatures=(0.0,)) for t in s.tokens]


def teacher_forced_logits(w, samples, tokens: list[int], n_prefix: int):
    """pyggml's logits as whisper_cpp_logits computes them: the prefix in one step, then one token a step."""
    import numpy as np

    w.model.encode(w.log_mel(samples)[0][:, :3000])
    rows = [w.model.decode(tokens[:n_prefix], np.arange(n_prefix))[0]]
    rows += [w.model.decode([t], [i])[0] for i, t in enumerate(tokens[n_prefix:], n_prefix)]
    return np.array(rows)


def kl_rows(p_logits, q_logits):
    """KL(p || q) of each row's softmax."""
    import numpy as np

    from pyggml.models.whisper.decoding import log_softmax

    p, q = (np.array([log_softmax(row) for row in x]) for x in (p_logits, q_logits))
    return (np.exp(p) * (p - q)).sum(-1)


def teacher_forced_kl(w, bin_path: Path, samples, flash_attn: bool = True):
    """Per-step KL(whisper.cpp || pyggml) along pyggml's greedy tokens of `samples` (one window), whisper.cpp
    loading `bin_path` and pyggml's loaded Whisper `w` (the same weights)."""
    tokens, n_prefix = greedy_tokens(w, samples), len(w.tokenizer.sot_sequence(None))
    theirs = whisper_cpp_logits(bin_path, samples, tokens, n_prefix, flash_attn)
    return kl_rows(theirs, teacher_forced_logits(w, samples, tokens, n_prefix))


def whisper_cpp_logits(bin_path: Path, samples, tokens: list[int], n_prefix: int, flash_attn: bool = True):
    """_whisper_cpp_logits in a child process."""
    return in_child(_whisper_cpp_logits, bin_path, samples, tokens, n_prefix, flash_attn)


def _whisper_cpp_context(lib, bin_path: Path, flash_attn: bool, init: str):
    """A whisper.cpp context of `bin_path` made by `init` (whisper_init_from_file_with_params or its _no_state
    form), on the CPU. whisper_context_params is passed as the bytes whisper_context_default_params_by_ref gives,
    with use_gpu (byte 0) and flash_attn (byte 1) set: the struct starts with these two bools."""
    import ctypes

    class Params(ctypes.Structure):
        _fields_ = [("raw", ctypes.c_uint8 * 48)]

    lib.whisper_context_default_params_by_ref.restype = ctypes.POINTER(Params)
    getattr(lib, init).restype = ctypes.c_void_p
    getattr(lib, init).argtypes = [ctypes.c_char_p, Params]
    lib.whisper_free.argtypes = [ctypes.c_void_p]
    params = Params.from_buffer_copy(lib.whisper_context_default_params_by_ref().contents)
    params.raw[0], params.raw[1] = 0, int(flash_attn)
    ctx = getattr(lib, init)(str(bin_path).encode(), params)
    if not ctx:
        raise RuntimeError(f"whisper.cpp could not load {bin_path}")
    return ctx


def whisper_cpp_mel(bin_path: Path, samples):
    """_whisper_cpp_mel in a child process."""
    return in_child(_whisper_cpp_mel, bin_path, samples)


def _whisper_cpp_mel(bin_path: Path, samples):
    """whisper.cpp's log-mel of `samples` (n_mels, n_len) with the filters of `bin_path`, as whisper_pcm_to_mel
    leaves it in a whisper_state. Its API has no getter, so the state's whisper_mel {int n_len, n_len_org, n_mel;
    std::vector<float> data} is found in the struct's first 16 KiB by its n_len_org (whisper_n_len_from_state) and
    n_mel, and taken only if the vector after them holds n_mel * n_len floats."""
    import ctypes

    import numpy as np

    lib = _libwhisper()
    lib.whisper_init_state.restype = ctypes.c_void_p
    lib.whisper_init_state.argtypes = [ctypes.c_void_p]
    lib.whisper_free_state.argtypes = [ctypes.c_void_p]
    lib.whisper_n_len_from_state.argtypes = [ctypes.c_void_p]
    lib.whisper_pcm_to_mel_with_state.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                                                  ctypes.c_int, ctypes.c_int]
    lib.whisper_model_n_mels.argtypes = [ctypes.c_void_p]
    ctx = _whisper_cpp_context(lib, bin_path, True, "whisper_init_from_file_with_params_no_state")
    state = lib.whisper_init_state(ctx)
    try:
        pcm = np.ascontiguousarray(samples, np.float32)
        assert lib.whisper_pcm_to_mel_with_state(ctx, state, pcm.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                                 pcm.size, 2) == 0
        n_mel, n_len_org = lib.whisper_model_n_mels(ctx), lib.whisper_n_len_from_state(state)
        ints = np.ctypeslib.as_array((ctypes.c_int32 * 4096).from_address(state))
        for i in np.flatnonzero((ints[1:-1] == n_len_org) & (ints[2:] == n_mel)):
            n_len = int(ints[i])
            at = state + (4 * (int(i) + 3) + 7) // 8 * 8  # the vector after the three ints, pointer-aligned
            begin, end = (ctypes.c_uint64.from_address(at + k).value for k in (0, 8))
            if n_len > 0 and end - begin == 4 * n_mel * n_len:
                return np.ctypeslib.as_array((ctypes.c_float * (n_mel * n_len)).from_address(begin)).reshape(
                    n_mel, n_len).copy()
        raise RuntimeError("whisper.cpp's mel was not found in its state (another whisper_state layout?)")
    finally:
        lib.whisper_free_state(state)
        lib.whisper_free(ctx)


def _whisper_cpp_logits(bin_path: Path, samples, tokens: list[int], n_prefix: int, flash_attn: bool = True):
    """whisper.cpp's logits, teacher-forced: the prefix tokens in one decoder call, then one token per call
    as whisper_full decodes; row i predicts tokens[n_prefix + i] (the last row: what follows them all)."""
    import ctypes

    import numpy as np

    lib = _libwhisper()
    lib.whisper_get_logits.restype = ctypes.POINTER(ctypes.c_float)
    lib.whisper_get_logits.argtypes = [ctypes.c_void_p]
    lib.whisper_pcm_to_mel.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int, ctypes.c_int]
    lib.whisper_encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.whisper_decode.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int]
    lib.whisper_n_vocab.argtypes = [ctypes.c_void_p]
    ctx = _whisper_cpp_context(lib, bin_path, flash_attn, "whisper_init_from_file_with_params")
    try:
        n_vocab = lib.whisper_n_vocab(ctx)
        pcm = np.ascontiguousarray(samples, np.float32)
        assert lib.whisper_pcm_to_mel(ctx, pcm.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), pcm.size, 2) == 0
        assert lib.whisper_encode(ctx, 0, 2) == 0
        rows = []
        for start, n in [(0, n_prefix)] + [(i, 1) for i in range(n_prefix, len(tokens))]:
            batch = (ctypes.c_int32 * n)(*tokens[start:start + n])
            assert lib.whisper_decode(ctx, batch, n, start, 2) == 0
            rows.append(np.ctypeslib.as_array(lib.whisper_get_logits(ctx), (n * n_vocab,))[-n_vocab:].copy())
        return np.array(rows)
    finally:
        lib.whisper_free(ctx)


def whisper_cpp_vad(vad_bin: Path, samples, threshold: float = 0.5, min_speech_ms: int = 250,
                    min_silence_ms: int = 100, speech_pad_ms: int = 30):
    """_whisper_cpp_vad in a child process."""
    return in_child(_whisper_cpp_vad, vad_bin, samples, threshold, min_speech_ms, min_silence_ms, speech_pad_ms)


def _whisper_cpp_vad(vad_bin: Path, samples, threshold: float = 0.5, min_speech_ms: int = 250,
                     min_silence_ms: int = 100, speech_pad_ms: int = 30):
    """whisper.cpp's Silero VAD on a ggml VAD file through libwhisper's C API (pywhispercpp 1.5.1's binding of
    the VAD context is broken): (its probability per window, its segments [(t0, t1)] in seconds)."""
    import ctypes

    import numpy as np

    class ContextParams(ctypes.Structure):
        _fields_ = [("n_threads", ctypes.c_int), ("use_gpu", ctypes.c_bool), ("gpu_device", ctypes.c_int)]

    class VadParams(ctypes.Structure):
        _fields_ = [("threshold", ctypes.c_float), ("min_speech_duration_ms", ctypes.c_int),
                    ("min_silence_duration_ms", ctypes.c_int), ("max_speech_duration_s", ctypes.c_float),
                    ("speech_pad_ms", ctypes.c_int), ("samples_overlap", ctypes.c_float)]

    lib = _libwhisper()
    lib.whisper_vad_default_context_params.restype = ContextParams
    lib.whisper_vad_init_from_file_with_params.restype = ctypes.c_void_p
    lib.whisper_vad_init_from_file_with_params.argtypes = [ctypes.c_char_p, ContextParams]
    lib.whisper_vad_detect_speech.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int]
    lib.whisper_vad_detect_speech.restype = ctypes.c_bool
    lib.whisper_vad_n_probs.argtypes = lib.whisper_vad_probs.argtypes = [ctypes.c_void_p]
    lib.whisper_vad_probs.restype = ctypes.POINTER(ctypes.c_float)
    lib.whisper_vad_segments_from_probs.argtypes = [ctypes.c_void_p, VadParams]
    lib.whisper_vad_segments_from_probs.restype = ctypes.c_void_p
    lib.whisper_vad_segments_n_segments.argtypes = [ctypes.c_void_p]
    for name in ("whisper_vad_segments_get_segment_t0", "whisper_vad_segments_get_segment_t1"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_int]
        getattr(lib, name).restype = ctypes.c_float
    lib.whisper_vad_free.argtypes = lib.whisper_vad_free_segments.argtypes = [ctypes.c_void_p]
    cparams = lib.whisper_vad_default_context_params()
    cparams.n_threads, cparams.use_gpu = 2, False
    ctx = lib.whisper_vad_init_from_file_with_params(str(vad_bin).encode(), cparams)
    if not ctx:
        raise RuntimeError(f"whisper.cpp could not load the VAD file {vad_bin}")
    try:
        x = np.ascontiguousarray(samples, np.float32)
        assert lib.whisper_vad_detect_speech(ctx, x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), x.size)
        probs = np.ctypeslib.as_array(lib.whisper_vad_probs(ctx), (lib.whisper_vad_n_probs(ctx),)).copy()
        params = VadParams(threshold, min_speech_ms, min_silence_ms, 3.4e38, speech_pad_ms, 0.1)
        segs = lib.whisper_vad_segments_from_probs(ctx, params)
        t0, t1 = lib.whisper_vad_segments_get_segment_t0, lib.whisper_vad_segments_get_segment_t1
        out = [(t0(segs, i) / 100, t1(segs, i) / 100) for i in range(lib.whisper_vad_segments_n_segments(segs))]
        lib.whisper_vad_free_segments(segs)
        return probs, out
    finally:
        lib.whisper_vad_free(ctx)


def quantized_texts(workdir: Path) -> dict:
    """whisper.cpp's greedy texts of the English sentences on tiny.en's files of the QUANTIZED types that
    `pyggml convert` writes: {"tiny.en-q8_0": {"1": {sentence: text}}, ...} (the same quantized files as pyggml's)."""
    refs: dict = {}
    for type_name in QUANTIZED:
        binf = ggml_bin("tiny.en", workdir, type_name)
        for name in speech_files("tiny.en"):
            text = whisper_cpp_text(binf, SPEECH / name, 1, "en")
            refs.setdefault(f"tiny.en-{type_name.lower()}", {}).setdefault("1", {})[name] = text
            print(type_name, name, "\n  wc:", text, flush=True)
    return refs


def main(workdir: Path) -> None:
    refs: dict = {"faster-whisper": {}, "whisper.cpp": quantized_texts(workdir)}
    for model in MODELS:
        ct2, binf = ct2_dir(model, workdir), ggml_bin(model, workdir)
        for beam in BEAMS:
            for name in speech_files(model):
                lang = language_of(name) if name.startswith("en") else None
                fw = faster_whisper_text(ct2, SPEECH / name, beam, lang)
                wc = whisper_cpp_text(binf, SPEECH / name, beam, lang)
                refs["faster-whisper"].setdefault(model, {}).setdefault(str(beam), {})[name] = fw
                refs["whisper.cpp"].setdefault(model, {}).setdefault(str(beam), {})[name] = wc
                print(model, beam, name, "\n  fw:", fw, "\n  wc:", wc, flush=True)
    REFERENCES.parent.mkdir(exist_ok=True)
    REFERENCES.write_text(json.dumps(refs, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="whisper-peers-")))

