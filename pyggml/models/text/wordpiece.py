"""BERT's WordPiece tokenizer (``tokenizer.ggml.model = "bert"``), as llama.cpp's llm_tokenizer_wpm runs it.

The text is normalized (lowercased, accents dropped) and cut into words at whitespace, punctuation and CJK
ideographs; each word, prefixed with ``▁``, is covered greedily by the longest tokens from the left, and a word
that cannot be covered becomes one unknown token. GGUF BERT vocabularies store word-initial pieces with ``▁``
and continuation pieces bare (HF's ``##`` removed), so detokenizing is SentencePiece's.
"""

from pyggml.errors import GGUFError
from pyggml.models.text import unicode_data as ud
from pyggml.models.text.tokenizer import SPACE_ESCAPE, Tokenizer, _flag, unescape_whitespace


def _is_cjk(cp):
    """The CJK ideograph blocks BERT splits on, with the HF bound llama.cpp keeps (0x2B920, not 0x2B820)."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B920 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


class WPMTokenizer(Tokenizer):
    """WordPiece: [CLS] words [SEP], longest-match-first within each word."""

    default_bos, default_eos, default_unk, default_sep, default_pad = 101, None, 100, 102, 0
    add_bos, add_eos, add_space_prefix, clean_spaces = True, False, False, True

    def __init__(self, gguf):
        super().__init__(gguf)
        if self.sep_id is None:
            raise GGUFError(f"{gguf.path}: a WordPiece vocabulary needs a [SEP] token "
                            "(tokenizer.ggml.seperator_token_id)")
        self.lowercase = _flag(gguf, "tokenizer.ggml.normalizer.lowercase", True)
        self.strip_accents = _flag(gguf, "tokenizer.ggml.normalizer.strip_accents", self.lowercase)
        self.max_token_len = int(self.tokens.lengths().max()) if self.n_vocab else 0

    def encode(self, text, add_special=True, parse_special=False):
        """[CLS] (the bos id) and [SEP] come with add_special whatever add_bos says, as in llama.cpp."""
        out = [self.bos_id] if add_special else []
        for fragment in self._partition(text, parse_special):
            if isinstance(fragment, int):
                out.append(fragment)
            else:
                for word in self.words(fragment):
                    self._cover(SPACE_ESCAPE + word, out)
        if add_special:
            out.append(self.sep_id)
        return out

    def words(self, text):
        """BertNormalizer and BertPreTokenizer: llama.cpp's llm_tokenizer_wpm_session::preprocess."""
        words = [""]
        for c in text:
            cp = ord(c)
            if self.strip_accents:
                cp = ud.nfd_first(cp)
            if cp in ud.WHITESPACE:
                if words[-1]:
                    words.append("")
                continue
            flags = ud.category(cp)
            if cp in (0, 0xFFFD) or flags == ud.CONTROL or (self.strip_accents and flags == ud.MARK):
                continue
            s = chr(ud.to_lower(cp) if self.lowercase else cp)
            if flags == ud.PUNCTUATION or (cp < 0x7F and flags == ud.SYMBOL) or _is_cjk(cp):
                if words[-1]:
                    words.append("")
                words[-1] = s
                words.append("")
            else:
                words[-1] += s
        return words if words[-1] else words[:-1]

    def _cover(self, word, out):
        """Longest tokens first from the left; the whole word becomes unknown when any position has none."""
        found, i, n = [], 0, len(word)
        while i < n:
            for j in range(min(n, i + self.max_token_len), i, -1):
                token_id = self.token_to_id.get(word[i:j])
                if token_id is not None:
                    found.append(token_id)
                    i = j
                    break
            else:
                found = []
                break
        out.extend(found or [self.unk_id])

    def _normal_piece(self, text):
        return unescape_whitespace(text)
