"""llama.cpp's Unicode tables: category flags, whitespace, simple lowercase and the first codepoint of NFD.

Tokenizers split and normalize text by these classes, so they come from llama.cpp's own tables
(``unicode_data.npz``, made by tests/models/data/make_unicode_data.py), not from Python's ``unicodedata``,
whose Unicode version follows the interpreter and is older.
"""

from functools import cache
from pathlib import Path

import numpy as np

# unicode_cpt_flags categories: one per codepoint
UNDEFINED, NUMBER, LETTER, SEPARATOR = 0x01, 0x02, 0x04, 0x08
MARK, PUNCTUATION, SYMBOL, CONTROL = 0x10, 0x20, 0x40, 0x80

# Unicode's White_Space property, as llama.cpp lists it (unicode_set_whitespace)
WHITESPACE = frozenset([*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                        0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
MAX_CODEPOINT = 0x10FFFF


@cache
def _tables():
    data = np.load(Path(__file__).with_name("unicode_data.npz"))
    starts, values = data["flag_starts"], data["flag_values"]
    flags = np.repeat(values[:-1], np.diff(starts))
    lower = dict(data["lower"].tolist())
    nfd = data["nfd"]
    return flags, lower, nfd[:, 0], nfd[:, 1], nfd[:, 2]


def category_flags(codepoints):
    """The category flag of each codepoint (a NumPy array of them)."""
    return _tables()[0][codepoints]


def category(codepoint):
    return int(_tables()[0][codepoint])


def to_lower(codepoint):
    """Simple lowercase mapping (unicode_tolower): one codepoint to one codepoint."""
    return _tables()[1].get(codepoint, codepoint)


def nfd_first(codepoint):
    """The first codepoint of the NFD form, which is all llama.cpp keeps (unicode_cpts_normalize_nfd):
    'é' becomes 'e', the accent is dropped rather than split off."""
    _, _, first, last, target = _tables()
    i = int(np.searchsorted(first, codepoint, side="right")) - 1
    return int(target[i]) if i >= 0 and first[i] <= codepoint <= last[i] else codepoint
