"""BPE pre-tokenizers: llama.cpp's regexes per ``tokenizer.ggml.pre``, run as ``unicode_regex_split`` runs them.

llama.cpp hands its regexes to std::regex (ECMAScript). A regex with Unicode classes (``\\p{L}``) runs on a
*collapsed* text: ASCII stays, every other codepoint becomes one byte standing for its class (letter, number,
punctuation, mark, symbol, whitespace, other), and each ``\\p{..}`` becomes that byte plus its ASCII members. A
regex without them runs on the codepoints, non-ASCII whitespace turned into ``\\v``. Doing the same here, with
llama.cpp's Unicode tables, splits exactly where llama.cpp does, quirks included (a non-ASCII letter is never
lowercase to ``[a-z]``; ``\\s`` is C's six ASCII spaces). Each regex splits every piece the previous one left
into its matches and the gaps between them.
"""

import re
from dataclasses import dataclass
from functools import cache

import numpy as np

from pyggml.models.text import unicode_data as ud

# collapsed stand-ins for non-ASCII codepoints (k_ucat_cpt), and the ASCII members of each class (k_ucat_map)
_OTHER, _SPACE = 0xD0, 0x0B
_STAND_IN = {ud.NUMBER: 0xD1, ud.LETTER: 0xD2, ud.PUNCTUATION: 0xD3, ud.MARK: 0xD4, ud.SYMBOL: 0xD5}
_ASCII_MEMBERS = {ud.NUMBER: "0-9", ud.LETTER: "A-Za-z", ud.PUNCTUATION: r"!-#%-*,-/:-;?-@\[-\]_\{\}", ud.MARK: "",
                  ud.SYMBOL: r"\$\+<->\^`\|~"}
_CLASSES = {"N": ud.NUMBER, "L": ud.LETTER, "P": ud.PUNCTUATION, "M": ud.MARK, "S": ud.SYMBOL,
            "Lu": ud.LETTER, "Ll": ud.LETTER, "Lt": ud.LETTER, "Lm": ud.LETTER, "Lo": ud.LETTER}
_C_SPACES = r"\t\n\x0b\f\r "  # std::regex's \s in the C locale
_ESCAPES = {"s": _C_SPACES, "d": "0-9"}
_NEGATED = {"S": _C_SPACES, "D": "0-9"}

# -- the regexes (llama-vocab.cpp, llm_tokenizer_bpe) ------------------------------------------------------------

GPT2_WORDS = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_LOWER_WORD = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
_UPPER_WORD = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
_TEKKEN = _LOWER_WORD + "|" + _UPPER_WORD + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_GPT4O = (_LOWER_WORD + _CONTRACTIONS + "?|" + _UPPER_WORD + _CONTRACTIONS + "?"
          + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM = (
    "[\r\n]",
    "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf"
    "\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-"
    "\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113"
    "\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-"
    "\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    _CJK,
    r"\p{N}+",
)
_DEEPSEEK_CODER = ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")
_DEEPSEEK_V3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
_KANA_HAN = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_SPARK = (r"\p{N}{1,3}", _KANA_HAN,
          r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+"""
          r"|[\r\n]|\s+(?!\S)|\s+", r"\p{N}")
_YOUTU = (
    "[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f"
    "\ufe30-\ufe4f]+|[\u3105-\u312f]+|" + _KANA_HAN,
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS
    + r"?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
_JAIS2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4)) + r"|\s{1,2}(?!\S)|\s{1}")
_SEED_CODER = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
_UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_BAILING = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]|\s+(?!\S)|\s+")
_EXAONE_MOE = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?"
               r"|\s*[\r\n]|\s+(?!\S)|\s+")
_MINICPM5 = (r"\p{N}{1,3}", _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}+"))
_GRANITE_MULTI = _GPT4O.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")
_CHAMELEON = ("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
              r"[\p{P}!-/:-@\[-`{-~]", GPT2_WORDS)
_NEWLINES = r"[^\n]+|[\n]+"
_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"


@dataclass(frozen=True)
class PreTokenizer:
    """One llama.cpp pre-tokenizer type: its regexes and the vocabulary flags its names set."""

    name: str
    regexes: tuple[str, ...]
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool | None = None  # None: the vocabulary's default
    byte_encode: bool = True  # GPT-2's byte-to-unicode map; False for SentencePiece-style BPE (raw UTF-8, ▁)
    escape_whitespaces: bool = False
    force_bos: bool = False  # add_bos even where the file says not to (llama.cpp's Gemma 4 workaround)
    default_bos: bool = True  # False: no BOS token unless the file names one (ChatGLM), instead of BPE's 11

    def split(self, text):
        """The words of text, as codepoint strings."""
        pieces = [text] if text else []
        compiled = _compiled(self.regexes)
        collapsed = _collapse(text) if any(on_collapsed for _, on_collapsed in compiled) else None
        wide = text.translate(_WIDE_SPACES) if not all(on_collapsed for _, on_collapsed in compiled) else None
        for pattern, on_collapsed in compiled:
            subject, offset, split = (collapsed if on_collapsed else wide), 0, []
            for piece in pieces:
                cursor = 0
                for m in pattern.finditer(subject[offset : offset + len(piece)]):
                    start, end = m.span()
                    if start > cursor:
                        split.append(piece[cursor:start])
                    if end > start:
                        split.append(piece[start:end])
                    cursor = end
                if cursor < len(piece):
                    split.append(piece[cursor:])
                offset += len(piece)
            pieces = split
        return pieces


def _types():
    """Every supported type, then the names each is known by (the ``tokenizer.ggml.pre`` strings)."""
    starcoder = (r"\p{N}", GPT2_WORDS)
    types = [
        (PreTokenizer("default", (r"[\p{P}\$\+<=>\^~\|]+", GPT2_WORDS, r"\p{N}+", "[0-9][0-9][0-9]")), ["default"]),
        (PreTokenizer("llama3", (_LLAMA3,), ignore_merges=True, add_bos=True),
         ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"]),
        (PreTokenizer("dbrx", (_LLAMA3,)), ["dbrx", "smaug-bpe"]),
        (PreTokenizer("chatglm-bpe", (_LLAMA3,), default_bos=False), ["chatglm-bpe"]),
        (PreTokenizer("glm4", (_LLAMA3,), ignore_merges=True, default_bos=False), ["glm4", "glm5"]),
        (PreTokenizer("deepseek-llm", _DEEPSEEK_LLM, clean_spaces=False), ["deepseek-llm"]),
        (PreTokenizer("deepseek-coder", _DEEPSEEK_CODER, clean_spaces=False), ["deepseek-coder"]),
        (PreTokenizer("deepseek-v3", _DEEPSEEK_V3, clean_spaces=False),
         ["deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"]),
        (PreTokenizer("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", GPT2_WORDS, "[0-9][0-9][0-9]")), ["falcon"]),
        (PreTokenizer("gpt-2", (GPT2_WORDS,)),
         ["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
          "modern-bert", "mpt", "olmo", "jais", "exaone4"]),
        (PreTokenizer("trillion", (GPT2_WORDS,), clean_spaces=False), ["trillion", "granite-docling"]),
        (PreTokenizer("starcoder", starcoder), ["starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"]),
        (PreTokenizer("command-r", starcoder, clean_spaces=False), ["command-r", "smollm"]),
        (PreTokenizer("qwen2", (_QWEN2,), clean_spaces=False),
         ["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"]),
        (PreTokenizer("stablelm2", (_QWEN2,)), ["stablelm2", "megrez"]),
        (PreTokenizer("qwen35", (_QWEN35,), clean_spaces=False), ["qwen35"]),
        (PreTokenizer("bloom", (_BLOOM,)), ["bloom", "gpt3-finnish"]),
        (PreTokenizer("poro", (_BLOOM,), clean_spaces=False), ["poro-chat"]),
        (PreTokenizer("viking", (_BLOOM, r"\p{N}"), clean_spaces=False), ["viking"]),
        (PreTokenizer("tekken", (_TEKKEN,), clean_spaces=False, ignore_merges=True, add_bos=True), ["tekken"]),
        (PreTokenizer("gpt-4o", (_GPT4O,), clean_spaces=False),
         ["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"]),
        (PreTokenizer("gemma4", (_NEWLINES,), force_bos=True, byte_encode=False, escape_whitespaces=True),
         ["gemma4", "granite-embed-multi-311m"]),
        (PreTokenizer("sarvam-moe", (_NEWLINES,), clean_spaces=False, byte_encode=False, escape_whitespaces=True),
         ["sarvam-moe"]),
        (PreTokenizer("minicpm5", _MINICPM5, ignore_merges=True), ["minicpm5"]),
        (PreTokenizer("spark2_5", _SPARK, clean_spaces=False), ["spark2_5"]),
        (PreTokenizer("youtu", _YOUTU, clean_spaces=False, ignore_merges=True), ["youtu"]),
        (PreTokenizer("jais-2", (_JAIS2,)), ["jais-2"]),
        (PreTokenizer("seed-coder", (_SEED_CODER,), clean_spaces=False), ["seed-coder"]),
        (PreTokenizer("ufakzeka", (_UFAKZEKA,), clean_spaces=False), ["ufakzeka"]),
        (PreTokenizer("grok-2", (_QWEN2,), clean_spaces=False), ["grok-2"]),
        (PreTokenizer("bailingmoe", (_BAILING,), clean_spaces=False), ["bailingmoe", "bailingmoe2", "llada-moe"]),
        (PreTokenizer("laguna", (_NEWLINES, _QWEN2), clean_spaces=False), ["laguna"]),
        (PreTokenizer("exaone-moe", (_EXAONE_MOE,)), ["exaone-moe"]),
        (PreTokenizer("granite-embed-multi-97m", (_GRANITE_MULTI,), clean_spaces=False, ignore_merges=True),
         ["granite-embed-multi-97m"]),
        (PreTokenizer("chameleon", _CHAMELEON, clean_spaces=False, add_bos=True), ["chameleon"]),
    ]
    return {name: pre for pre, names in types for name in names}


PRE_TOKENIZERS = _types()

# -- running them -------------------------------------------------------------------------------------------------

_WIDE_SPACES = {c: _SPACE for c in ud.WHITESPACE if c > 0x7F}


@cache
def _collapse_table():
    """The collapsed stand-in of every codepoint."""
    flags = ud.category_flags(np.arange(ud.MAX_CODEPOINT + 1))
    table = np.full(ud.MAX_CODEPOINT + 1, _OTHER, np.uint8)
    for flag, stand_in in _STAND_IN.items():
        table[flags == flag] = stand_in
    table[[c for c in ud.WHITESPACE if c > 0x7F]] = _SPACE
    table[:0x80] = np.arange(0x80)
    return table


def _collapse(text):
    codepoints = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    return _collapse_table()[codepoints].tobytes().decode("latin-1")


@cache
def _compiled(regexes):
    """Each regex as a Python pattern, with whether it runs on the collapsed text."""
    out = []
    for regex in regexes:
        on_collapsed = "\\p{" in regex
        out.append((re.compile(_translate(regex, on_collapsed)), on_collapsed))
    return tuple(out)


def _translate(regex, on_collapsed):
    """An ECMAScript regex, as llama.cpp writes it, in Python's dialect with the same meaning."""
    out, inside, i = [], False, 0
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            escaped = regex[i + 1]
            if escaped == "p" and on_collapsed:
                end = regex.index("}", i)
                flag = _CLASSES[regex[i + 3 : end]]
                members = f"\\x{_STAND_IN[flag]:02x}{_ASCII_MEMBERS[flag]}"
                out.append(members if inside else f"[{members}]")
                i = end + 1
                continue
            if escaped in _ESCAPES:
                out.append(_ESCAPES[escaped] if inside else f"[{_ESCAPES[escaped]}]")
            elif escaped in _NEGATED and not inside:
                out.append(f"[^{_NEGATED[escaped]}]")
            else:
                out.append(regex[i : i + 2])
            i += 2
            continue
        if c == "[" and not inside:
            inside = True
        elif c == "]" and inside:
            inside = False
        elif c == "$" and not inside:
            c = r"\Z"  # ECMAScript's $ is the end of the input only, never before a final newline
        out.append(c)
        i += 1
    return "".join(out)
