"""Many requests served at once over one model: continuous batching with prefix reuse (llama-server's slot loop).

One background thread owns the model. Each step it admits waiting requests into free slots (a slot is a
sequence id of the unified KV cache), then decodes one batch holding every generating slot's next token and
chunks of the prompts being read (up to n_batch tokens in all), then samples each slot that got logits with
its own sampler (parameters and seed of its request), streams the token out, and stops a slot on EOS, a stop
string, its token limit or a cancel.

Prefix reuse (llama-server's cache_prompt): a finished slot keeps its cells; a new request starts from the
longest prefix of its prompt held by any slot, busy or idle (an idle slot's own cells are reused in place,
another's are shared with seq_cp), and reads only the rest. Idle slots' cells are given up (least recently
used first) when a request needs room.

Cells are promised up front: a request is admitted only when the cache has room for the rest of its prompt
and for every token it may still generate, counting what the running requests may still write; otherwise it
waits in the queue (first in, first out; `stats().waiting_for_cells` says so). So a running request never
finds the cache full, and no result is cut short by another request. `max_tokens = -1` runs until EOS or
the request's share of the context, max(n_ctx / n_slots, prompt + 1) tokens in all (llama-server's
per-slot context).

Every sampled token is streamed as a Token event, the end-of-generation token too (its text is what was
still held back, usually ""); the texts of a request's Token events add up to its output text, stop string
excluded. A callback (logits_processor, on_token) that raises ends its request with Done("error").
"""

from __future__ import annotations

import asyncio
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
from pyggml.models.llm.batch import Batch
from pyggml.models.llm.generate import Sampler, SamplingParams
from pyggml.models.llm.kv_cache import CellData

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


@dataclass
class Slot:
    seq_id: int
    cached: list[int] = field(default_factory=list)  # the tokens in this sequence's cells, positions 0, 1, ...
    handle: Handle | None = None
    last_used: float = 0.0
    # the running request's state
    fed: int = 0                    # prompt tokens in the cache
    n_cached: int = 0               # of which reused
    max_new: int = 0
    cells_left: int = 0             # cells it may still write
    generated: list[int] = field(default_factory=list)
    pending: int | None = None      # the last sampled token, fed with the next step
    sampler: Sampler | None = None
    sent: int = 0                   # characters of the generated text streamed

    @property
    def prompt(self) -> list[int]:
        return self.handle.request.prompt


def _deliver_soon(loop, items: list) -> None:
    try:
        loop.call_soon_threadsafe(_deliver, items)
    except RuntimeError:  # the caller's event loop is closed: nobody listens any more
        pass


def _deliver(items: list) -> None:
    for aqueue, event in items:
        aqueue.put_nowait(event)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


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


class Engine:
    """Owns `model` on a thread of its own and serves submitted requests in n_slots parallel sequences."""

    def __init__(self, model, n_slots: int = 4):
        if isinstance(n_slots, bool) or not isinstance(n_slots, Integral) or n_slots < 1:
            raise ParameterError(f"n_slots must be a positive integer, got {n_slots!r}")
        model.reset()
        if model.n_seq_max < n_slots:
            model.set_n_seq_max(n_slots)
        self.model = model
        self.n_slots = n_slots
        self.slots = [Slot(i) for i in range(n_slots)]
        self._queue: deque[Handle] = deque()
        self._calls: deque = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._stats = EngineStats(slots_total=n_slots, kv_cells_total=model.cells.size)
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
            data.save(path, tokens=np.asarray(slot.cached, dtype=np.int32), positions=positions)
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
            self._forget(slot)
            outstanding = sum(s.cells_left for s in self._busy())
            others = sorted((s for s in self.slots if s.handle is None and s.cached), key=lambda s: s.last_used)
            while model.cells.size - model.cells.used - outstanding < len(tokens) and others:
                self._forget(others.pop(0))  # idle slots' caches give way, least recently used first
            if model.cells.size - model.cells.used - outstanding < len(tokens):
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
            self._forget(slot)
            return n
        return self.call(erase)

    def _idle_slot(self, slot_id: int) -> Slot:
        if isinstance(slot_id, bool) or not isinstance(slot_id, Integral) or not 0 <= slot_id < self.n_slots:
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
        if not isinstance(r, Request):
            raise ParameterError(f"submit takes a Request, got {type(r).__name__}")
        n_vocab, n_ctx = self.model.n_vocab, self.model.n_ctx
        if not isinstance(r.prompt, (list, tuple)) or not r.prompt:
            raise ParameterError("Request.prompt must be a non-empty list of token ids")
        if not all(isinstance(t, Integral) and not isinstance(t, bool) and 0 <= t < n_vocab for t in r.prompt):
            raise ParameterError(f"Request.prompt holds a token id outside [0, {n_vocab})")
        if isinstance(r.max_tokens, bool) or not isinstance(r.max_tokens, Integral) or r.max_tokens < -1:
            raise ParameterError(f"Request.max_tokens must be an integer >= 0, or -1; got {r.max_tokens!r}")
        if len(r.prompt) + max(r.max_tokens, 0) > n_ctx or len(r.prompt) >= n_ctx:
            raise ParameterError(f"Request: prompt ({len(r.prompt)} tokens) + max_tokens ({r.max_tokens}) is over "
                                 f"the context of {n_ctx}")
        if not isinstance(r.sampling, SamplingParams):
            raise ParameterError("Request.sampling must be a SamplingParams")
        if isinstance(r.stop, str) or not all(isinstance(s, str) and s for s in r.stop):
            raise ParameterError("Request.stop must be a sequence of non-empty strings")
        if isinstance(r.n_probs, bool) or not isinstance(r.n_probs, Integral) or not 0 <= r.n_probs <= n_vocab:
            raise ParameterError(f"Request.n_probs must be an integer in [0, {n_vocab}], got {r.n_probs!r}")
        if r.slot is not None and (isinstance(r.slot, bool) or not isinstance(r.slot, Integral)
                                   or not 0 <= r.slot < self.n_slots):
            raise ParameterError(f"Request.slot must be None or in [0, {self.n_slots}), got {r.slot!r}")

    # ----- the engine thread ---------------------------------------------------------------------------
    def _busy(self) -> list[Slot]:
        return [s for s in self.slots if s.handle is not None]

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._closed or self._calls or self._queue or self._busy()):
                    self._cv.wait()
                if self._closed:
                    break
                calls, self._calls = list(self._calls), deque()
            for fn, future in calls:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(self.model))
                    except BaseException as e:  # the caller gets it from the future
                        future.set_exception(e)
            try:
                self._drop_cancelled()
                self._admit()
                self._update_stats()
                if self._busy():
                    self._step()
            except Exception as e:  # a bug or a failing callback ends the requests in flight, not the engine
                for slot in self._busy():
                    self._finish(slot, "error", f"{type(e).__name__}: {e}")
            self._flush()
            self._update_stats()
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
        self.model.reset()  # the kept prefixes too: a closed engine leaves no cell in use

    def _update_stats(self) -> None:
        with self._cv:
            self._stats.slots_busy = len(self._busy())
            self._stats.queued = len(self._queue)
            self._stats.kv_cells_used = self.model.cells.used

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
            idle = [s for s in self.slots if s.handle is None and pinned in (None, s.seq_id)]
            placed = bool(idle) and self._place(handle, idle)
            with self._cv:
                self._stats.waiting_for_cells = bool(idle) and not placed  # a free slot, but not the cells
            if not placed:
                return
            with self._cv:
                self._queue.popleft()

    def _max_new(self, request: Request) -> int:
        if request.max_tokens >= 0:
            return request.max_tokens
        n_ctx = self.model.n_ctx
        return min(n_ctx, max(n_ctx // self.n_slots, len(request.prompt) + 1)) - len(request.prompt)

    def _place(self, handle: Handle, idle: list[Slot]) -> bool:
        """Start the request in a slot, from the longest cached prefix of its prompt, if the cells it may
        need are free (after giving up idle slots' caches); False when it has to wait."""
        request, cells = handle.request, self.model.cells
        prompt, max_new = list(request.prompt), self._max_new(request)
        if max_new == 0:
            handle._push(Done("length", len(prompt), 0, 0))
            return True
        best = max(self.slots, key=lambda s: (common_prefix(prompt, s.cached), s.handle is None))
        reuse = min(common_prefix(prompt, best.cached), len(prompt) - 1)  # the last prompt token gives logits
        reuse = reuse if request.cache_prompt else 0
        in_place = reuse > 0 and best in idle  # an idle slot holding the prefix serves it itself
        target = best if in_place else min(idle, key=lambda s: (bool(s.cached), s.last_used))
        outstanding = sum(s.cells_left for s in self._busy())
        evictable = sorted((s for s in self.slots if s.handle is None and s is not target
                            and not (reuse and s is best) and s.cached), key=lambda s: s.last_used)
        while True:
            need = len(prompt) - reuse + max_new - 1
            freed = self._exclusive_cells(target.seq_id, reuse if in_place else 0)
            if cells.size - cells.used + freed - outstanding >= need:
                break
            if evictable:
                self._forget(evictable.pop(0))
            elif reuse and in_place:
                reuse = 0
            else:
                return False
        if in_place:
            self.model.seq_rm(target.seq_id, reuse, -1)
        else:
            self.model.seq_rm(target.seq_id)
            self.model.seq_cp(best.seq_id, target.seq_id, 0, reuse)
        target.cached = prompt[:reuse]
        target.handle, target.fed, target.n_cached, target.max_new = handle, reuse, reuse, max_new
        target.cells_left, target.generated, target.pending, target.sent = need, [], None, 0
        target.sampler = Sampler(request.sampling)
        for t in prompt:
            target.sampler.accept(t)
        return True

    def _exclusive_cells(self, seq_id: int, p0: int) -> int:
        """Cells that removing seq_id's positions >= p0 would free (no other sequence uses them)."""
        cells = self.model.cells
        mine = cells.seq[:, seq_id] & (cells.pos >= p0)
        return int((mine & (cells.seq.sum(axis=1) == 1)).sum())

    def _forget(self, slot: Slot) -> None:
        self.model.seq_rm(slot.seq_id)
        slot.cached = []

    def _step(self) -> None:
        """One decode: every generating slot's pending token, then prompt chunks while n_batch allows."""
        batch, outputs, n_prompt = Batch(), [], 0
        for slot in self._busy():
            if slot.pending is not None:
                batch.add(slot.pending, len(slot.cached), slot.seq_id, True)
                outputs.append(slot)
        room = max(self.model.n_batch - len(batch), 0)
        for slot in self._busy():
            if slot.pending is None and room > 0:
                chunk = slot.prompt[slot.fed:slot.fed + room]
                last = slot.fed + len(chunk) == len(slot.prompt)
                for i, t in enumerate(chunk):
                    batch.add(t, slot.fed + i, slot.seq_id, last and i == len(chunk) - 1)
                room -= len(chunk)
                n_prompt += len(chunk)
                if last:
                    outputs.append(slot)
        if not len(batch):
            return
        start = time.perf_counter()
        try:
            logits = self.model.decode_batch(batch)
        except Exception as e:  # a failed step fails the requests in it, never the engine
            for slot in {id(s): s for s in self._busy() if s.seq_id in {ids[0] for ids in batch.seq_ids}}.values():
                self._finish(slot, "error", f"{type(e).__name__}: {e}")
            return
        seconds = time.perf_counter() - start
        for t, ids in zip(batch.tokens, batch.seq_ids):
            slot = self.slots[ids[0]]
            slot.cached.append(t)
            slot.cells_left -= 1
            if slot.pending is None:
                slot.fed += 1
        for slot in self._busy():
            slot.pending = None
        with self._cv:
            st, n = self._stats, len(batch)
            st.prompt_tokens += n_prompt
            st.prompt_s += seconds * n_prompt / n
            st.gen_tokens += n - n_prompt
            st.gen_s += seconds * (n - n_prompt) / n
        for slot, row in zip(outputs, logits):
            if slot.handle is not None:
                try:
                    self._sample(slot, row)
                except Exception as e:  # the request's own callbacks
                    self._finish(slot, "error", f"{type(e).__name__}: {e}")

    def _sample(self, slot: Slot, row_raw: np.ndarray) -> None:
        """Sample the slot's next token from its logits row (left as it is: log-probabilities are the raw softmax)."""
        request, tokenizer = slot.handle.request, self.model.tokenizer
        norm, row = log_sum_exp(row_raw), row_raw.copy()
        if request.ignore_eos:
            row[[t for t in tokenizer.eog_ids if t < row.size]] = -np.inf
        if request.logits_processor is not None:
            request.logits_processor(list(slot.generated), row)
        token = slot.sampler.sample(row)
        slot.sampler.accept(token)
        if request.on_token is not None:
            request.on_token(token)
        top = [(int(t), float(row_raw[t]) - norm) for t in top_tokens(row_raw, request.n_probs)]
        eos = tokenizer.is_eog(token) and not request.ignore_eos
        if not eos:
            slot.generated.append(token)
        text, stopped = self._new_text(slot, final=eos or len(slot.generated) == slot.max_new)
        slot.handle._push(Token(token, text, float(row_raw[token]) - norm, top))
        if eos:
            slot.generated.append(token)
            self._finish(slot, "stop")
        elif stopped:
            self._finish(slot, "stop")
        elif len(slot.generated) == slot.max_new:
            self._finish(slot, "length")
        else:
            slot.pending = token

    def _new_text(self, slot: Slot, final: bool) -> tuple[str, bool]:
        """The text this token adds, and whether a stop string ended it. Text that may begin a stop string,
        and the bytes of an incomplete UTF-8 character, wait for the next token (unless final)."""
        full = self.model.detokenize(slot.generated)
        stops = slot.handle.request.stop
        hits = [i for i in (full.find(s, max(slot.sent - len(s), 0)) for s in stops) if i >= 0]
        if hits:
            end, stopped = min(hits), True
        elif final:
            end, stopped = len(full), False
        else:
            held = max((k for s in stops for k in range(1, len(s)) if full.endswith(s[:k])), default=0)
            end, stopped = len(full.rstrip("\ufffd")) - held, False
        text = full[slot.sent:end] if end > slot.sent else ""
        slot.sent = max(slot.sent, end)
        return text, stopped

    def _finish(self, slot: Slot, reason: str, error: str | None = None) -> None:
        handle = slot.handle
        completion = len(slot.generated)
        if reason in ("cancelled", "error"):
            self._forget(slot)
        slot.handle, slot.pending, slot.cells_left, slot.last_used = None, None, 0, time.monotonic()
        with self._cv:
            self._stats.requests_finished += 1
            self._stats.cached_tokens += slot.n_cached
        handle._push(Done(reason, len(handle.request.prompt), slot.n_cached, completion, error, slot.seq_id))
