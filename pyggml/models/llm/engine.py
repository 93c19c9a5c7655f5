"""Many requests served at once over one model: continuous batching with prefix reuse (llama-server's slot loop).

One background thread owns the model. Each step it admits waiting requests into free slots (a slot is a
sequence id of the unified KV cache), then decodes one batch holding every generating slot's next token and
chunks of the prompts being read (up to n_batch tokens in all), then samples each slot that got logits with
its own sampler (parameters and seed of its request), streams the token out, and stops a slot on EOS, a stop
string, its token limit or a cancel.

Split by concern as llama-server (queue and slots) and vLLM (scheduler, runner, output processor): the
scheduler (pyggml.models.llm.scheduler) admits requests from the longest cached prefix, promises their cells
up front and builds each batch; this module runs the steps and samples; each request's text comes from
its TextOutput (pyggml.models.llm.text_output). A request waits in the queue (first in, first out;
`stats().waiting_for_cells` says so) until the cache has room for all it may write, so no result is cut
short by another request. `max_tokens = -1` runs until EOS or the request's share of the context,
max(n_ctx / n_slots, prompt + 1) tokens in all (llama-server's per-slot context).

With a drafter (pyggml.models.llm.speculative) each generating slot also feeds a draft of the tokens after
its pending one in the same step, with logits for each; its tokens are sampled row by row against the draft
(Sampler.sample_against) while they agree, and the cells of the rejected rest are given back. Greedy output
is the same as without a drafter; sampled output is distributed as the target's.

Context shift (llama-server's --context-shift, `context_shift=True`): a request may generate past its share of
the context. When its sequence holds share - 1 tokens, the oldest half after its first n_keep tokens (the BOS
too) is dropped and the later ones move down (their cached keys are rotated to the new positions), and
generation goes on; `max_tokens = -1` then runs until EOS. The scheduler decides what a shift keeps and moves
(pyggml.models.llm.scheduler); the engine shifts the slots that are full at the start of a step, before
drafting, so a draft fits in what the shift freed.

Every sampled token is streamed as a Token event, the end-of-generation token too (its text is what was
still held back, usually ""); the texts of a request's Token events add up to its output text, stop string
excluded. A callback (logits_processor, on_token) that raises ends its request with Done("error").
"""

from __future__ import annotations

import asyncio
import contextlib
import concurrent.futures
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from numbers import Integral
from typing import AsyncIterator, Callable, Iterator, Sequence, TypeVar, Union

import numpy as np

from pyggml.errors import GGMLError, ParameterError
from pyggml.models.llm.cached_prefix import NO_IDENTITY, cell_identity
from pyggml.models.llm.generate import SamplingParams
from pyggml.models.llm.kv_cache import CellData
from pyggml.models.llm.scheduler import Scheduler, Slot

T = TypeVar("T")


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int = 16
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: Sequence[str] = ()
    ignore_eos: bool = False
    n_probs: int = 0
    logits_processor: Callable[[list[int], np.ndarray], None] | None = None
    on_token: Callable[[int], None] | None = None
    n_keep: int = 0                 # context shift: prompt tokens always kept (-1: all), besides the BOS
    # images: (prompt position, float32 [n, n_embd] embedding rows) in place of the placeholder tokens the prompt
    # holds there, decoded alone when the prompt reaches them (as llama-server decodes image chunks); their cells
    # are reused by a later prompt only where the rows carry an identity (Model.image_prompt's ImageRows) that the
    # cached ones share. causal_images False: their rows attend each other both ways (Gemma 3)
    images: Sequence = ()
    causal_images: bool = True
    slot: int | None = None         # run in this slot only (llama-server's id_slot); None: any
    cache_prompt: bool = True       # start from the longest cached prefix of the prompt


@dataclass
class Token:
    id: int
    text: str
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Done:
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    error: str | None = None
    draft_tokens: int = 0             # speculative decoding: draft tokens fed to the target
    draft_accepted: int = 0           # of which the target kept
    truncated: bool = False           # the context was shifted: the oldest tokens were dropped
    slot: int = -1                  # the slot it ran in (-1: none)


Event = Union[Token, Done]


@dataclass
class EngineStats:
    slots_busy: int = 0
    slots_total: int = 0
    queued: int = 0
    waiting_for_cells: bool = False   # the first queued request waits for KV cells (not for a slot)
    kv_cells_used: int = 0
    kv_cells_total: int = 0
    prompt_tokens: int = 0            # prompt tokens decoded (cached ones not counted)
    prompt_s: float = 0.0
    cached_tokens: int = 0            # prompt tokens reused from the cache
    gen_tokens: int = 0
    gen_s: float = 0.0
    requests_finished: int = 0
    draft_tokens: int = 0             # speculative decoding: draft tokens fed, and kept by the target
    draft_accepted: int = 0


class Handle:
    """A submitted request's stream of events: Token events, then exactly one Done."""

    def __init__(self, engine: Engine, request: Request):
        self.request = request
        self._engine = engine
        self._lock = threading.Lock()
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._async = None  # (loop, asyncio.Queue) once iterated asynchronously
        self.cancelled = False

    def _push(self, event: Event) -> None:
        with self._lock:
            if self._async is None:
                self._events.put(event)
                return
            loop, aqueue = self._async
        self._engine._post(loop, aqueue, event)

    def __iter__(self) -> Iterator[Event]:
        while True:
            event = self._events.get()
            yield event
            if isinstance(event, Done):
                return

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[Event]:
        aqueue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            while not self._events.empty():
                aqueue.put_nowait(self._events.get())
            self._async = (asyncio.get_running_loop(), aqueue)
        while True:
            event = await aqueue.get()
            yield event
            if isinstance(event, Done):
                return

    def cancel(self) -> None:
        """Stop the request: its cells are freed and its stream ends with Done("cancelled")."""
        self.cancelled = True
        self._engine._wake()


def _deliver_soon(loop, items: list) -> None:
    with contextlib.suppress(RuntimeError):  # the caller's event loop is closed: nobody listens any more
        loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list) -> None:
    for aqueue, event in items:
        aqueue.put_nowait(event)


def log_sum_exp(x: np.ndarray) -> float:
    """log(sum(exp(x))) of a logits row: with it a token's log-probability is one subtraction (a full
    log-softmax of a 262k vocabulary in float64 cost 2 ms a token, half a batched step's time at 8 slots)."""
    m = float(x.max())
    return m + float(np.log(np.exp(x - m, dtype=np.float32).sum(dtype=np.float64)))


def top_tokens(x: np.ndarray, n: int) -> np.ndarray:
    """The n largest entries' ids, largest first, ties by id (a stable sort's order) without sorting the vocabulary."""
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    if n >= x.size:
        return np.argsort(-x, kind="stable")
    cut = np.partition(x, x.size - n)[x.size - n]
    ids = np.flatnonzero(x >= cut)
    return ids[np.lexsort((ids, -x[ids]))][:n]


def _is_int(value) -> bool:
    """An integer that is not a bool (True is an Integral, and never a meant count)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


class Engine:
    """Owns `model` on a thread of its own and serves submitted requests in n_slots parallel sequences."""

    def __init__(self, model, n_slots: int = 4, drafter=None, context_shift: bool = False):
        if not _is_int(n_slots) or n_slots < 1:
            raise ParameterError(f"n_slots must be a positive integer, got {n_slots!r}")
        self.generates = model.kv is not None  # an encoder (an embedder, a reranker) only serves calls
        if self.generates:
            model.reset()
            if model.n_seq_max < n_slots:
                model.set_n_seq_max(n_slots)
        if context_shift and not model.arch.shiftable:
            raise ParameterError(f"context shift: {model.architecture} cannot move cached positions (its keys do "
                                 f"not carry their position as a RoPE rotation)")
        if drafter is not None and not self.generates:
            raise ParameterError(f"{model.architecture} is an embedding model: it generates nothing to draft for")
        self.model = model
        self.n_slots = n_slots
        self.context_shift = context_shift
        self.scheduler = Scheduler(model, n_slots, context_shift)
        self.slots = self.scheduler.slots
        self.drafter = drafter
        if drafter is not None:
            drafter.prepare(n_slots)
        self._queue: deque[Handle] = deque()
        self._calls: deque = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._stats = EngineStats(slots_total=n_slots, kv_cells_total=model.cells.size if self.generates else 0)
        self._outbox: dict = {}  # event loop -> [(asyncio.Queue, event)] of this step (engine thread only)
        self._thread = threading.Thread(target=self._loop, name="pyggml-engine", daemon=True)
        self._thread.start()

    # ----- callers' side (any thread) ------------------------------------------------------------------
    def submit(self, request: Request) -> Handle:
        self._check(request)
        handle = Handle(self, request)
        with self._cv:
            if self._closed:
                raise GGMLError("the engine is closed")
            self._queue.append(handle)
            self._cv.notify()
        return handle

    def call(self, fn: Callable[..., T]) -> concurrent.futures.Future:
        """Run fn(model) on the engine thread between steps."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._closed:
                raise GGMLError("the engine is closed")
            self._calls.append((fn, future))
            self._cv.notify()
        return future

    def slots_info(self) -> concurrent.futures.Future:
        """Each slot's (id, busy, cached tokens), read between steps."""
        return self.call(lambda _: [(s.seq_id, s.handle is not None, list(s.cached)) for s in self.slots])

    def save_slot(self, slot_id: int, path) -> concurrent.futures.Future:
        """Write an idle slot's cached tokens and their keys and values to `path`; the future gives the token count."""
        def save(model):
            slot = self._idle_slot(slot_id)
            positions, data = model.seq_read(slot.seq_id)
            # an image's identity is not saved: its restored cells match no prompt
            tokens = np.asarray([max(t, NO_IDENTITY) for t in slot.cached], dtype=np.int32)
            data.save(path, tokens=tokens, positions=positions)
            return len(slot.cached)
        return self.call(save)

    def restore_slot(self, slot_id: int, path) -> concurrent.futures.Future:
        """Load a saved slot into an idle slot (its cache replaced); the future gives the token count."""
        def restore(model):
            slot = self._idle_slot(slot_id)
            data, arrays = CellData.load(path)
            tokens, positions = arrays["tokens"].tolist(), arrays["positions"]
            if len(tokens) != data.n or not np.array_equal(positions, np.arange(len(tokens))):
                raise ParameterError(f"{path}: a saved slot holds positions 0..n-1 of its n tokens")
            self.scheduler.forget(slot)
            if not self.scheduler.make_room(len(tokens)):
                raise ParameterError(f"{len(tokens)} saved tokens do not fit the KV cells the running requests "
                                     f"leave free")
            model.seq_write(slot.seq_id, positions, data)
            slot.cached, slot.last_used = tokens, time.monotonic()
            return len(tokens)
        return self.call(restore)

    def erase_slot(self, slot_id: int) -> concurrent.futures.Future:
        """Forget an idle slot's cache; the future gives the count of tokens it held."""
        def erase(_):
            slot = self._idle_slot(slot_id)
            n = len(slot.cached)
            self.scheduler.forget(slot)
            return n
        return self.call(erase)

    def _idle_slot(self, slot_id: int) -> Slot:
        if not _is_int(slot_id) or not 0 <= slot_id < self.n_slots:
            raise ParameterError(f"slot id {slot_id!r} is outside [0, {self.n_slots})")
        slot = self.slots[slot_id]
        if slot.handle is not None:
            raise ParameterError(f"slot {slot_id} is busy")
        return slot

    def stats(self) -> EngineStats:
        with self._cv:
            return EngineStats(**vars(self._stats))

    def close(self) -> None:
        """Stop the loop; requests still queued or running end with Done("cancelled"); every cell is freed."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _post(self, loop, aqueue: asyncio.Queue, event: Event) -> None:
        """An event for an asynchronous listener: held until the step ends, then every event of the step goes
        to its event loop in one call (a wake-up of the loop per token per request made the loop thread
        and the engine thread trade the GIL eight times a step)."""
        if threading.current_thread() is not self._thread:
            _deliver_soon(loop, [(aqueue, event)])
        else:
            self._outbox.setdefault(loop, []).append((aqueue, event))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            _deliver_soon(loop, items)

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def _check(self, r: Request) -> None:
        """Refuse, before it is queued, a request the loop could not serve, naming the field that is wrong."""
        if not isinstance(r, Request):
            raise ParameterError(f"submit takes a Request, got {type(r).__name__}")
        if not self.generates:
            raise ParameterError(f"{self.model.architecture} is an embedding model: it generates no text")
        self._check_prompt(r)
        self._check_room(r)
        self._check_images(r)
        self._check_output_options(r)
        self._check_cache_options(r)

    def _check_prompt(self, r: Request) -> None:
        n_vocab = self.model.n_vocab
        if not isinstance(r.prompt, (list, tuple)) or not r.prompt:
            raise ParameterError("Request.prompt must be a non-empty list of token ids")
        if not all(_is_int(t) and 0 <= t < n_vocab for t in r.prompt):
            raise ParameterError(f"Request.prompt holds a token id outside [0, {n_vocab})")

    def _check_room(self, r: Request) -> None:
        """max_tokens, and the prompt and the tokens asked for within the context (any length under a context
        shift, which makes room as it goes)."""
        n_ctx = self.model.n_ctx
        if not _is_int(r.max_tokens) or r.max_tokens < -1:
            raise ParameterError(f"Request.max_tokens must be an integer >= 0, or -1; got {r.max_tokens!r}")
        if (len(r.prompt) + max(r.max_tokens, 0) > n_ctx and not self.context_shift) or len(r.prompt) >= n_ctx:
            raise ParameterError(f"Request: prompt ({len(r.prompt)} tokens) + max_tokens ({r.max_tokens}) is over "
                                 f"the context of {n_ctx}")

    def _check_images(self, r: Request) -> None:
        """Image rows replace prompt positions, so they must fit the model's width and leave the last token,
        whose logits start the answer; an identity they carry must not match a token's id."""
        for pos, rows in r.images:
            if not 0 <= pos < pos + len(rows) < len(r.prompt) or rows.shape[1:] != (self.model.arch.n_embd,):
                raise ParameterError(f"Request.images: rows [{len(rows)}, ...] at {pos} must be n_embd wide and lie "
                                     f"before the prompt's last token")
            if not _is_int(cell_identity(rows)) or cell_identity(rows) >= 0:
                raise ParameterError(f"Request.images: the rows at {pos} have the identity {rows.identity!r}; an "
                                     f"image's identity is a negative integer (token ids are not)")

    def _check_output_options(self, r: Request) -> None:
        """How tokens are chosen (sampling) and what comes back (stop strings, n_probs)."""
        n_vocab = self.model.n_vocab
        if not isinstance(r.sampling, SamplingParams):
            raise ParameterError("Request.sampling must be a SamplingParams")
        if isinstance(r.stop, str) or not all(isinstance(s, str) and s for s in r.stop):
            raise ParameterError("Request.stop must be a sequence of non-empty strings")
        if not _is_int(r.n_probs) or not 0 <= r.n_probs <= n_vocab:
            raise ParameterError(f"Request.n_probs must be an integer in [0, {n_vocab}], got {r.n_probs!r}")

    def _check_cache_options(self, r: Request) -> None:
        """What a context shift keeps (n_keep) and the slot whose cache the request asks for."""
        if not _is_int(r.n_keep) or r.n_keep < -1:
            raise ParameterError(f"Request.n_keep must be an integer >= 0, or -1; got {r.n_keep!r}")
        if r.slot is not None and (not _is_int(r.slot) or not 0 <= r.slot < self.n_slots):
            raise ParameterError(f"Request.slot must be None or in [0, {self.n_slots}), got {r.slot!r}")

    # ----- the engine thread ---------------------------------------------------------------------------
    def _busy(self) -> list[Slot]:
        return self.scheduler.busy()

    def _loop(self) -> None:
        """The engine thread: the calls posted to it, then one step of the requests, until the engine closes."""
        while (calls := self._wait_for_work()) is not None:
            self._run_calls(calls)
            self._run_step()
        self._shut_down()

    def _wait_for_work(self) -> list | None:
        """The calls posted since the last step, once there is anything to do; None once the engine is closed."""
        with self._cv:
            while not (self._closed or self._calls or self._queue or self._busy()):
                self._cv.wait()
            if self._closed:
                return None
            calls, self._calls = list(self._calls), deque()
        return calls

    def _run_calls(self, calls: list) -> None:
        """call()'s functions, run here because this thread owns the model; each result or error to its future."""
        for fn, future in calls:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(self.model))
                except BaseException as e:  # the caller gets it from the future
                    future.set_exception(e)

    def _run_step(self) -> None:
        """Admit what fits, decode one step, deliver its events. A bug or a failing callback ends the requests
        in flight, not the engine."""
        try:
            self._drop_cancelled()
            self._admit()
            self._update_stats()
            if self._busy():
                self._step()
        except Exception as e:
            for slot in self._busy():
                self._finish(slot, "error", f"{type(e).__name__}: {e}")
        self._flush()
        self._update_stats()

    def _shut_down(self) -> None:
        """Every request still waiting or running ends with Done("cancelled"), every call not run is cancelled."""
        with self._cv:
            waiting, self._queue = list(self._queue), deque()
            calls, self._calls = list(self._calls), deque()
        for handle in waiting:
            handle._push(Done("cancelled", len(handle.request.prompt), 0, 0))
        for slot in self._busy():
            self._finish(slot, "cancelled")
        for _, future in calls:
            future.cancel()
        self._flush()
        if self.generates:
            self.model.reset()  # the kept prefixes too: a closed engine leaves no cell in use

    def _update_stats(self) -> None:
        with self._cv:
            self._stats.slots_busy = len(self._busy())
            self._stats.queued = len(self._queue)
            self._stats.kv_cells_used = self.model.cells.used if self.generates else 0

    def _drop_cancelled(self) -> None:
        with self._cv:
            gone = [h for h in self._queue if h.cancelled]
            for h in gone:
                self._queue.remove(h)
        for h in gone:
            h._push(Done("cancelled", len(h.request.prompt), 0, 0))
        for slot in self._busy():
            if slot.handle.cancelled:
                self._finish(slot, "cancelled")

    def _admit(self) -> None:
        """Give waiting requests free slots while the cache has room for them (first in, first out)."""
        while True:
            with self._cv:
                if not self._queue:
                    self._stats.waiting_for_cells = False
                    return
                handle = self._queue[0]
            pinned = handle.request.slot
            idle = [s for s in self.scheduler.idle() if pinned in (None, s.seq_id)]
            placed = bool(idle) and self._start(handle, idle)
            with self._cv:
                self._stats.waiting_for_cells = bool(idle) and not placed  # a free slot, but not the cells
            if not placed:
                return
            with self._cv:
                self._queue.popleft()

    def _start(self, handle: Handle, idle: list[Slot]) -> bool:
        if self.scheduler.max_new(handle.request) == 0:
            handle._push(Done("length", len(handle.request.prompt), 0, 0))
            return True
        return self.scheduler.place(handle, idle)

    def _draft(self) -> None:
        """Each generating slot's guess of the tokens after its pending one (speculative decoding). The drafts
        and pending tokens of a step stay within the backend's tokens_as_alone, so that each row's logits are
        those the token gets decoded alone and greedy output is plain decoding's (on the CPU, 17 tokens of
        llama.cpp's default 16-token draft went to sgemm, whose sums differ by float32 rounding: a random 1B
        model's greedy text parted from plain decoding's at a 0.05 logit tie)."""
        generating = [slot for slot in self.scheduler.busy() if slot.pending is not None]
        limit = self.model.backend.tokens_as_alone
        budget = float("inf") if limit is None else limit - len(generating)
        for slot in generating:
            room = int(min(self.drafter.params.n_max, slot.draft_room, budget))
            room = 0 if slot.handle.request.images else room  # image cells hold no tokens for a drafter to read
            if room > 0:
                slot.draft = self.drafter.draft(slot.seq_id, slot.cached + [slot.pending], room)
                slot.n_drafted += len(slot.draft)
                budget -= len(slot.draft)

    def _step(self) -> None:
        """One decode: every generating slot's pending token and draft, then prompt chunks while n_batch
        allows; then each slot's tokens from its logits rows. A full slot shifts first (context shift), so its
        draft has the room the shift freed."""
        if self.context_shift:
            self.scheduler.shift_full()
        start = time.perf_counter()
        if self.drafter is not None:
            self._draft()
        draft_s = time.perf_counter() - start
        self._feed_images()
        batch, outputs, n_prompt = self.scheduler.next_batch()
        if not len(batch):
            return
        start = time.perf_counter()
        try:
            logits = self.model.decode_batch(batch)
        except Exception as e:  # a failed step fails the requests in it, never the engine
            for slot in {id(s): s for s in self._busy() if s.seq_id in {ids[0] for ids in batch.seq_ids}}.values():
                slot.draft = []
                self._finish(slot, "error", f"{type(e).__name__}: {e}")
            return
        seconds = time.perf_counter() - start
        self.scheduler.fed(batch)
        row, n_gen = 0, 0
        for slot, n_rows, generating in outputs:
            n = self._tokens_from(slot, logits[row:row + n_rows])
            n_gen += n if generating else 0
            row += n_rows
        with self._cv:
            st, n = self._stats, len(batch)
            st.prompt_tokens += n_prompt
            st.prompt_s += seconds * n_prompt / n
            st.gen_tokens += n_gen
            st.gen_s += seconds * (n - n_prompt) / n + draft_s

    def _feed_images(self) -> None:
        """Decode, alone, each image that starts at a prompt's next position (as llama-server decodes image
        chunks); a failed one fails its request, never the engine."""
        for slot in self._busy():
            while slot.pending is None and (batch := self.scheduler.image_batch(slot)) is not None:
                try:
                    self.model.decode_batch(batch)
                except Exception as e:
                    self._finish(slot, "error", f"{type(e).__name__}: {e}")
                    break
                self.scheduler.fed_image(slot)

    def _tokens_from(self, slot: Slot, rows: np.ndarray) -> int:
        """Sample the slot's tokens from its rows: one per row while the draft fed after its pending token
        agrees, then give back the cells of the rejected draft; how many tokens it got."""
        draft, slot.draft = slot.draft, []
        base = len(slot.cached) - len(rows)  # the position of the pending token fed
        n = 0
        for i, row in enumerate(rows if slot.handle is not None else ()):
            guess = draft[i] if i < len(draft) else None
            try:
                token = self._sample(slot, row, guess)
            except Exception as e:  # the request's own callbacks
                self._finish(slot, "error", f"{type(e).__name__}: {e}")
                break
            n += 1
            slot.n_accepted += token == guess
            with self._cv:
                self._stats.draft_accepted += token == guess
            if slot.handle is None or token != guess:
                break
        if draft:
            with self._cv:
                self._stats.draft_tokens += len(draft)
            self.scheduler.roll_back(slot, base + max(n, 1))
        return n

    def _sample(self, slot: Slot, row_raw: np.ndarray, guess: int | None = None) -> int:
        """Sample the slot's next token from its logits row (left as it is: log-probabilities are the raw
        softmax), against the draft's guess for this position if there is one; stream it out."""
        request, tokenizer = slot.handle.request, self.model.tokenizer
        norm, row = log_sum_exp(row_raw), row_raw.copy()
        if request.ignore_eos:
            row[[t for t in tokenizer.eog_ids if t < row.size]] = -np.inf
        if request.logits_processor is not None:
            request.logits_processor(list(slot.generated), row)
        token = slot.sampler.sample(row) if guess is None else slot.sampler.sample_against(row, guess)
        slot.sampler.accept(token)
        if request.on_token is not None:
            request.on_token(token)
        top = [(int(t), float(row_raw[t]) - norm) for t in top_tokens(row_raw, request.n_probs)]
        eos = tokenizer.is_eog(token) and not request.ignore_eos
        if not eos:
            slot.generated.append(token)
        text = slot.output.add([] if eos else [token], final=eos or len(slot.generated) == slot.max_new)
        slot.handle._push(Token(token, text, float(row_raw[token]) - norm, top))
        if eos:
            slot.generated.append(token)
            self._finish(slot, "stop")
        elif slot.output.stopped:
            self._finish(slot, "stop")
        elif len(slot.generated) == slot.max_new:
            self._finish(slot, "length")
        else:
            slot.pending = token
        return token

    def _finish(self, slot: Slot, reason: str, error: str | None = None) -> None:
        handle = slot.handle
        completion = len(slot.generated)
        if reason in ("cancelled", "error") or slot.truncated:  # a shifted cache is no prompt's prefix any more
            self.scheduler.forget(slot)
        slot.stop()
        with self._cv:
            self._stats.requests_finished += 1
            self._stats.cached_tokens += slot.n_cached
        handle._push(Done(reason, len(handle.request.prompt), slot.n_cached, completion, error, slot.n_drafted,
                          slot.n_accepted, slot.truncated,
                          slot.seq_id))
