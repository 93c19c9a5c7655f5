"""SentencePiece's unigram tokenizer (``tokenizer.ggml.model = "t5"``: T5, XLM-R, nomic-embed-v2), as llama.cpp's
llm_tokenizer_ugm runs it.

The text is first normalized by the model's precompiled character map (a longest-prefix rewrite stored as an
XOR-compressed double array) with spaces escaped as ``▁``; then the Viterbi algorithm picks the segmentation
with the highest sum of token scores, a codepoint no token covers costing the lowest score minus 10.
"""

import numpy as np

from pyggml.errors import GGUFError
from pyggml.models.gguf.gguf_file import GGUFValueType
from pyggml.models.text.tokenizer import SPACE_ESCAPE, Tokenizer, TokenType, _array, _flag, unescape_whitespace

_UNKNOWN_PENALTY = 10.0
_MATCHED_TYPES = {TokenType.NORMAL, TokenType.USER_DEFINED, TokenType.UNUSED}


class CharsMap:
    """``tokenizer.ggml.precompiled_charsmap``: a u32 blob size, the XOR-compressed compact double array of
    that many bytes, then the NUL-terminated replacement strings it points into."""

    def __init__(self, blob, where):
        self.where = where
        if len(blob) < 4:
            raise GGUFError(f"{where}: precompiled_charsmap has {len(blob)} bytes, too few for its size header")
        size = int.from_bytes(blob[:4], "little")
        if size + 4 >= len(blob):
            raise GGUFError(f"{where}: precompiled_charsmap says {size} bytes of trie but has {len(blob) - 4}")
        self.nodes = np.frombuffer(blob[4 : 4 + size - size % 4], "<u4").tolist()
        self.replacements = blob[4 + size :]

    def _node(self, index):
        if index >= len(self.nodes):
            raise GGUFError(f"{self.where}: precompiled_charsmap trie index {index} is out of bounds")
        return self.nodes[index]

    def _base(self, index):
        node = self._node(index)
        return (node >> 10) << ((node & (1 << 9)) >> 6)

    def longest_prefix(self, data, start):
        """(replacement, bytes consumed) of the longest rule matching data[start:], or None."""
        best = None
        index = self._base(0)
        for pos in range(start, len(data)):
            c = data[pos]
            if c == 0:
                break
            index ^= c
            node = self._node(index)
            if node & ((1 << 31) | 0xFF) != c:
                break
            is_leaf = (node >> 8) & 1
            index ^= self._base(index)
            if is_leaf:
                best = (pos - start + 1, self._node(index) & ((1 << 31) - 1))
        if best is None:
            return None
        consumed, offset = best
        end = self.replacements.find(b"\0", offset)
        if offset >= len(self.replacements) or end < 0:
            raise GGUFError(f"{self.where}: precompiled_charsmap replacement at {offset} is out of bounds "
                            "or not terminated")
        return self.replacements[offset:end], consumed


class UGMTokenizer(Tokenizer):
    """Unigram: normalize, then the best-scoring segmentation (llm_tokenizer_ugm_session)."""

    default_bos, default_eos, default_unk, default_pad = None, 1, 2, 0
    add_bos, add_eos, add_space_prefix = False, True, False

    def __init__(self, gguf):
        super().__init__(gguf)
        blob = _array(gguf, "tokenizer.ggml.precompiled_charsmap", (GGUFValueType.UINT8, GGUFValueType.INT8),
                      required=False)
        self.charsmap = None if blob is None or len(blob) == 0 else \
            CharsMap(np.asarray(blob).astype(np.uint8).tobytes(), gguf.path)
        self.remove_extra_whitespaces = _flag(gguf, "tokenizer.ggml.remove_extra_whitespaces", False)
        # the candidates, from the file's token types (llama.cpp builds them before it marks tokens by text)
        types = _array(gguf, "tokenizer.ggml.token_type", (GGUFValueType.INT32,), required=False)
        types = [TokenType.NORMAL] * self.n_vocab if types is None else types[: self.n_vocab].tolist()
        texts = self.tokens.tolist()
        self.candidates = {texts[i]: i for i, t in enumerate(types) if t in _MATCHED_TYPES}
        self.user_defined = {texts[i].encode("utf-8") for i, t in enumerate(types) if t == TokenType.USER_DEFINED}
        self.user_defined_lengths = sorted({len(t) for t in self.user_defined}, reverse=True)
        self.token_scores = [0.0 if t == TokenType.USER_DEFINED else float(s)
                             for t, s in zip(types, self.scores, strict=True)]
        normal = [s for t, s in zip(types, self.scores, strict=True) if t == TokenType.NORMAL]
        self.unknown_score = (min(normal) if normal else float(np.finfo(np.float32).max)) - _UNKNOWN_PENALTY
        self.max_token_chars = max(map(len, self.candidates), default=0)

    def _encode_fragments(self, fragments, out):
        for fragment in fragments:
            if isinstance(fragment, int):
                out.append(fragment)
            else:
                out.extend(self._viterbi(self.normalize(fragment)))

    def normalize(self, text):
        """The charsmap's rewrite, with spaces escaped, prefixed and (optionally) merged."""
        data = text.encode("utf-8")
        out, prefixed, in_word, pos = bytearray(), False, False, 0
        space = SPACE_ESCAPE.encode("utf-8")
        while pos < len(data):
            piece, consumed = self._normalize_prefix(data, pos)
            for c in piece:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (self.add_space_prefix and not prefixed) or self.remove_extra_whitespaces:
                            out += space
                            prefixed = True
                    out.append(c)
                else:
                    in_word = False
                    if not self.remove_extra_whitespaces:
                        out += space
            pos += consumed
        return out.decode("utf-8", "replace")

    def _normalize_prefix(self, data, pos):
        """A user-defined token stays as it is; else the charsmap's longest rule; else one character."""
        for length in self.user_defined_lengths:
            if data[pos : pos + length] in self.user_defined:
                return data[pos : pos + length], length
        rule = self.charsmap.longest_prefix(data, pos) if self.charsmap else None
        if rule is not None:
            return rule
        length = _utf8_length(data[pos])
        return data[pos : pos + length], length

    def _viterbi(self, text):
        """Best segmentation by total score; runs of unknown codepoints become one unknown token."""
        n = len(text)
        if n == 0:
            return []
        best = [(-float("inf"), self.unk_id, 0)] * (n + 1)  # (score, token, start) of the best path to here
        best[0] = (0.0, self.unk_id, 0)
        candidates, scores = self.candidates, self.token_scores
        for start in range(n):
            score_here = best[start][0]
            single = False
            for end in range(start + 1, min(n, start + self.max_token_chars) + 1):
                token_id = candidates.get(text[start:end])
                if token_id is None:
                    continue
                single = single or end == start + 1
                score = score_here + scores[token_id]
                if score > best[end][0]:
                    best[end] = (score, token_id, start)
            if not single and score_here + self.unknown_score > best[start + 1][0]:
                best[start + 1] = (score_here + self.unknown_score, self.unk_id, start)
        ids, pos, prev_unknown = [], n, False
        while True:
            _, token_id, start = best[pos]
            unknown = token_id == self.unk_id
            if not (prev_unknown and unknown):
                ids.append(token_id)
            if start == 0:
                break
            prev_unknown, pos = unknown, start
        return ids[::-1]

    def _normal_piece(self, text):
        return unescape_whitespace(text)


def _utf8_length(lead):
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[lead >> 4]
