"""Shared test settings: the compiled kernels' cache, the graph fixtures and the hypothesis profiles."""

import importlib.util
import os
from pathlib import Path

# The tests compile kernels for many argument types a model never passes; they go to a cache of their own
# (kept between runs), so that the package's cache holds what real runs used: a model loads all of that
# when it starts (pyggml.backend.cpu.jit.runtime.compile_cache.load_cached). Set before Numba is imported.
os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".numba-test-cache"))

# The suite's two workers (and the servers and commands they start) each run Numba's OpenMP threads on the same two
# cores: OpenMP's default waits by spinning, so an idle team held the cores another process's team was waiting
# for (three model test files: 69 s, 127 s of CPU; passive: 15 s, 24 s). It changes no result, only who waits.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Models loaded by the tests do not keep their interleaved layout in the user's cache; the layout cache's own tests
# point it at a temporary directory (pyggml.models.gguf.layout_cache).
os.environ.setdefault("PYGGML_WEIGHTS_CACHE", "off")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from tests.support.fixture_data import graph_paths  # noqa: E402

RPC_PEER_FIX = ('CMAKE_ARGS="-DGGML_RPC=ON" .venv/bin/pip install --no-cache-dir --force-reinstall --no-deps '
                'ggml-python==0.0.45')

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LONG = bool(os.environ.get("PYGGML_LONG"))
settings.load_profile("long" if LONG else "ci")


def pytest_sessionstart(session):
    """The RPC tests run against ggml's own RPC server from ggml-python: a build of it without RPC (a wheel that
    pip reused from its cache, built without CMAKE_ARGS) stops the run at once with the command that fixes it,
    rather than failing a dozen tests later."""
    spec = importlib.util.find_spec("ggml")
    if spec is None or not spec.submodule_search_locations:
        return  # no peer at all: its tests skip
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    if (lib / "libggml-base.so").exists() and not (lib / "libggml-rpc.so").exists():
        pytest.exit(f"ggml-python in {lib.parent} was built without RPC (no libggml-rpc.so); run: {RPC_PEER_FIX}",
                    returncode=4)


# The files that take longest (1-3 minutes each on two shared cores, kernels compiled) start first, the rest
# follow in collection order (addopts: --no-loadscope-reorder), so that the two processes of --dist loadfile end
# together. The README's commands stay late (collection order): each is a fresh process, which compiled what the
# cache did not hold yet when the file started early (205-225 s against 85-107 s late, 32 s alone and warm).
LONGEST_FIRST = ("tests/models/whisper/test_whisper_transcribe.py", "tests/peer/test_ops_vs_ggml.py",
                 "tests/backend/torch_backend/test_torch_ops.py", "tests/models/whisper/test_whisper_quantized.py",
                 "tests/sched/test_real_graphs.py", "tests/serve/llamacpp_ported_compat/test_compat_anthropic.py",
                 "tests/serve/llamacpp_ported/test_completion.py", "tests/backend/cpu/test_interleave.py",
                 "tests/models/test_batch.py", "tests/models/whisper/test_whisper_batched.py",
                 "tests/backend/rpc/test_hostile.py", "tests/serve/llamacpp_ported_compat/test_ctx_shift.py")


def pytest_collection_modifyitems(config, items):
    """Tests marked long_only (whole base-model runs, beam search over every sentence) run with PYGGML_LONG=1;
    the default profile deselects them, so they show as deselected, never as skipped. LONGEST_FIRST's files
    go to the front."""
    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order
    if LONG:
        return
    kept = [item for item in items if item.get_closest_marker("long_only") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("long_only")])
        items[:] = kept


@pytest.fixture(scope="session")
def graph_files():
    """The six ggml graph files of tests/data/graphs (tests/test_fixture_data.py checks they are there)."""
    return graph_paths()
