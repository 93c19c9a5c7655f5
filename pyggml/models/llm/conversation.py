"""A conversation with one model, turn by turn, as llama.cpp's `llama-cli -cnv` holds it: the whole history is
rendered by the model's chat template each turn, and only what changed since the last turn is decoded (the KV
cache keeps the common prefix). When history and a reply's room no longer fit the context, the oldest turns are
dropped (the system message stays). Images go in the history as OpenAI image_url parts; each turn finds them
in the encoder's cache of images, and the KV cache is reused through an image it still holds (see
cached_prefix), so a turn about an image reads only the new messages."""

from __future__ import annotations

import time
from typing import Iterator

from pyggml.errors import ImageError, ParameterError
from pyggml.models.llm.cached_prefix import prompt_cells, reusable_prefix
from pyggml.models.llm.generate import Sampler, SamplingParams
from pyggml.models.vision.content import has_image_parts, image_part, split_image_parts
from pyggml.models.vision.prompt import Prompt


class Conversation:
    """`reply(text)` yields the answer's pieces as they are made; `messages` is the history the model sees.
    `reply_room` tokens are kept free for each answer (and bound its length; -1: a quarter of the context)."""

    def __init__(self, model, system: str | None = None, params: SamplingParams = SamplingParams(),
                 reply_room: int = -1):
        self.model, self.params, self.system = model, params, system
        self.reply_room = model.n_ctx // 4 if reply_room == -1 else reply_room
        if not 0 < self.reply_room < model.n_ctx:
            raise ParameterError(f"the reply's room must be 1 to {model.n_ctx - 1} tokens, got {self.reply_room}")
        self.turns: list[dict] = []   # user and assistant messages, oldest first
        self.cached: list[int] = []   # what the KV cache's cells hold (sequence 0), from position 0
        self.dropped = 0              # turns dropped by the last reply to fit the context
        self.last = {"prompt_tokens": 0, "prompt_s": 0.0, "gen_tokens": 0, "gen_s": 0.0}

    @property
    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def clear(self) -> None:
        self.turns = []

    def _render(self) -> list[int] | Prompt:
        """The history's tokens; with images, a prompt whose images are encoded (Model.image_prompt)."""
        if not has_image_parts(self.messages):
            return self.model.tokenize(self.model.chat_prompt(self.messages), add_special=True, parse_special=True)
        messages, images = split_image_parts(self.messages)
        return self.model.image_prompt(self.model.chat_prompt(messages), images)

    def _prompt_ids(self) -> list[int] | Prompt:
        """The history's tokens, after dropping the oldest turns (a user message and its answer) that do not fit
        beside the reply's room."""
        self.dropped = 0
        while True:
            ids = self._render()
            if len(ids) + self.reply_room <= self.model.n_ctx:
                return ids
            if len(self.turns) <= 1:
                raise ParameterError(f"the message takes {len(ids)} tokens; with {self.reply_room} for the reply it "
                                     f"does not fit the context of {self.model.n_ctx} tokens")
            drop = 2 if self.turns[1]["role"] == "assistant" else 1
            self.turns = self.turns[drop:]
            self.dropped += drop

    def reply(self, text: str, images: list[str] = ()) -> Iterator[str]:
        """Add the user's message (with `images`: data URLs) and yield the answer's text as it is made. Closing
        the iterator early (or an interruption) keeps what was said so far as the answer."""
        content = [{"type": "text", "text": text}] + [image_part(url) for url in images] if images else text
        self.turns.append({"role": "user", "content": content})
        try:
            ids = self._prompt_ids()
        except (ParameterError, ImageError):
            self.turns.pop()
            raise
        answer: list[int] = []
        shown = ""
        try:
            for token in self._generate(ids, answer):
                answer.append(token)
                text_so_far = self.model.detokenize(answer)
                if not text_so_far.endswith("\ufffd"):   # wait for the rest of a UTF-8 character
                    yield text_so_far[len(shown):]
                    shown = text_so_far
        except BaseException:
            self.model.reset()  # an interrupted step may have left cells half written: decode afresh next turn
            self.cached = []
            raise
        finally:
            self.turns.append({"role": "assistant", "content": self.model.detokenize(answer)})
        rest = self.model.detokenize(answer)[len(shown):]
        if rest:
            yield rest

    def _generate(self, prompt: list[int] | Prompt, answer: list[int]) -> Iterator[int]:
        model, last = self.model, self.last
        ids, images = prompt.engine_prompt() if isinstance(prompt, Prompt) else (prompt, [])
        cells = prompt_cells(ids, images)
        keep = min(reusable_prefix(cells, self.cached, images), len(ids) - 1)
        model.seq_rm(0, keep, -1)
        self.cached = cells[:keep]
        sampler = Sampler(self.params)
        for t in cells:
            if t >= 0:  # tokens, not image rows
                sampler.accept(t)
        start = time.perf_counter()
        logits = model.decode_prompt(prompt, keep)
        self.cached = cells
        last.update(prompt_tokens=len(ids) - keep, prompt_s=time.perf_counter() - start, gen_tokens=0, gen_s=0.0)
        for _ in range(self.reply_room):
            token = sampler.sample(logits)
            if model.tokenizer.is_eog(token):
                return
            sampler.accept(token)
            yield token
            start = time.perf_counter()
            logits = model.decode([token])
            self.cached.append(token)
            last["gen_tokens"] += 1
            last["gen_s"] += time.perf_counter() - start
