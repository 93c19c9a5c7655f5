"""A generation's text as its tokens arrive: incremental detokenizing, stop strings, UTF-8 hold-back.

vLLM's output processor and llama-server's process_token do this job. Each call takes the newly accepted
tokens (one, or several after a speculative step) and returns the text they add, so that the pieces of a
generation add up to `tokenizer.decode(tokens)` cut at the first stop string. The work per call is the
new tokens' text, not the whole output: only the tokens since the last settled point are decoded again.

A point is settled once the bytes before it do not end inside a UTF-8 character and, for tokenizers that clean up
spaces (llama.cpp's clean_up_tokenization_spaces rewrites " ." or " 's" around a space), no space lies in
the last CLEAN_REACH bytes before it: text before a settled point never changes. Text that may begin a stop
string, and the bytes of an incomplete UTF-8 character, are held back until the next tokens (or the end).
"""

from __future__ import annotations

import codecs
from typing import Sequence

CLEAN_REACH = 4  # the longest pattern the space clean-up rewrites (" 've") starts with a space


class TextOutput:
    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self._keep = max((len(s) for s in self.stop), default=1) - 1  # settled characters a stop may reach back
        self._window: list[int] = []  # tokens since the last settled point
        self._window_bytes = bytearray()
        self._settled = 0             # characters before the window
        self._tail = ""               # the last _keep of them, and any not yet handed out
        self._sent = 0                # characters handed out
        self.stopped = False

    def add(self, tokens: Sequence[int], final: bool = False) -> str:
        """The text that `tokens` add (all of what is held back when final). After a stop string the rest is
        dropped and `stopped` is set; the stop string itself is never in the text."""
        if self.stopped:
            return ""
        for t in tokens:
            self._window.append(int(t))
            self._window_bytes += self.tokenizer.token_to_piece(int(t))
        window = self.tokenizer.decode(self._window)
        recent = self._tail + window  # the characters from `base` on
        base = self._settled - len(self._tail)
        end = self._stop_at(recent, base)
        if end is not None:
            self.stopped = True
        elif final:
            end = base + len(recent)
        else:
            shown = recent.rstrip("\ufffd")  # an incomplete character waits, and a stop beginning before it
            held = max((k for s in self.stop for k in range(1, len(s)) if shown.endswith(s[:k])), default=0)
            end = min(len(shown) - held, len(recent) - self._may_change(recent, len(self._tail)))
            end = base + len(recent[:end].rstrip("\ufffd"))  # a piece never ends in a replaced byte
        text = recent[self._sent - base:end - base] if end > self._sent else ""
        self._sent = max(self._sent, end)
        if self._can_settle():
            self._settled += len(window)
            self._tail = recent[max(min(self._sent - base, len(recent) - self._keep), 0):]  # and what is held back
            self._window, self._window_bytes = [], bytearray()
        return text

    def _stop_at(self, recent: str, base: int) -> int | None:
        """Where the first stop string in the text not yet handed out begins (absolute), None without one."""
        hits = [i for i in (recent.find(s, max(self._sent - len(s) - base, 0)) for s in self.stop) if i >= 0]
        return base + min(hits) if hits else None

    def _may_change(self, recent: str, settled: int) -> int:
        """Characters at the end that the space clean-up may still rewrite once more text follows: from a
        space among the last CLEAN_REACH - 1 characters on (never one of the first `settled`)."""
        if not self.tokenizer.clean_spaces:
            return 0
        space = recent.rfind(" ", max(len(recent) - CLEAN_REACH + 1, settled))
        return len(recent) - space if space >= 0 else 0

    def _can_settle(self) -> bool:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        decoder.decode(bytes(self._window_bytes))
        if decoder.getstate()[0]:  # the bytes end inside a character
            return False
        return not (self.tokenizer.clean_spaces and b" " in self._window_bytes[-CLEAN_REACH:])
