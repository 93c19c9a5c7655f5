"""The engine's scheduler: which request gets which slot, from which cached prefix, and what the next batch
holds (llama-server's slot assignment and batch building; vLLM's scheduler). It decides; the engine runs
the batch and turns its logits into tokens and text.

Prefix reuse (llama-server's cache_prompt): a finished slot keeps its cells; a new request starts from the
longest prefix of its prompt held by any slot, busy or idle (an idle slot's own cells are reused in place,
another's are shared with seq_cp), and reads only the rest. Idle slots' cells are given up (least recently
used first) when a request needs room. A request may be pinned to one slot (llama-server's id_slot) and may
ask to read its whole prompt (cache_prompt false).

Cells are promised up front: a request is admitted only when the cache has room for the rest of its prompt
and for every token it may still generate, counting what the running requests may still write; otherwise it
waits. So a running request never finds the cache full.

Images (a request's embedding rows in place of placeholder tokens) are decoded alone when the prompt reaches
them; `cached` lists their cells by the image's identity (a negative number, see cached_prefix), so a prompt
that holds the same image at the same position after the same tokens reuses its cells, and reuse stops at the
first image (or token) that differs; rows of no known image are never reused. A speculative draft only borrows
cells from its own promise (a draft is never longer than the tokens the request may still write) and gives back
what the target rejects.

Context shift (llama-server's --context-shift): a request holds at most its share of the context less one
cell; when it is full, its first n_keep tokens (and the BOS) stay, the oldest half of the rest is dropped and
the later ones move down (seq_rm, then seq_add: their cached keys are rotated to the new positions), which
gives the dropped cells back to its promise. A shifting slot never shares cells with another (a move would
move the other's too): prefixes are reused only from an idle slot's own cells, and a shifted sequence's
cells are freed when it ends (its moved tokens were computed over the dropped ones, so they are no prompt's
prefix).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from pyggml.models.llm.batch import Batch
from pyggml.models.llm.cached_prefix import cell_identity, prompt_cells, reusable_prefix
from pyggml.models.llm.generate import Sampler
from pyggml.models.llm.text_output import TextOutput


@dataclass
class Slot:
    seq_id: int
    cached: list[int] = field(default_factory=list)  # what this sequence's cells hold, positions 0, 1, ...
    handle: object | None = None    # the running request's Handle
    last_used: float = 0.0
    # the running request's state
    fed: int = 0                    # prompt tokens in the cache
    n_cached: int = 0               # of which reused
    max_new: int = 0
    cells_left: int = 0             # cells it may still write
    generated: list[int] = field(default_factory=list)
    pending: int | None = None      # the last sampled token, fed with the next step
    draft: list[int] = field(default_factory=list)  # tokens guessed after pending, fed with it
    n_drafted: int = 0
    n_accepted: int = 0
    sampler: Sampler | None = None
    output: TextOutput | None = None  # the generated text as it is streamed
    share: int = 0                  # the positions it may hold (context shift: it shifts before the last one)
    truncated: bool = False         # context shift: the oldest tokens were dropped

    @property
    def prompt(self) -> list[int]:
        return self.handle.request.prompt

    def start(self, handle, reused: list[int], max_new: int, cells: int, share: int, tokenizer) -> None:
        """Run the request from the cells it reuses (what they hold: its prompt's first cells)."""
        request, reuse = handle.request, len(reused)
        self.cached = reused
        self.handle, self.fed, self.n_cached, self.max_new, self.cells_left = handle, reuse, reuse, max_new, cells
        self.generated, self.pending, self.draft, self.n_drafted, self.n_accepted = [], None, [], 0, 0
        self.share, self.truncated = share, False
        self.sampler = Sampler(request.sampling)
        image_positions = {p for pos, rows in request.images for p in range(pos, pos + len(rows))}
        for i, t in enumerate(request.prompt):
            if i not in image_positions:  # placeholders, not text the penalties should see
                self.sampler.accept(t)
        self.output = TextOutput(tokenizer, request.stop)

    def stop(self) -> None:
        self.handle, self.pending, self.draft, self.cells_left, self.last_used = None, None, [], 0, time.monotonic()

    @property
    def draft_room(self) -> int:
        """Draft tokens that fit its promise: fed after pending, each may become a generated token. With context
        shift the promise ends at share - 1 cells, so pending and draft never pass its share (a full slot
        shifts before it drafts, and drafts into the cells the shift gave back)."""
        return max(min(self.cells_left, self.max_new - len(self.generated)) - 1, 0)


class Scheduler:
    def __init__(self, model, n_slots: int, context_shift: bool = False):
        self.model = model
        self.n_slots = n_slots
        self.context_shift = context_shift
        self.slots = [Slot(i) for i in range(n_slots)]

    def busy(self) -> list[Slot]:
        return [s for s in self.slots if s.handle is not None]

    def idle(self) -> list[Slot]:
        return [s for s in self.slots if s.handle is None]

    def max_new(self, request) -> int:
        if request.max_tokens >= 0:
            return request.max_tokens
        if self.context_shift:
            return sys.maxsize  # until EOS
        return self.share(request) - len(request.prompt)

    def share(self, request) -> int:
        """The positions a request may hold: its slot's share of the context, at least its prompt and one more."""
        n_ctx = self.model.n_ctx
        return min(n_ctx, max(n_ctx // self.n_slots, len(request.prompt) + 1))

    def place(self, handle, idle: list[Slot]) -> bool:
        """Start the request in one of `idle` (all idle slots, or the one it is pinned to), from the longest
        cached prefix of its prompt unless it asks for none (cache_prompt), if the cells it may need are free
        (after giving up any idle slot's cache); False when it has to wait."""
        request, cells = handle.request, self.model.cells
        prompt, max_new = list(request.prompt), self.max_new(request)
        wanted = prompt_cells(prompt, request.images)
        sources = idle if self.context_shift else self.slots  # shifting slots share no cells
        prefix, best = max(((reusable_prefix(wanted, s.cached, request.images), s) for s in sources),
                           key=lambda p: (p[0], p[1].handle is None))
        reuse = min(prefix, len(prompt) - 1)  # the last prompt token gives logits
        reuse = reuse if request.cache_prompt else 0
        in_place = reuse > 0 and best in idle  # an idle slot holding the prefix serves it itself
        target = best if in_place else min(idle, key=lambda s: (bool(s.cached), s.last_used))
        outstanding = sum(s.cells_left for s in self.busy())
        evictable = sorted((s for s in self.idle() if s is not target and not (reuse and s is best) and s.cached),
                           key=lambda s: s.last_used)
        cap = self.share(request) - 1 if self.context_shift else sys.maxsize  # cells held at most
        while True:
            need = min(len(prompt) + max_new - 1, cap) - reuse
            freed = cells.exclusive(target.seq_id, reuse if in_place else 0)
            if cells.size - cells.used + freed - outstanding >= need:
                break
            if evictable:
                self.forget(evictable.pop(0))
            elif reuse and in_place:
                reuse = 0
            else:
                return False
        if in_place:
            self.model.seq_rm(target.seq_id, reuse, -1)
        else:
            self.model.seq_rm(target.seq_id)
            self.model.seq_cp(best.seq_id, target.seq_id, 0, reuse)
        target.start(handle, wanted[:reuse], max_new, need, self.share(request), self.model.tokenizer)
        return True

    def shift_full(self) -> None:
        """Shift every generating slot whose next token would take the last position of its share."""
        for slot in self.busy():
            if slot.pending is not None and len(slot.cached) + 1 >= slot.share:
                self.shift(slot)

    def shift(self, slot: Slot) -> None:
        """llama-server's context shift: keep n_keep tokens (and the BOS), drop half of the rest, move the later
        ones down; the freed cells may be written again."""
        request = slot.handle.request
        n_keep = len(request.prompt) if request.n_keep < 0 else request.n_keep
        n_keep = max(0, min(slot.share - 4, n_keep + int(self.model.tokenizer.add_bos)))
        n_left = len(slot.cached) - n_keep
        n_discard = max(0, min(n_left // 2, n_left - 1))
        self.model.seq_rm(slot.seq_id, n_keep, n_keep + n_discard)
        self.model.seq_add(slot.seq_id, n_keep + n_discard, len(slot.cached), -n_discard)
        del slot.cached[n_keep:n_keep + n_discard]
        slot.cells_left += n_discard
        slot.truncated = True

    def make_room(self, n: int) -> bool:
        """Give up idle slots' caches (least recently used first) until n cells are free beside those the running
        requests may still write; whether they are."""
        cells, outstanding = self.model.cells, sum(s.cells_left for s in self.busy())
        others = sorted((s for s in self.idle() if s.cached), key=lambda s: s.last_used)
        while cells.size - cells.used - outstanding < n and others:
            self.forget(others.pop(0))
        return cells.size - cells.used - outstanding >= n

    def forget(self, slot: Slot) -> None:
        self.model.seq_rm(slot.seq_id)
        slot.cached = []

    def next_batch(self) -> tuple[Batch, list[tuple[Slot, int, bool]], int]:
        """Every generating slot's pending token and draft (logits for each), then prompt chunks while n_batch
        allows; with the slots that get logits (how many rows each, whether it is generating: not a prompt's
        end) and the count of prompt tokens."""
        batch, outputs, n_prompt = Batch(), [], 0
        for slot in self.busy():
            if slot.pending is not None:
                for i, t in enumerate([slot.pending] + slot.draft):
                    batch.add(t, len(slot.cached) + i, slot.seq_id, True)
                outputs.append((slot, 1 + len(slot.draft), True))
        room = max(self.model.n_batch - len(batch), 0)
        for slot in self.busy():
            if slot.pending is None and room > 0:
                end = min([pos for pos, _ in slot.handle.request.images if pos >= slot.fed] + [len(slot.prompt)])
                chunk = slot.prompt[slot.fed:min(slot.fed + room, end)]  # up to the next image
                last = slot.fed + len(chunk) == len(slot.prompt)
                for i, t in enumerate(chunk):
                    batch.add(t, slot.fed + i, slot.seq_id, last and i == len(chunk) - 1)
                room -= len(chunk)
                n_prompt += len(chunk)
                if last:
                    outputs.append((slot, 1, False))
        return batch, outputs, n_prompt

    def image_batch(self, slot: Slot) -> Batch | None:
        """The embeddings batch of the image that starts at the slot's next prompt position, if one does."""
        request = slot.handle.request
        rows = next((rows for pos, rows in request.images if pos == slot.fed), None)
        if rows is None:
            return None
        batch = Batch.embeddings(rows, slot.fed, slot.seq_id)
        batch.causal = request.causal_images
        return batch

    def fed_image(self, slot: Slot) -> None:
        """The image that starts at the slot's next prompt position is in the cache (cells of its identity)."""
        rows = next(rows for pos, rows in slot.handle.request.images if pos == slot.fed)
        slot.cached += [cell_identity(rows)] * len(rows)
        slot.cells_left -= len(rows)
        slot.fed += len(rows)

    def fed(self, batch: Batch) -> None:
        """The batch is in the cache."""
        for t, ids in zip(batch.tokens, batch.seq_ids, strict=True):
            slot = self.slots[ids[0]]
            slot.cached.append(t)
            slot.cells_left -= 1
            if slot.pending is None:
                slot.fed += 1
        for slot in self.busy():
            slot.pending = None

    def roll_back(self, slot: Slot, keep: int) -> None:
        """Give back the cells of the slot's positions >= keep (draft tokens the target rejected)."""
        n = len(slot.cached) - keep
        if n > 0:
            self.model.seq_rm(slot.seq_id, keep, -1)
            del slot.cached[keep:]
            if slot.handle is not None:
                slot.cells_left += n
