"""split_over_threads and split_rows: kernels' work shared out over Python threads."""

import threading
import time

import numpy as np
import pytest

from pyggml.backend.cpu.kernels._blocks import set_threads, threads
from pyggml.backend.cpu.kernels._common import split_over_threads, split_rows


@pytest.fixture
def two_threads():
    before = threads()
    set_threads(2)
    yield
    set_threads(before)


def test_every_part_runs_once_on_several_threads(two_threads):
    done, names = [], set()

    def work(i):
        done.append(i)
        names.add(threading.current_thread().name)
        time.sleep(0.002)  # long enough that every thread gets parts

    split_over_threads(work, 50)
    assert sorted(done) == list(range(50))
    assert threading.current_thread().name in names  # the caller takes parts too


def test_a_failing_parts_error_reaches_the_caller_once_no_part_runs(two_threads):
    done = []

    def work(i):
        time.sleep(0.002)
        if i == 3:
            raise ValueError("part 3")
        done.append(i)

    with pytest.raises(ValueError, match="part 3"):
        split_over_threads(work, 20)
    finished = list(done)
    time.sleep(0.05)
    assert done == finished and 3 not in done  # nothing still runs after the error


def test_parts_keep_the_callers_floating_point_error_handling(two_threads):
    """The backend computes with C's float semantics (errors ignored); NumPy's error state is per thread."""
    raised = set()

    def work(i):
        time.sleep(0.002)
        try:
            np.float32(1) / np.zeros(1, np.float32)
        except FloatingPointError:
            raised.add(threading.current_thread().name)

    with np.errstate(divide="raise"):
        split_over_threads(work, 8)
    assert any(name.startswith("pyggml-cpu") for name in raised)
    raised.clear()
    with np.errstate(divide="ignore"):
        split_over_threads(work, 8)
    assert not raised


def test_split_rows_covers_the_rows_in_bands(two_threads):
    out = np.zeros(1 << 19, np.float32).reshape(1024, -1)
    split_rows(out.shape[0], out.size, lambda lo, hi: out[lo:hi].__iadd__(1))
    assert (out == 1).all()
