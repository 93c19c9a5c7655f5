"""Streams: what makes the torch backend's copies and computes asynchronous, and its events work.

A stream runs submitted functions in submission order, away from the caller. `synchronize`
waits for all of them, then runs the finishers registered with `after_synchronize` (e.g. the
copy of a staged read into the caller's memory) and re-raises the first error a function
raised: an error is never lost, and the work queued after it is skipped until it is reported.
Markers are ggml's events: `record` puts one in the stream, `wait` makes the stream wait for
one (it may belong to another stream), `marker.synchronize()` makes the host wait for it.

- WorkerStream (TORCH_CPU): a queue run by a worker thread; markers are threading.Events.
  This is what lets CI exercise every async and event path without a GPU.
- CudaStream (CUDAn): a torch.cuda.Stream; a function runs at once on the host and only
  enqueues CUDA work; markers are torch.cuda.Events.

Both share the bookkeeping in `Stream`, so the CUDA-only code is the four methods of CudaStream.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

import torch


class HostMarker:
    """An event of a worker stream. As with a CUDA event, a wait refers to the latest record made
    *before the wait was called*: recording again later does not move an earlier wait's target.
    A marker never recorded counts as reached (as a fresh CUDA event does).
    """

    def __init__(self):
        self._changed = threading.Condition()
        self._recorded = 0  # records made (host side)
        self._reached = 0   # the latest record the stream has passed

    def arm(self) -> int:
        """A new record; returns its number, for `reach`."""
        with self._changed:
            self._recorded += 1
            return self._recorded

    def reach(self, record: int) -> None:
        with self._changed:
            self._reached = max(self._reached, record)
            self._changed.notify_all()

    def waiter(self) -> Callable[[], None]:
        """A function that waits for the records made so far (and no later ones)."""
        with self._changed:
            target = self._recorded
        return lambda: self._wait_for(target)

    def _wait_for(self, record: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._reached >= record)

    def query(self) -> bool:
        with self._changed:
            return self._reached >= self._recorded

    def synchronize(self) -> None:
        self.waiter()()


class Stream:
    """Ordered asynchronous work, with errors kept until synchronize (see the module docstring)."""

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._finishers: list[Callable[[], None]] = []

    # ----- what a stream kind provides ------------------------------------------------------
    def submit(self, fn: Callable[[], None], always: bool = False) -> None:
        """Queue fn; `always` runs it even after an earlier error (markers must be reached, or waiters hang)."""
        raise NotImplementedError

    def new_marker(self):
        raise NotImplementedError

    def record(self, marker) -> None:
        raise NotImplementedError

    def wait(self, marker) -> None:
        """Work submitted from now on starts only after `marker` is reached."""
        raise NotImplementedError

    def _drain(self) -> None:
        """Block until everything submitted so far has run."""
        raise NotImplementedError

    def close(self) -> None:
        """Finish the queued work (errors are dropped: nobody is left to report them to)."""
        self._drain()

    def release(self) -> None:
        """Let the stream end once its queued work is done, without waiting (safe from a finalizer)."""

    # ----- shared bookkeeping -------------------------------------------------------------------
    def after_synchronize(self, fn: Callable[[], None]) -> None:
        """Run fn on the host at the next successful synchronize (staged reads land in the caller's memory)."""
        with self._lock:
            self._finishers.append(fn)

    def synchronize(self) -> None:
        self._drain()
        with self._lock:
            error, self._error = self._error, None
            finishers, self._finishers = self._finishers, []
        if error is not None:
            raise error
        for fn in finishers:
            fn()

    def _run(self, fn: Callable[[], None], always: bool) -> None:
        if self._error is not None and not always:
            return
        try:
            fn()
        except BaseException as e:  # kept for synchronize, which re-raises it on the caller's thread
            with self._lock:
                if self._error is None:
                    self._error = e


class WorkerStream(Stream):
    """A queue run by a daemon worker thread until the stream closes."""

    def __init__(self, name: str):
        super().__init__(name)
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=f"pyggml-{name}-stream", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def submit(self, fn: Callable[[], None], always: bool = False) -> None:
        self._queue.put((fn, always))

    def _loop(self) -> None:
        while True:
            fn, always = self._queue.get()
            try:
                if fn is None:
                    return
                self._run(fn, always)
            finally:
                fn = None  # release the task's tensors here and now: torch memory freed by this thread while
                #            the interpreter exits aborts the process (a thread can't take the GIL back then)
                self._queue.task_done()

    def _drain(self) -> None:
        self._queue.join()

    def new_marker(self) -> HostMarker:
        return HostMarker()

    def record(self, marker) -> None:
        if not isinstance(marker, HostMarker):
            raise TypeError(f"stream {self.name}: cannot record a {type(marker).__name__} on a worker stream")
        record = marker.arm()
        self.submit(lambda: marker.reach(record), always=True)

    def wait(self, marker) -> None:
        self.submit(marker.waiter() if isinstance(marker, HostMarker) else marker.synchronize, always=True)

    def release(self) -> None:
        self._queue.put((None, True))

    def close(self) -> None:
        self.release()
        self._thread.join()


class CudaStream(Stream):
    """A CUDA stream of one device; functions run on the calling thread and enqueue their kernels there."""

    def __init__(self, name: str, device: torch.device):
        super().__init__(name)
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def submit(self, fn: Callable[[], None], always: bool = False) -> None:
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            self._run(fn, always)

    def _drain(self) -> None:
        self.stream.synchronize()

    def new_marker(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def record(self, marker) -> None:
        marker.record(self.stream)

    def wait(self, marker) -> None:
        if isinstance(marker, torch.cuda.Event):
            self.stream.wait_event(marker)
        else:  # a worker stream's marker: only the host can wait for it
            marker.waiter()()
