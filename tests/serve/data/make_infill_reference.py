"""Writes infill_reference.json: the prompt tokens llama-server builds for /infill requests on the tests' FIM
model (tests.support.serve.write_infill_model), computed with llama.cpp's own tokenizer and FIM ids (through
llama-cpp-python) by the rules of llama-server's format_prompt_infill (tools/server/server-common.cpp).

Run with the project's Python; the llama.cpp part runs in a Python that has llama_cpp:
    python tests/serve/data/make_infill_reference.py --peer-python /path/to/venv/bin/python
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

NULL = -1  # LLAMA_TOKEN_NULL


def llama_infill(llm, vocab, case):
    import llama_cpp

    def tok(text):
        return llm.tokenize(text.encode(), add_bos=False, special=False) if text else []

    fim_rep, fim_sep = llama_cpp.llama_vocab_fim_rep(vocab), llama_cpp.llama_vocab_fim_sep(vocab)
    extra = []
    if fim_rep != NULL:
        extra += [fim_rep] + tok("myproject\n")
    for filename, text in case["extra"]:
        extra += [fim_sep] + tok(filename + "\n") if fim_sep != NULL else tok("\n\n--- snippet ---\n\n")
        extra += tok(text)
    if fim_sep != NULL:
        extra += [fim_sep] + tok("filename\n")
    prompt = llm.tokenize(case["prompt"].encode(), add_bos=False, special=True) if case["prompt"] else []
    prefix, suffix = tok(case["prefix"]), tok(case["suffix"])
    n_batch, n_ctx, n_predict = case["n_batch"], case["n_ctx"], case["n_predict"]
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))
    prefix = [llama_cpp.llama_vocab_fim_pre(vocab)] + prefix[len(prefix) - n_prefix:] + prompt
    suffix = [llama_cpp.llama_vocab_fim_suf(vocab)] + suffix[:n_suffix]
    inp, end = (suffix, prefix) if case["spm"] else (prefix, suffix)
    if llama_cpp.llama_vocab_get_add_bos(vocab):
        inp = [llama_cpp.llama_vocab_bos(vocab)] + inp
    inp = extra[len(extra) - n_extra:] + inp
    return [int(t) for t in inp + end + [llama_cpp.llama_vocab_fim_mid(vocab)]]


def peer_side(model: str, cases: str) -> None:
    """In the peer's Python: the cases' tokens on stdout."""
    import llama_cpp

    llm = llama_cpp.Llama(model, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    out = [llama_infill(llm, vocab, case) for case in json.loads(Path(cases).read_text())]
    print(json.dumps({"llama_cpp_python": llama_cpp.__version__, "tokens": out}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--peer-python", default="python")
    p.add_argument("--peer-side", nargs=2, metavar=("MODEL", "CASES"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.peer_side:
        return peer_side(*args.peer_side)
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from tests.serve.infill_cases import CASES
    from tests.support.serve import write_infill_model

    with tempfile.TemporaryDirectory() as tmp:
        model, cases = write_infill_model(Path(tmp) / "fim.gguf"), Path(tmp) / "cases.json"
        cases.write_text(json.dumps(CASES))
        run = subprocess.run([args.peer_python, __file__, "--peer-side", str(model), str(cases)], check=True,
                             capture_output=True, text=True)
    peer = json.loads(run.stdout.strip().splitlines()[-1])
    out = [{**case, "tokens": tokens} for case, tokens in zip(CASES, peer["tokens"], strict=True)]
    target = Path(__file__).with_name("infill_reference.json")
    target.write_text(json.dumps({"llama_cpp_python": peer["llama_cpp_python"], "cases": out}, indent=1) + "\n")
    print(f"wrote {len(out)} cases to {target}")


if __name__ == "__main__":
    main()
