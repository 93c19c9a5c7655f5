"""Compiling with Numba: the decorators every compiled function of the package uses, their on-disk cache, kernels
made once per ggml type, and a clock of the time spent compiling.

Kernels compile on first call and are cached on disk (`cache=True`), so only the first process pays for them.
The cache lives in the user's cache directory ($NUMBA_CACHE_DIR, else $XDG_CACHE_HOME/pyggml/numba, else
~/.cache/pyggml/numba), not beside the installed sources, so that a reinstall of the same sources keeps it. A
cached kernel is valid for the exact sources of its own folder and of the CPU backend's kernels (a kernel carries
the code of the functions it calls from other modules: an edit to quants.py must recompile mul_mat.py's kernels
too), for this Numba and this CPU. Each version of those sources has a folder of its own, so two installs of
different versions (two environments, an upgrade and a rollback) do not overwrite each other's kernels at every
alternate run; an old version's folder is a few MB.
Division follows C and NumPy (error_model "numpy": x / 0 gives inf or NaN, no exception, no check).

This module is below every layer (core): the memory planner (alloc) and the CPU backend both compile with it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

try:
    import fcntl
except ImportError:  # Windows: no locks, each process compiles what it misses
    fcntl = None

import numba
from numba.core import caching, config, environment, event
from numba.core.runtime import rtsys

from pyggml.core import machine_code


class CompileLocks(event.Listener):
    """One process compiles a kernel while the others that miss it in the cache wait, then load what it saved.

    Processes started together (the test suite's workers, a server beside a transcription) otherwise each compile
    the same kernels: two test workers compiled 80 of their 190-230 kernels twice. A lock is a file beside the
    cache's index (fcntl.flock, released by the kernel's save, or by the compile's end when it raised, or by the
    process's exit); a process waits at most WAIT seconds for it and then compiles anyway. A process holds one
    lock per kernel and signature, so a kernel that compiles itself again (recursion) does not wait on itself.
    Every compile runs under Numba's global compiler lock: one thread of a process takes these at a time."""

    WAIT = 300.0

    def __init__(self):
        self._held: dict[tuple[int, str], int] = {}  # (id of the cache, key digest) -> the lock file's descriptor

    def acquire(self, cache: caching.FunctionCache, sig, target_context) -> bool:
        """Take the lock of this kernel and signature; True when another process held it (it may have saved)."""
        if fcntl is None:
            return False
        key = hashlib.sha1(repr(cache._index_key(sig, target_context.codegen())).encode()).hexdigest()[:20]
        if (id(cache), key) in self._held:
            return False
        try:
            cache._impl.locator.ensure_cache_path()
            fd = os.open(f"{cache._cache_file._index_path}.{key}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return False  # a lock file this user cannot open (a cache shared between users): compile unlocked
        waited, deadline = False, time.monotonic() + self.WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    return True  # compile without it rather than wait on a process that hangs
                waited = True
                time.sleep(0.05)
        self._held[id(cache), key] = fd
        return waited

    def release(self, cache) -> None:
        """Let go of every lock this process holds for the cache's kernel (its save is done, or its compile failed)."""
        for held in [held for held in self._held if held[0] == id(cache)]:
            os.close(self._held.pop(held))  # closing the descriptor drops its flock

    def on_start(self, ev) -> None:
        pass

    def on_end(self, ev) -> None:
        if ev._exc_details is not None:  # the compile raised, no save will release its lock (is_failed reads inverted)
            self.release(ev.data["dispatcher"]._cache)


COMPILE_LOCKS = CompileLocks()
event.register("numba:compile", COMPILE_LOCKS)


class QuickLoadCache(caching.FunctionCache):
    """Numba's disk cache of one function, loaded without refreshing Numba's target context first; a kernel
    missing from it is compiled by one process at a time (CompileLocks).

    Numba refreshes it before every cache load: the first refresh of a process imports and registers every
    implementation Numba has (0.2-0.3 s, a fifth of a warm `pyggml generate`), which only compiling needs, and
    a compile refreshes it itself. Loading machine code needs Numba's runtime alone (NRT), started here."""

    def load_overload(self, sig, target_context):
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            found = self._load_overload(sig, target_context)
            if found is None and self._enabled and COMPILE_LOCKS.acquire(self, sig, target_context):
                found = self._load_overload(sig, target_context)  # what the process that held the lock saved
            if found is not None:
                COMPILE_LOCKS.release(self)
            return found

    def save_overload(self, sig, data):
        try:
            super().save_overload(sig, data)
        finally:
            COMPILE_LOCKS.release(self)


def rebuild_environment(modname: str, consts: list, env_name: str) -> environment.Environment:
    """numba.core.environment._rebuild_env without importing the module of an environment that holds nothing.

    A cached kernel brings back the environment of every function compiled into it, Numba's own included (the
    array allocator and reshape of numba.np.arrayobj), and Numba imports each one's module for its globals: that
    one module, with what it imports, was 20 ms of a warm start. The globals serve only object mode; a compiled
    kernel reads its environment's constants alone, so an environment without constants whose module is not
    loaded gets globals that name the module and nothing else. Any other is rebuilt as Numba rebuilds it."""
    if consts or modname in sys.modules or environment.lookup_environment(env_name) is not None:
        return _rebuild_env(modname, consts, env_name)
    env = environment.Environment({"__name__": modname})
    env.env_name = env_name
    environment.Environment._memo[env_name] = env
    return env


_rebuild_env = environment._rebuild_env
environment._rebuild_env = rebuild_environment  # pickled environments name it: a cached kernel's load calls it


class CacheOnFirstUse:
    """A dispatcher's QuickLoadCache, made when the dispatcher first uses it (to load or save a kernel), which then
    takes its place: a cache's making finds its locator, folder and index file names, 0.2 ms a function, for the
    88 functions `import pyggml` decorates, while a model's run loads 15-20 of them."""

    def __init__(self, dispatcher):
        self._dispatcher = dispatcher

    def __getattr__(self, name: str):
        if self._dispatcher._cache is self:
            self._dispatcher._cache = QuickLoadCache(self._dispatcher.py_func)
        return getattr(self._dispatcher._cache, name)


def _njit(**options):
    """numba.njit with these options, its disk cache (cache=True) a QuickLoadCache made on first use: `@decorator`
    or `@decorator(**more)`. The cache is set here rather than made by Numba and then replaced (a cache's making
    finds its locator and folder: 93 kernels made theirs twice at every `import pyggml`)."""
    def make(fn, chosen: dict):
        dispatcher = numba.njit(fn, **{**chosen, "cache": False})
        if chosen.get("cache"):
            dispatcher._cache = CacheOnFirstUse(dispatcher)
        return dispatcher

    def decorate(fn=None, **more):
        chosen = {**options, **more}  # the call's own options win (cache=False among them)
        return (lambda f: make(f, chosen)) if fn is None else make(fn, chosen)
    return decorate


# no_cfunc_wrapper: no C callback per function (a first-class function value, which no kernel takes): its IR,
# optimization and machine code were a few percent of every compile
jit = _njit(cache=True, nogil=True, error_model="numpy", no_cfunc_wrapper=True)
parallel_jit = _njit(cache=True, nogil=True, error_model="numpy", no_cfunc_wrapper=True, parallel=True)
machine_code.install()  # the libraries of the functions compiled here: machine code only where it runs

PACKAGE = Path(__file__).resolve().parents[1]
SHARED_KERNELS = PACKAGE / "backend" / "cpu" / "jit"  # the kernels whose code others inline or call


def cache_root() -> Path:
    """Where compiled kernels are kept: $NUMBA_CACHE_DIR/pyggml if set (the tests' own), else the user's cache."""
    if config.CACHE_DIR:
        return Path(config.CACHE_DIR) / "pyggml"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pyggml" / "numba"


@functools.lru_cache(maxsize=None)
def sources_digest(folder: Path) -> str:
    """SHA-1 of every .py file under `folder` (names and contents), once per process."""
    digest = hashlib.sha1()
    for source in sorted(folder.rglob("*.py")):
        digest.update(str(source.relative_to(folder)).encode() + source.read_bytes())
    return digest.hexdigest()


class PackageCacheLocator(caching._CacheLocator):
    """Numba's cache for this package's functions: a folder per source folder and version of its sources under
    cache_root(), valid while the sources of the function's folder and of the shared kernels are unchanged
    (Numba's own stamp covers the function's file alone)."""

    def __init__(self, py_func, py_file: str):
        self._folder = _source_folder(py_file)
        self._lineno = py_func.__code__.co_firstlineno
        version = hashlib.sha1("".join(self.get_source_stamp()).encode()).hexdigest()[:16]
        self._cache_path = str(cache_root() / self._folder.relative_to(PACKAGE) / version)

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self) -> tuple[str, str]:
        return sources_digest(self._folder), sources_digest(SHARED_KERNELS)

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _source_folder(py_file).is_relative_to(PACKAGE):
            return None  # not this package's: Numba's own locators
        locator = cls(py_func, py_file)
        try:
            _ensure_writable(locator.get_cache_path())
        except OSError:
            return None  # an unwritable cache: Numba's own locators, or no cache
        return locator


@functools.lru_cache(maxsize=None)
def _source_folder(py_file: str) -> Path:
    return Path(py_file).resolve().parent


@functools.lru_cache(maxsize=None)
def _ensure_writable(cache_path: str) -> None:
    """Numba's check of a cache folder (made, and a file written in it), once per folder and process rather than
    for each of the 80-odd functions (twice each) a warm start decorates."""
    os.makedirs(cache_path, exist_ok=True)
    tempfile.TemporaryFile(dir=cache_path).close()


if PackageCacheLocator not in caching.CacheImpl._locator_classes:
    caching.CacheImpl._locator_classes.insert(0, PackageCacheLocator)


class PerType:
    """A kernel made and compiled once per ggml type, the type a constant of its code: `make(qtype)` returns a
    compiled function whose body passes the closure's `qtype` to inlined (inline="always") functions that
    switch on it. Numba prunes the branches of the other types before it types anything, so a model compiles
    the dequantizers and dot products of its own types only (all fifteen types' took 8 of a first run's 19
    seconds of compilation). The closure's constant is part of the cached kernel's key.

    `kernel(qtype, *args)` calls the type's kernel; `kernel[qtype]` is that kernel (a Numba dispatcher)."""

    def __init__(self, make: Callable[[int], Callable]):
        self._make = make
        self._made: dict[int, Callable] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, make)

    def __getitem__(self, qtype: int):
        try:
            return self._made[qtype]
        except KeyError:
            with self._lock:
                return self._made.setdefault(int(qtype), self._make(int(qtype)))

    def __call__(self, qtype: int, *args):
        return self[qtype](*args)

    def made(self) -> list:
        """The types' kernels made so far."""
        return list(self._made.values())


class CompileClock(event.Listener):
    """Seconds spent compiling (not loading cached kernels) in this process, outermost compiles only; callbacks
    asked when a compile starts (so that a command can say, once, why its first step is slow)."""

    def __init__(self):
        self.seconds = 0.0
        self.compiles = 0
        self.on_first_compile: list[Callable[[], None]] = []
        self._local = threading.local()
        self._lock = threading.Lock()

    def on_start(self, ev) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._local.start = time.perf_counter()
            with self._lock:
                callbacks, self.on_first_compile = self.on_first_compile, []
            for callback in callbacks:
                callback()

    def on_end(self, ev) -> None:
        self._local.depth -= 1
        if self._local.depth == 0:
            with self._lock:
                self.seconds += time.perf_counter() - self._local.start
                self.compiles += 1


COMPILE_CLOCK = CompileClock()
event.register("numba:compile", COMPILE_CLOCK)


def compile_seconds() -> float:
    """Seconds this process has spent compiling kernels so far (cache loads excluded)."""
    return COMPILE_CLOCK.seconds


def when_compiling(callback: Callable[[], None]) -> None:
    """callback() once, when the next compile starts (never if everything comes from the cache)."""
    with COMPILE_CLOCK._lock:
        COMPILE_CLOCK.on_first_compile.append(callback)
