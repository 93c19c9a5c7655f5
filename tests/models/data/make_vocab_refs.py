"""Write llama_cpp_vocabs/corpus_refs.json: what llama-cpp-python gives on llama.cpp's 19 test vocabularies.

For a corpus of our own (many scripts, emoji, code, whitespace runs, CRLF, special tokens) it records, per
vocabulary, the ids of ``Llama(vocab_only=True).tokenize`` without and with special tokens (added and parsed)
and llama_detokenize's bytes of them; for the vocabularies with test-tokenizer-0 texts it records how llama.cpp
detokenizes their expected ids. Byte strings are stored as hex, since a piece may be partial UTF-8. Run once, by
hand, with a Python that has llama-cpp-python:

    python -m tests.models.data.make_vocab_refs
"""

import ctypes
import json
import sys
import tempfile

import llama_cpp

from tests.support.llama_cpp_vocabs import CORPUS_REFS, VOCABS, WITH_TESTS, VocabSet, read_cases

SPECIAL_TEXTS = [
    "<s>Hello</s> <unk> <pad> <mask> [CLS] [SEP] [MASK] [PAD] [UNK]",
    "<|endoftext|>The end<|endoftext|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n<eos>",
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|>",
    "<｜begin▁of▁sentence｜>User: hi<｜end▁of▁sentence｜>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "text<s>glued</s>text [CLS]glued[SEP] <mask>glued",
]

CORPUS = [
    "",
    " ",
    "\n",
    "Hello world",
    " Hello world ",
    "I'm sure you'll've done it; haven't you? DON'T! They'RE here, we'd see.",
    "The quick brown fox jumps over the lazy dog.",
    "HelloWorld camelCaseIdentifier XMLHttpRequest getHTTPResponseCode ÀÉÎÕÜ àéîõü ÀbC",
    "1 12 123 1234 12345 123456789 3.14159 1,000,000 -42 0x1F 1e-10 ٣٤٥ ४५६ ½ ² Ⅻ",
    "a  b   c    d\t\te\n\n\nf \u3000g\u00a0h\u2009i\u200bj",
    "    leading spaces",
    "trailing spaces    ",
    "\t\n \r\n\r\n  \n  \n\n\n\n",
    "line one\r\nline two\r\n\r\nend\r\n",
    "\n\n\n\n\n\n\n\nmany newlines\n\n\n",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Γειά σου κόσμε· ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "مرحبا بالعالم، هذا نص عربي. שלום עולם, זה טקסט בעברית.",
    "नमस्ते दुनिया, यह हिन्दी पाठ है। வணக்கம் உலகம். ಕನ್ನಡ",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง ສະບາຍດີ",
    "你好，世界！我想在apple工作1314151天～ 繁體中文測試。",
    "こんにちは世界、カタカナとひらがなと漢字。ｶﾀｶﾅ",
    "안녕하세요 세계! 한국어 텍스트입니다.",
    "გამარჯობა მსოფლიო Բարեւ աշխարհ ሰላም ልዑል ជំរាបសួរ",
    "🦙🔥🚀 👨‍👩‍👧‍👦 🏳️‍🌈 ✅ 1️⃣ 🇯🇵🇫🇷 😶‍🌫️ 👍🏽 🫨 🪿",
    "café naïve Ångström façade résumé vs cafe\u0301 nai\u0308ve A\u030angstro\u0308m",
    "ﬁ ﬂ ㍿ ™ № ℃ Ⅻ ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３ ！？",
    "Hello!!! ... ??? --- ((( ))) «quotes» „german“ 'single' \"double\" — – … ¿¡",
    "def fibonacci(n):\n    \"\"\"Return the n-th number.\"\"\"\n    if n < 2:\n        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    '{"key": [1, 2.5, true, null], "nested": {"a": "b\\n"}}',
    "<div class=\"x\"><a href='https://example.com/path?q=1&x=y#frag'>link</a></div>",
    "SELECT * FROM users WHERE id >= 10 AND name LIKE '%ab_c%';",
    "x+=1;y-=2;z*=3;w/=4;a<<=b>>=c;p->q::r||s&&t",
    "$HOME ~/path/to/file.txt C:\\Windows\\System32 @user #tag 100% ^caret `tick` |pipe|",
    "\x00\x01\x07\x1b[31mred\x1b[0m\x1c\x1d\x1e\x1f\x7f",
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom\u2028line\u2029para\u0085nel",
    "private \ue000\uf8ff plane \U000f0000 tags \U000e0041 unassigned \u0378 \U0001fbff",
    "\u2581 lower one eighth block \u2581\u2581 and Ġ Ċ byte-level look-alikes",
    "pneumonoultramicroscopicsilicovolcanoconiosis " + "a" * 80,
    "ab" * 40 + " " + "-" * 60 + " " + "=" * 33,
    " ".join(["word"] * 30),
    *SPECIAL_TEXTS,
]


def tokenize(llm, text, add_special, parse_special):
    return llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)


def detokenize(vocab, ids, remove_special, unparse_special):
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, remove_special, unparse_special)
    assert 0 <= n <= size, n
    return buf.raw[:n]


def refs_for(llm, texts):
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    entries = []
    for text in texts:
        plain = tokenize(llm, text, False, False)
        special = tokenize(llm, text, True, True)
        entries.append({
            "ids_plain": plain,
            "ids_special": special,
            "detok_plain": detokenize(vocab, plain, False, False).hex(),
            "detok_special": detokenize(vocab, special, False, True).hex(),
            "detok_special_removed": detokenize(vocab, special, True, True).hex(),
        })
    return entries


def main():
    refs = {"llama_cpp_python_version": llama_cpp.__version__, "texts": CORPUS, "vocabs": {}, "test_set_detok": {}}
    with tempfile.TemporaryDirectory() as tmp:
        vocabs = VocabSet(tmp)
        for name in VOCABS:
            llm = llama_cpp.Llama(str(vocabs.path(name)), vocab_only=True, verbose=False)
            refs["vocabs"][name] = refs_for(llm, CORPUS)
            if name in WITH_TESTS:
                vocab = llama_cpp.llama_model_get_vocab(llm.model)
                refs["test_set_detok"][name] = [detokenize(vocab, ids, False, False).hex()
                                                for _, ids in read_cases(name)]
            llm.close()
            print(name, file=sys.stderr)
    CORPUS_REFS.write_text(json.dumps(refs, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {CORPUS_REFS}", file=sys.stderr)


if __name__ == "__main__":
    main()
