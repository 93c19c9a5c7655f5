"""Write pyggml/models/text/unicode_data.npz from llama.cpp's src/unicode-data.cpp (generated from the Unicode
Character Database by llama.cpp's scripts/gen-unicode-data.py; MIT, see tests/models/data/llama_cpp_vocabs/LICENSE).

The tokenizers need llama.cpp's own tables, not Python's unicodedata: the interpreter's Unicode version is older
(14.0 on Python 3.11) and a character's class decides where a pre-tokenizer splits. Run once, by hand:

    python -m tests.models.data.make_unicode_data path/to/llama.cpp/src/unicode-data.cpp
"""

import re
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[3] / "pyggml" / "models" / "unicode_data.npz"


def _table(source, name):
    body = source[source.index(name):]
    body = body[: body.index("};")]
    return np.array([[int(x, 16) for x in row] for row in re.findall(r"\{(0x[0-9A-F]+(?:, 0x[0-9A-F]+)+)\}", body)
                     for row in [row.split(", ")]], np.uint32)


def main(path):
    source = Path(path).read_text(encoding="utf-8")
    flags = _table(source, "unicode_ranges_flags")  # start, flags; the last start is 0x110000
    lower = _table(source, "unicode_map_lowercase")  # codepoint, lowercase
    nfd = _table(source, "unicode_ranges_nfd")  # first, last, first codepoint of the NFD form
    np.savez_compressed(OUT, flag_starts=flags[:, 0], flag_values=flags[:, 1].astype(np.uint8),
                        lower=lower, nfd=nfd)
    print(f"{OUT}: {len(flags)} flag ranges, {len(lower)} lowercase pairs, {len(nfd)} NFD ranges")


if __name__ == "__main__":
    main(sys.argv[1])
