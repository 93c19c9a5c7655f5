"""What a running server holds: the language model and its engine, the Whisper models, the limits, and the
count of every request accepted and how it ended (so a load test can account for each one)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pyggml.serve.protocol import APIError

WHISPER_DEFAULT_ALIAS = "whisper-1"  # OpenAI's model name: the default Whisper model here


@dataclass
class Limits:
    parallel: int = 4               # engine slots
    max_queue: int = 64             # requests waiting beyond the busy slots before 429
    timeout_s: float = 600.0        # per request
    retry_after_s: int = 1
    refusal_delay_s: float = 0.1    # a 429 is sent this late: clients that re-send at once are slowed, at no cost
    model_any: bool = True          # any `model` name is the loaded model (llama-server); False: OpenAI's 404
    slot_save_path: str | None = None  # where /slots/{id}?action=save|restore keeps slot files (None: off)


@dataclass
class Loaded:
    """What the loader produced (the loader runs in a thread at start-up; /health is 503 until it is done)."""

    model: object = None            # pyggml.models.Model
    engine: object = None           # pyggml.models.llm.engine.Engine
    model_id: str = ""
    whisper: dict = field(default_factory=dict)   # name -> Whisper
    whisper_default: str | None = None


class ServerState:
    """Shared by the routes; the in-flight counter and the outcome counter are touched only on the event loop."""

    def __init__(self, load: Callable[[], Loaded], limits: Limits | None = None):
        self._load, self.limits = load, limits or Limits()
        self.loaded: Loaded | None = None
        self.load_error: str | None = None
        self.in_flight = 0
        self.outcomes: Counter = Counter()   # accepted, and each end: stop, length, cancelled, error, ...
        self.constraints = None              # ConstraintFactory, made when the model is there
        self.whisper_lock = threading.Lock()  # one transcription at a time per process (the model is not shared)
        self._thread: threading.Thread | None = None

    # ----- loading --------------------------------------------------------------------------------
    def start_loading(self) -> None:
        self._thread = threading.Thread(target=self._load_now, name="pyggml-serve-load", daemon=True)
        self._thread.start()

    def load(self) -> None:
        """Load now, on this thread; what fails is raised (`pyggml serve` loads so, before it binds the port)."""
        from pyggml.serve.constraints import ConstraintFactory

        loaded = self._load()
        if loaded.model is not None:
            self.constraints = ConstraintFactory(loaded.model.tokenizer, loaded.model.n_vocab)
        self.loaded = loaded

    def _load_now(self) -> None:
        try:
            self.load()
        except Exception as e:  # reported by /health and every request, the process stays up to say so
            self.load_error = f"{type(e).__name__}: {e}"

    def wait_loaded(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.loaded is not None

    def close(self) -> None:
        if self.loaded is not None and self.loaded.engine is not None:
            self.loaded.engine.close()

    @property
    def ready(self) -> bool:
        return self.loaded is not None

    def require(self, what: str = "model") -> Loaded:
        if self.load_error is not None:
            raise APIError(f"the model failed to load: {self.load_error}", status=500, kind="server_error")
        if self.loaded is None:
            raise APIError("Loading model", status=503, kind="unavailable_error")
        if what == "model" and self.loaded.engine is None:
            raise APIError("this server has no language model loaded", param="model")
        return self.loaded

    def check_model_name(self, name: str | None) -> None:
        """A request's `model` may be left out or name the loaded model (its id or file name); any other name
        is that model too unless the server was started to tell (then 404 model_not_found, as OpenAI)."""
        loaded = self.require()
        known = (loaded.model_id, Path(loaded.model_id).name, Path(loaded.model_id).stem)
        if name is not None and name not in known and not self.limits.model_any:
            raise APIError(f"The model '{name}' does not exist; this server serves '{loaded.model_id}'",
                           status=404, param="model", code="model_not_found")

    def whisper_model(self, name: str | None):
        loaded = self.require("whisper")
        if not loaded.whisper:
            raise APIError("this server has no Whisper model loaded (pyggml serve --whisper-model NAME)",
                           param="model")
        if name in (None, "", WHISPER_DEFAULT_ALIAS):
            name = loaded.whisper_default
        if name not in loaded.whisper:
            raise APIError(f"Whisper model '{name}' is not loaded; loaded: {', '.join(loaded.whisper)} "
                           f"('{WHISPER_DEFAULT_ALIAS}' means {loaded.whisper_default})", param="model")
        return loaded.whisper[name]

    # ----- admission ------------------------------------------------------------------------------
    def check_room(self, sequences: int = 1) -> None:
        """Refuse with 429 when the slots and the queue are full: called first, before a template is rendered or
        a prompt tokenized, so a client retrying at once costs the server next to nothing."""
        capacity = self.limits.parallel + self.limits.max_queue
        if sequences > capacity:
            raise APIError(f"the request needs {sequences} sequences; this server takes at most {capacity} at once",
                           param="n")
        if self.in_flight + sequences > capacity:
            self.outcomes["rejected"] += 1
            raise APIError(f"the server is busy ({self.in_flight} sequences in flight, capacity {capacity}); retry "
                           f"later", status=429, kind="rate_limit_error",
                           headers={"Retry-After": str(self.limits.retry_after_s)})

    def admit(self, sequences: int = 1) -> None:
        """Count a request in, or refuse it with 429 when the slots and the queue are full."""
        self.check_room(sequences)
        self.in_flight += sequences
        self.outcomes["accepted"] += 1

    def release(self, sequences: int, outcome: str) -> None:
        self.in_flight -= sequences
        self.outcomes[outcome] += 1


async def run_blocking(fn, *args):
    """A blocking call (tokenizing a long prompt, a transcription) off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
