"""Tokenizers built from a GGUF file's vocabulary, matching llama.cpp token for token.

The vocabulary kinds, as llama.cpp names them:

- SPM (``tokenizer.ggml.model = "llama"``, e.g. Llama 2, Gemma): spaces become
  ``▁``, adjacent symbols merge by highest token score, and text no token covers
  falls back to ``<0xXX>`` byte tokens.
- BPE (``"gpt2"``, e.g. GPT-2, Llama 3, Qwen 2): a pre-tokenizer (pre_tokenizer.py)
  splits the text into words, bytes map to printable characters, and pairs merge by
  rank; ``"gemma4"`` is BPE over raw UTF-8 with SentencePiece's ``▁``.
- WPM (``"bert"``) and UGM (``"t5"``) build on this module's Tokenizer in
  wordpiece.py and unigram.py.

All first cut special tokens (control, user-defined, unknown) out of the text, as
llama.cpp's ``tokenizer_st_partition`` does, and all detokenize like
``llama_detokenize``. The file is laid out as the algorithm runs: vocabulary,
special-token partition, the SPM and BPE sessions, then pieces and detokenize.
"""

import heapq
from enum import IntEnum, IntFlag

import numpy as np

from pyggml.errors import GGUFError, TokenizerError
from pyggml.models.gguf.gguf_file import GGUFValueType
from pyggml.models.text.pre_tokenizer import PRE_TOKENIZERS
from pyggml.models.gguf.string_table import StringTable

SPACE_ESCAPE = "\u2581"  # ▁, SentencePiece's visible space
C_SPACES = " \t\n\v\f\r"  # what C's isspace() accepts, used by lstrip/rstrip
WORD_CACHE = 1 << 15  # distinct words whose BPE tokens a tokenizer keeps (BPETokenizer._merge): a few MiB


class TokenType(IntEnum):
    """``tokenizer.ggml.token_type`` values (llama_token_type)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr(IntFlag):
    """llama.cpp's per-token attributes (llama_token_attr)."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# Attributes are kept as plain ints: enum arithmetic over 262k tokens costs a second.
_ATTR_OF_TYPE = {int(TokenType[a.name]): int(a) for a in (
    TokenAttr.UNKNOWN, TokenAttr.UNUSED, TokenAttr.NORMAL, TokenAttr.CONTROL, TokenAttr.USER_DEFINED, TokenAttr.BYTE)}
_ATTRS_BY_TYPE = np.array([_ATTR_OF_TYPE.get(t, 0) for t in range(max(_ATTR_OF_TYPE) + 1)], np.int64)
_CONTROL, _UNUSED, _USER_DEFINED = int(TokenAttr.CONTROL), int(TokenAttr.UNUSED), int(TokenAttr.USER_DEFINED)
_NORMAL, _BYTE = int(TokenAttr.NORMAL), int(TokenAttr.BYTE)
_LSTRIP, _RSTRIP = int(TokenAttr.LSTRIP), int(TokenAttr.RSTRIP)
_SPECIAL = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)
_HIDDEN_UNLESS_SPECIAL = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)

# Token texts llama.cpp treats as end-of-turn / end-of-generation when the file does not say.
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<｜end▁of▁sentence｜>", "[e~[")

# Fill-in-the-middle tokens: (deprecated key name, texts llama.cpp looks for)
_FIM_TEXTS = {
    "fim_pre": ("prefix", ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                           "<|code_prefix|>", "<|prefix|>")),
    "fim_suf": ("suffix", ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                           "<|code_suffix|>", "<|suffix|>")),
    "fim_mid": ("middle", ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                           "<|code_middle|>", "<|middle|>")),
    "fim_pad": (None, ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    "fim_rep": (None, ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    "fim_sep": (None, ("<|file_sep|>",)),
}
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


def _first_present(ids, texts):
    return next((ids[t] for t in texts if t in ids), None)


def _array(gguf, key, element_types, required=True):
    """A metadata array, checked the way llama.cpp checks vocabulary arrays."""
    if key not in gguf.metadata:
        if required:
            raise GGUFError(f"{gguf.path}: tokenizer metadata '{key}' is missing")
        return None
    ftype = gguf.field_types[key]
    if ftype.type != GGUFValueType.ARRAY or ftype.element_type not in element_types:
        names = " or ".join(t.name for t in element_types)
        raise GGUFError(f"{gguf.path}: '{key}' must be an array of {names}")
    return gguf.metadata[key]


def _flag(gguf, key, default):
    value = gguf.get(key, default)
    if not isinstance(value, bool):
        raise GGUFError(f"{gguf.path}: '{key}' is {value!r}, expected a bool")
    return value


def _bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable characters (so no byte is whitespace or control)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


class Tokenizer:
    """Vocabulary, special tokens and detokenization shared by the SPM and BPE tokenizers.

    Subclasses give llama.cpp's defaults for their vocabulary kind (special ids and
    flags, overridden by the file's metadata) and implement ``_encode_fragments``
    and ``_normal_piece``.
    """

    default_bos: int | None
    default_eos: int | None
    default_unk: int | None
    default_sep: int | None = None
    default_pad: int | None = None
    add_bos = False
    force_bos = False  # add_bos whatever the file says
    add_eos = False
    add_space_prefix = False
    clean_spaces = False

    def __init__(self, gguf):
        tokens = _array(gguf, "tokenizer.ggml.tokens", (GGUFValueType.STRING,))
        n = len(tokens)
        scores = _array(gguf, "tokenizer.ggml.scores", (GGUFValueType.FLOAT32, GGUFValueType.INT32), required=False)
        types = _array(gguf, "tokenizer.ggml.token_type", (GGUFValueType.INT32,), required=False)
        for key, values in (("tokenizer.ggml.scores", scores), ("tokenizer.ggml.token_type", types)):
            if values is not None and len(values) < n:
                raise GGUFError(f"{gguf.path}: '{key}' has {len(values)} entries for {n} tokens")
        if (tokens.lengths() == 0).any():  # llama.cpp names empty tokens so that each has a text
            tokens = StringTable.from_strings(t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens))
        self.tokens = tokens
        self.token_to_id = tokens.ids
        repeat = tokens.first_repeat()
        if repeat is not None:
            raise GGUFError(f"{gguf.path}: tokenizer.ggml.tokens[{repeat[0]}] duplicates token {repeat[1]} "
                            f"({tokens[repeat[0]]!r})")
        self.scores = np.asarray(scores[:n], np.float64) if scores is not None else np.zeros(n)
        if types is None:
            self.attrs = [_NORMAL] * n
        else:
            known = (types[:n] >= 0) & (types[:n] < _ATTRS_BY_TYPE.size)  # any other type: no attributes
            self.attrs = np.where(known, _ATTRS_BY_TYPE[np.where(known, types[:n], 0)], 0).tolist()
        self.bos_id = self._special_id(gguf, "bos_token_id", self.default_bos)
        self.eos_id = self._special_id(gguf, "eos_token_id", self.default_eos)
        self.unk_id = self._special_id(gguf, "unknown_token_id", self.default_unk)
        self.eot_id = self._special_id(gguf, "eot_token_id", None)
        self.eom_id = self._special_id(gguf, "eom_token_id", None)
        self.sep_id = self._special_id(gguf, "seperator_token_id", self.default_sep)
        self.pad_id = self._special_id(gguf, "padding_token_id", self.default_pad)
        self.add_bos = _flag(gguf, "tokenizer.ggml.add_bos_token", self.add_bos) or self.force_bos
        self.add_eos = _flag(gguf, "tokenizer.ggml.add_eos_token", self.add_eos)
        self.add_space_prefix = _flag(gguf, "tokenizer.ggml.add_space_prefix", self.add_space_prefix)
        for flag, token_id, name in ((self.add_bos, self.bos_id, "bos"), (self.add_eos, self.eos_id, "eos")):
            if flag and token_id is None:
                raise GGUFError(f"{gguf.path}: tokenizer.ggml.add_{name}_token is true but there is no {name} token")
        self._find_special_by_text(gguf)
        special = [i for i, a in enumerate(self.attrs) if a & _SPECIAL]
        self.special_ids = sorted(special, key=lambda i: -len(self.tokens[i]))
        self._strip_rules(gguf)

    def _special_id(self, gguf, name, default):
        """A special token id from metadata; out-of-range ids keep the default, as llama.cpp does."""
        if default is not None and default >= len(self.tokens):
            default = None
        value = gguf.get(f"tokenizer.ggml.{name}")
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(self.tokens):
            return value
        return default

    def _find_special_by_text(self, gguf):
        """End-of-turn, fill-in-the-middle and end-of-generation tokens, found by text where the file is silent,
        in llama.cpp's order and with its model-specific exceptions.

        Tokens found by text become control tokens (so they are hidden and parsed only as special), as
        llama.cpp forces; ids from the file keep their type.
        """
        ids = self.token_to_id
        found = set()
        if self.eot_id is None:
            self.eot_id = _first_present(ids, _EOT_TEXTS)
            found.add(self.eot_id)
        if self.eom_id is None:
            self.eom_id = _first_present(ids, ("<|eom_id|>",))
            found.add(self.eom_id)
        self.fim_ids = {}
        for kind, (deprecated, texts) in _FIM_TEXTS.items():
            token_id = self._special_id(gguf, f"{kind}_token_id", None)
            token_id = self._special_id(gguf, f"{deprecated}_token_id", token_id) if deprecated else token_id
            if token_id is None:
                token_id = _first_present(ids, texts)
                found.add(token_id)
            self.fim_ids[kind] = token_id
        for i in found - {None}:
            self.attrs[i] |= _CONTROL
        self._mark_unused()
        by_text = {ids[t] for t in _EOG_TEXTS if t in ids}
        for i in by_text:
            self.attrs[i] |= _CONTROL
        for text in _ALWAYS_RENDERED:  # gpt-oss's channel markers
            if text in ids:
                self.attrs[ids[text]] = _USER_DEFINED
        eog = by_text | {self.fim_ids["fim_pad"], self.fim_ids["fim_rep"], self.fim_ids["fim_sep"], self.eos_id,
                         self.eot_id, self.eom_id}
        self.eog_ids = eog - {None}
        texts = {self.tokens[i]: i for i in self.eog_ids}
        has_call = "<|call|>" in texts or "<|calls|>" in texts
        if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
            self._demote(texts["<|end|>"], _USER_DEFINED)  # o200k_harmony and solar-open: <|end|> ends a message only
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            self._demote(texts["</s>"], _NORMAL)  # gemma4 and plamo: </s> is plain text

    def _demote(self, token_id, attr):
        self.eog_ids.discard(token_id)
        self.attrs[token_id] = attr

    def _strip_rules(self, gguf):
        """Whitespace stripping around special tokens, which GGUF cannot express: llama.cpp
        sets it by model and pre-tokenizer name, and so does this."""
        name = str(gguf.get("general.name", "")).lower()
        pre = str(gguf.get("tokenizer.ggml.pre", ""))
        arch = str(gguf.get("general.architecture", ""))
        if any(p in pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
                any(a in arch for a in ("nomic-bert-moe", "jina-bert-v3")):
            self._set_attr("<mask>", _LSTRIP, True)
        elif "phi-3" in name or "phi3" in name:
            for i in self.special_ids:
                self.attrs[i] |= _RSTRIP
            self._set_attr("</s>", _RSTRIP, True)
            for text in ("<unk>", "<s>", "<|endoftext|>"):
                self._set_attr(text, _RSTRIP, False)
        elif "modern-bert" in name:
            self._set_attr("[MASK]", _LSTRIP, True)

    def _set_attr(self, text, flag, on):
        if text in self.token_to_id:
            i = self.token_to_id[text]
            self.attrs[i] = self.attrs[i] | flag if on else self.attrs[i] & ~flag

    def _mark_unused(self):
        for i, attr in enumerate(self.attrs):
            if attr & _CONTROL and "unused" in self.tokens[i]:
                self.attrs[i] = attr | _UNUSED

    @property
    def n_vocab(self):
        return len(self.tokens)

    def is_eog(self, token_id):
        return token_id in self.eog_ids

    def _check_id(self, token_id):
        if not 0 <= token_id < len(self.tokens):
            raise TokenizerError(f"token id {token_id} is outside the vocabulary of {len(self.tokens)} tokens")

    # -- special-token partition (tokenizer_st_partition) --------------------------

    def _partition(self, text, parse_special):
        """Split text into raw strings and special token ids, longest special tokens first."""
        fragments = [text] if text else []
        for token_id in self.special_ids:
            attr = self.attrs[token_id]
            if not parse_special and attr & _HIDDEN_UNLESS_SPECIAL:
                continue
            piece = self.tokens[token_id]
            if not any(isinstance(f, str) and piece in f for f in fragments):
                continue
            split = []
            for fragment in fragments:
                if isinstance(fragment, str) and piece in fragment:
                    split.extend(self._split_on(fragment, piece, token_id, attr))
                else:
                    split.append(fragment)
            fragments = split
        return fragments

    @staticmethod
    def _split_on(text, piece, token_id, attr):
        out, pos = [], 0
        while (match := text.find(piece, pos)) >= 0:
            left = text[pos:match]
            if attr & _LSTRIP:
                left = left.rstrip(C_SPACES)
            if left:
                out.append(left)
            out.append(token_id)
            pos = match + len(piece)
            if attr & _RSTRIP:
                while pos < len(text) and text[pos] in C_SPACES:
                    pos += 1
        if pos < len(text):
            out.append(text[pos:])
        return out

    # -- pieces and detokenization -------------------------------------------------

    def token_to_piece(self, token_id, special=False):
        """The bytes one token stands for (llama_token_to_piece with lstrip 0); may be partial UTF-8."""
        self._check_id(token_id)
        attr = self.attrs[token_id]
        if not special and attr & _HIDDEN_UNLESS_SPECIAL:
            return b""
        text = self.tokens[token_id]
        if attr & (_HIDDEN_UNLESS_SPECIAL | _USER_DEFINED):
            return text.encode("utf-8")
        if attr & _NORMAL:
            return self._normal_piece(text)
        if attr & _BYTE:
            return bytes([_hex_byte(text)])
        return b""

    def decode_bytes(self, ids, remove_special=False, unparse_special=False):
        """Concatenated pieces, as llama_detokenize returns them."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        out = bytearray()
        for token_id in ids:
            piece = self.token_to_piece(token_id, unparse_special)
            if remove_space and piece.startswith(b" "):
                piece = piece[1:]
            remove_space = False
            out += piece
        return _clean_spaces(out) if self.clean_spaces else bytes(out)

    def decode(self, ids, remove_special=False, unparse_special=False):
        """Text of the ids; bytes that are not valid UTF-8 (e.g. a cut emoji) become U+FFFD."""
        return self.decode_bytes(ids, remove_special, unparse_special).decode("utf-8", "replace")

    def encode(self, text, add_special=True, parse_special=False):
        """Token ids of text, as llama_tokenize returns them."""
        out = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        self._encode_fragments(self._partition(text, parse_special), out)
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out


class SPMTokenizer(Tokenizer):
    """SentencePiece-style tokenizer: merges by score over the whole fragment, byte fallback."""

    default_bos, default_eos, default_unk = 1, 2, 0
    add_bos, add_eos, add_space_prefix = True, False, True

    def __init__(self, gguf):
        super().__init__(gguf)
        self._byte_ids = [self._byte_token(b) for b in range(256)]

    def _byte_token(self, b):
        token_id = self.token_to_id.get(f"<0x{b:02X}>")
        if token_id is None and b < 0x80:
            token_id = self.token_to_id.get(chr(b))
        return token_id

    def _encode_fragments(self, fragments, out):
        prev_special = True
        for fragment in fragments:
            if isinstance(fragment, int):
                out.append(fragment)
                prev_special = True
                continue
            if self.add_space_prefix and prev_special:
                fragment = " " + fragment
            self._merge(fragment.replace(" ", SPACE_ESCAPE), out)
            prev_special = False

    def _merge(self, text, out):
        """llm_tokenizer_spm_session: merge the best-scoring adjacent pair until none forms a token."""
        n = len(text)
        if n == 0:
            return
        token_to_id, scores = self.token_to_id, self.scores
        length = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1

        def pair(left, right):
            size = length[left] + length[right]
            token_id = token_to_id.get(text[left : left + size])
            return None if token_id is None else (-scores[token_id], left, right, size)

        queue = [p for p in (pair(i - 1, i) for i in range(1, n)) if p is not None]
        heapq.heapify(queue)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue  # stale: one side merged since this pair was queued
            length[left] = size
            length[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            for a, b in ((prev[left], left), (left, nxt[left])):
                if a >= 0 and b >= 0 and (p := pair(a, b)) is not None:
                    heapq.heappush(queue, p)
        i = 0
        while i != -1:
            # Every merged symbol is a token by construction, so only single characters can miss
            # (llama.cpp's rev_merge resegmentation never finds anything to split).
            symbol = text[i : i + length[i]]
            token_id = token_to_id.get(symbol)
            if token_id is not None:
                out.append(token_id)
            else:
                out.extend(self._byte_id(b, symbol) for b in symbol.encode("utf-8"))
            i = nxt[i]

    def _byte_id(self, b, symbol):
        token_id = self._byte_ids[b]
        if token_id is None:
            raise GGUFError(f"vocabulary has no byte token <0x{b:02X}> for {symbol!r} (byte fallback)")
        return token_id

    def _normal_piece(self, text):
        return unescape_whitespace(text)


class BPETokenizer(Tokenizer):
    """BPE: a pre-tokenizer splits the text into words, whose symbols merge by rank.

    Byte-level (GPT-2) vocabularies map each word's UTF-8 bytes to printable characters first;
    SentencePiece-style ones (Gemma 4) merge raw UTF-8 with spaces escaped as ``▁`` and fall back
    to ``<0xXX>`` byte tokens.
    """

    default_bos, default_eos, default_unk = 11, 11, None
    clean_spaces = True

    def __init__(self, gguf, pre=None):
        pre = pre or gguf.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            raise GGUFError(f"{gguf.path}: tokenizer.ggml.pre '{pre}' is not supported "
                            f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
        self.pre_tokenizer = PRE_TOKENIZERS[pre]
        self.clean_spaces = self.pre_tokenizer.clean_spaces
        if self.pre_tokenizer.add_bos is not None:
            self.add_bos = self.pre_tokenizer.add_bos
        self.force_bos = self.pre_tokenizer.force_bos
        if not self.pre_tokenizer.default_bos:
            self.default_bos = None
        super().__init__(gguf)
        merges = list(_array(gguf, "tokenizer.ggml.merges", (GGUFValueType.STRING,)))
        # by text, and a merge listed twice keeps its first rank (the later entries are written first)
        self.ranks = dict(zip(reversed(merges), range(len(merges) - 1, -1, -1), strict=True))
        self._byte_to_char = _bytes_to_unicode()
        self._char_to_byte = {c: b for b, c in self._byte_to_char.items()}
        self._word_tokens: dict[str, tuple[int, ...]] = {}  # a word's tokens, merged once (see _merge)

    def _words(self, text):
        """The pre-tokenizer's words, byte-encoded where the vocabulary is byte-level."""
        if self.pre_tokenizer.escape_whitespaces:
            text = text.replace(" ", SPACE_ESCAPE)
        words = self.pre_tokenizer.split(text)
        if not self.pre_tokenizer.byte_encode:
            return words
        to_char = self._byte_to_char
        return ["".join(to_char[b] for b in word.encode("utf-8")) for word in words]

    def _encode_fragments(self, fragments, out):
        for fragment in fragments:
            if isinstance(fragment, int):
                out.append(fragment)
            else:
                for word in self._words(fragment):
                    self._merge(word, out)

    def _whole_word(self, word):
        """The word's own token when llama.cpp takes it without merging: always with ignore_merges,
        and for a run of newlines in Gemma 4."""
        if self.pre_tokenizer.ignore_merges or (self.pre_tokenizer.name == "gemma4" and not word.strip("\n")):
            return self.token_to_id.get(word)
        return None

    def _rank(self, left, right):
        """The rank of the merge of left and right, or None. A merge's text is split at its first space after
        the first character, as llama.cpp splits it; the ranks are kept by text (no pair built for each of a
        vocabulary's merges at load), so a text found is the pair's only if it splits there."""
        text = f"{left} {right}"
        rank = self.ranks.get(text)
        return rank if rank is not None and text.find(" ", 1) == len(left) else None

    def _merge(self, word, out):
        """The word's tokens onto out, merged once per word: a text's words repeat (a 35,000-character prompt of
        one repeated paragraph merged word by word took 0.25 s, the merges of its few distinct words almost none).
        At most WORD_CACHE words are kept; a word's tokens depend on nothing else."""
        tokens = self._word_tokens.get(word)
        if tokens is None:
            tokens = self._merged(word)
            if len(self._word_tokens) < WORD_CACHE:
                self._word_tokens[word] = tokens
        out.extend(tokens)

    def _merged(self, word) -> tuple[int, ...]:
        """llm_tokenizer_bpe_session for one word: merge the lowest-ranked pair until none is left."""
        token_to_id = self.token_to_id
        whole = self._whole_word(word)
        if whole is not None:
            return (whole,)
        symbols = list(word)
        nxt = list(range(1, len(symbols) + 1))
        nxt[-1] = -1
        prev = list(range(-1, len(symbols) - 1))
        queue = []

        def try_pair(left, right):
            if left < 0 or right < 0:
                return
            rank = self._rank(symbols[left], symbols[right])
            if rank is not None:
                heapq.heappush(queue, (rank, left, right, symbols[left] + symbols[right]))

        for i in range(1, len(symbols)):
            try_pair(i - 1, i)
        while queue:
            _, left, right, text = heapq.heappop(queue)
            if not symbols[left] or not symbols[right] or symbols[left] + symbols[right] != text:
                continue  # stale: one side merged since this pair was queued
            symbols[left], symbols[right] = text, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            try_pair(prev[left], left)
            try_pair(left, nxt[left])
        out = []
        for symbol in symbols:
            if symbol:
                token_id = token_to_id.get(symbol)
                out.extend([token_id] if token_id is not None else self._unknown_symbol(symbol))
        return tuple(out)

    def _unknown_symbol(self, symbol):
        """llama.cpp looks each UTF-8 byte of a symbol no token covers up alone, and drops the misses:
        as a character of its own (byte-level; only ASCII can be found) or as ``<0xXX>``."""
        if self.pre_tokenizer.byte_encode:
            keys = [c for c in symbol if c < "\x80"]
        else:
            keys = [f"<0x{b:02X}>" for b in symbol.encode("utf-8")]
        return [self.token_to_id[k] for k in keys if k in self.token_to_id]

    def _normal_piece(self, text):
        if self.pre_tokenizer.escape_whitespaces:
            return unescape_whitespace(text)
        out = bytearray()
        for c in text:
            b = self._char_to_byte.get(c)
            if b is None:
                utf8 = c.encode("utf-8")
                out += b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode("utf-8") + b"]"
            else:
                out.append(b)
        return bytes(out)


class Gemma4Tokenizer(BPETokenizer):
    """``tokenizer.ggml.model = "gemma4"``: SentencePiece-style BPE with its own pre-tokenizer and no
    default special ids."""

    default_bos = default_eos = None

    def __init__(self, gguf):
        super().__init__(gguf, pre="gemma4")


def unescape_whitespace(text):
    """A SentencePiece piece's bytes: ``▁`` back to a space (llama_unescape_whitespace)."""
    return text.replace(SPACE_ESCAPE, " ").encode("utf-8")


def _hex_byte(text):
    """The byte of a '<0xXX>' token, read like strtol: leading hex digits only, 0 when there are none."""
    digits = ""
    for c in text[3:5]:
        if c not in "0123456789abcdefABCDEF":
            break
        digits += c
    return int(digits, 16) if digits else 0


def _clean_spaces(text):
    """llama.cpp's clean_up_tokenization_spaces, pass for pass on the raw bytes."""
    buf = bytearray(text)
    # " ?", " !", " .", " ,": drop the space
    total, n = (1 if buf else 0), len(buf)
    for i in range(1, n):
        x = buf[i]
        if buf[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        buf[total] = x
        total += 1
    # " ' ": drop both spaces
    n, total, i = total, (1 if total else 0), 1
    while i < n:
        x = buf[i]
        if x == 0x27 and i + 1 < n and buf[i - 1] == 0x20 and buf[i + 1] == 0x20:
            total -= 1
            i += 1
            buf[i] = 0
        buf[total] = x
        total += 1
        i += 1
    # " 's", " 'm", " 're", " 've": drop the space
    n, total = total, (1 if total else 0)
    for i in range(1, n):
        x = buf[i]
        if buf[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = buf[i + 1]
            if x1 in b"sm" or x1 not in b"td" and i + 2 < n and (x1, buf[i + 2]) in ((0x72, 0x65), (0x76, 0x65)):
                total -= 1
        buf[total] = x
        total += 1
    return bytes(buf[:total])
