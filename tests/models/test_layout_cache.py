"""The loader's layout cache: a file's interleaved matrices written once, mapped by later loads with the same bits,
and every entry that does not match its file (stale, corrupt, truncated, a cancelled write) never used."""

import errno
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from hypothesis import given, settings
from hypothesis import strategies as st

from pyggml.backend import tensor_set
from pyggml.backend.cpu.interleave import has_int8_products
from pyggml.cli.main import main
from pyggml.errors import BufferUseError, GGMLError, GGUFError, ParameterError
from pyggml.models import load_model
from pyggml.models.gguf import gguf_loader, layout_cache
from pyggml.models.gguf.layout_cache import HEADER_BYTES, SUFFIX, Entry, Placed, make_room

from tests.support.tiny_models import write_llama

pytestmark = pytest.mark.skipif(not has_int8_products(),
                                reason="matrices are interleaved only where AVX-512 VNNI or AVX2 multiplies them")
Q4_K, Q6_K = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K
MIX = {"attn_v": Q6_K, "ffn_down": Q6_K, "output": Q6_K, "*": Q4_K}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """Every buffer kept (no size floor), in a directory of the test's own."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("PYGGML_WEIGHTS_CACHE", str(directory))
    monkeypatch.delenv("PYGGML_WEIGHTS_CACHE_GB", raising=False)
    monkeypatch.setattr(layout_cache, "MIN_BYTES", 0)
    return directory


@pytest.fixture
def model_file(tmp_path):
    return write_llama(tmp_path / "mix.gguf", n_embd=256, n_ff=512, qtype=MIX)


def _logits_and_memory(path):
    """The logits of a short prompt, whether this load made a new entry, and whether the interleaved buffer is a
    file's mapping (an entry's, or the new one's) rather than the process's own memory."""
    layout_cache.finish_writes()
    model = load_model(path, n_ctx=64, progress=False)
    (buf,) = [b for b in model.weights.buffers if b.buft.name == "CPU_INTERLEAVED"]
    owner = buf._host
    while isinstance(owner, np.ndarray):
        owner = owner.base
    wrote = bool(layout_cache._pending)
    layout_cache.finish_writes()
    return model.decode(model.tokenize("hello world, once more")).copy(), wrote, owner is not None


def test_the_second_load_maps_the_entry_and_computes_the_same_bits(cache, model_file, monkeypatch):
    first, wrote, mapped = _logits_and_memory(model_file)
    assert wrote and mapped  # repacked into the new entry's file
    (entry,) = cache.glob("*" + SUFFIX)
    assert not list(cache.glob(".incoming-*"))
    second, wrote_again, mapped = _logits_and_memory(model_file)
    assert not wrote_again and mapped
    np.testing.assert_array_equal(first, second)
    monkeypatch.setenv("PYGGML_WEIGHTS_CACHE", "off")
    third, wrote, mapped = _logits_and_memory(model_file)
    assert not wrote and not mapped  # the process's own memory
    np.testing.assert_array_equal(first, third)
    with open(entry, "rb") as f:
        assert f.read(len(layout_cache.MAGIC)) == layout_cache.MAGIC


def test_an_entry_of_other_bytes_is_deleted_and_the_file_repacked(cache, model_file):
    """A byte changed in a tensor's first row group (or its source changed in place, with the same size and
    time): the check against a fresh repack refuses the entry, deletes it and writes a good one."""
    reference, _, _ = _logits_and_memory(model_file)
    (entry,) = cache.glob("*" + SUFFIX)
    with open(entry, "r+b") as f:
        f.seek(HEADER_BYTES + 5)
        byte = f.read(1)
        f.seek(HEADER_BYTES + 5)
        f.write(bytes([byte[0] ^ 0xFF]))
    logits, wrote, _ = _logits_and_memory(model_file)
    assert wrote  # refused, so repacked and written again
    np.testing.assert_array_equal(reference, logits)
    again, wrote, _ = _logits_and_memory(model_file)
    assert not wrote
    np.testing.assert_array_equal(reference, again)


def test_a_truncated_entry_and_a_changed_source_are_not_used(cache, model_file):
    reference, _, _ = _logits_and_memory(model_file)
    (entry,) = cache.glob("*" + SUFFIX)
    os.truncate(entry, entry.stat().st_size - 4096)
    logits, wrote, _ = _logits_and_memory(model_file)
    assert wrote and entry.stat().st_size > HEADER_BYTES
    np.testing.assert_array_equal(reference, logits)
    stat = model_file.stat()
    os.utime(model_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a new version of the file: a new key
    _, wrote, _ = _logits_and_memory(model_file)
    (newer,) = cache.glob("*" + SUFFIX)  # the old version's entry is gone
    assert wrote and newer != entry


def test_a_load_that_fails_midway_leaves_no_entry(cache, model_file, monkeypatch):
    calls = []

    def fail_on_the_third(*args):
        calls.append(1)
        if len(calls) == 3:
            raise GGMLError("the disk went away")
        return real_set(*args)

    real_set = gguf_loader.tensor_set
    monkeypatch.setattr(gguf_loader, "tensor_set", fail_on_the_third)
    with pytest.raises(GGUFError, match="the disk went away"):
        load_model(model_file, n_ctx=64, progress=False)
    assert not list(cache.glob("*")) and not layout_cache._pending


def test_no_room_repacks_into_memory_and_keeps_nothing(cache, model_file, monkeypatch):
    """An entry larger than the cap, or a disk that cannot take it (posix_fallocate fails), is not written; the
    model loads as without the cache."""
    reference, _, _ = _logits_and_memory(model_file)
    for p in cache.iterdir():
        p.unlink()
    monkeypatch.setenv("PYGGML_WEIGHTS_CACHE_GB", str(4 / 1024 / 1024))  # 4 KiB
    logits, wrote, mapped = _logits_and_memory(model_file)
    assert not wrote and not mapped and not list(cache.iterdir())
    np.testing.assert_array_equal(reference, logits)
    monkeypatch.delenv("PYGGML_WEIGHTS_CACHE_GB")

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    logits, wrote, mapped = _logits_and_memory(model_file)
    assert not wrote and not mapped and not list(cache.iterdir())
    np.testing.assert_array_equal(reference, logits)


def test_the_weights_of_an_entry_are_read_only(cache, model_file):
    """Written once, by the repack: a later write into the entry's (or the new entry's) memory is refused."""
    for _ in range(2):
        model = load_model(model_file, n_ctx=64, progress=False)
        t = model.weights.tensors["blk.0.attn_q.weight"]
        with pytest.raises(BufferUseError, match="read-only"):
            tensor_set(t, np.zeros(t.nbytes, np.uint8))
        layout_cache.finish_writes()


def test_the_process_finishes_the_entry_at_exit(cache, model_file):
    """A process that loads and exits at once still leaves a whole entry (it waits for the writer)."""
    code = ("import sys; from pyggml.models.gguf import layout_cache; layout_cache.MIN_BYTES = 0; "
            "from pyggml.models import load_model; load_model(sys.argv[1], n_ctx=64, progress=False)")
    done = subprocess.run([sys.executable, "-c", code, str(model_file)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYGGML_WEIGHTS_CACHE": str(cache)}, timeout=300)
    assert done.returncode == 0, done.stderr
    (entry,) = cache.glob("*" + SUFFIX)
    _, wrote, _ = _logits_and_memory(model_file)
    assert not wrote and entry.exists()


def _placed(n: int) -> list[Placed]:
    return [Placed(f"t{i}", int(Q4_K), (256, 16), i * 4096, 4096) for i in range(n)]


def test_the_least_recently_used_entries_go_first_under_the_cap(cache, tmp_path, monkeypatch):
    cache.mkdir()
    for i, name in enumerate(("old", "mid", "new")):
        p = cache / (name + SUFFIX)
        p.write_bytes(b"x" * (1 << 20))
        os.utime(p, ns=(10**18 + i, 10**18 + i))
    monkeypatch.setenv("PYGGML_WEIGHTS_CACHE_GB", str(3.5 / 1024))  # 3.5 MiB
    assert make_room(cache, 2 << 20)
    assert sorted(p.name for p in cache.iterdir()) == ["new" + SUFFIX]
    assert not make_room(cache, 4 << 20)  # larger than the cap: not written, nothing more deleted
    assert (cache / ("new" + SUFFIX)).exists()
    monkeypatch.setenv("PYGGML_WEIGHTS_CACHE_GB", "lots")
    with pytest.raises(ParameterError, match="PYGGML_WEIGHTS_CACHE_GB"):
        layout_cache.cap_bytes()


def test_a_partial_entry_of_a_killed_process_is_removed(cache, model_file):
    cache.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = cache / f".incoming-{int(dead.stdout)}-abc"
    alive = cache / f".incoming-{os.getpid()}-def"
    left.write_bytes(b"partial")
    alive.write_bytes(b"being written")
    _logits_and_memory(model_file)
    assert not left.exists() and alive.exists()


def test_the_key_covers_the_source_the_layout_and_every_tensor(model_file):
    a = Entry(str(model_file), _placed(2), 8192, "v1")
    assert a.key == Entry(str(model_file), _placed(2), 8192, "v1").key
    assert a.key != Entry(str(model_file), _placed(3), 12288, "v1").key
    assert a.key != Entry(str(model_file), _placed(2), 8192, "v2").key
    assert len(a.header) <= HEADER_BYTES and a.header.startswith(layout_cache.MAGIC)


def test_the_pyggml_program_leaves_a_whole_entry(cache, model_file):
    """`pyggml generate` ends with os._exit (no atexit): it still waits for the new entry's flush."""
    code = ("import sys; from pyggml.models.gguf import layout_cache; layout_cache.MIN_BYTES = 0; "
            "from pyggml.cli.main import run_and_exit; sys.argv = ['pyggml', 'generate', '-m', sys.argv[1], '-n', '2', "
            "'hello']; run_and_exit()")
    done = subprocess.run([sys.executable, "-c", code, str(model_file)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYGGML_WEIGHTS_CACHE": str(cache)}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(list(cache.glob("*" + SUFFIX))) == 1 and not list(cache.glob(".incoming-*"))


def test_pyggml_cache_lists_and_clears_the_entries(cache, model_file, capsys):
    _logits_and_memory(model_file)
    (entry,) = cache.glob("*" + SUFFIX)
    assert layout_cache.source_unchanged(layout_cache.header_facts(entry))
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"interleaved weights: {cache} (1 entry, " in out and str(model_file.resolve()) in out
    assert "has changed" not in out and "compiled kernels: " in out
    stat = model_file.stat()
    os.utime(model_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert main(["cache"]) == 0
    assert "(its file has changed or is gone)" in capsys.readouterr().out
    assert main(["cache", "--clear", "weights"]) == 0
    assert "deleted 1 interleaved weights entry" in capsys.readouterr().out
    assert not list(cache.glob("*" + SUFFIX))


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 64), min_size=0, max_size=8), new=st.integers(1, 96), cap=st.integers(1, 160))
def test_make_room_deletes_only_the_oldest_and_only_as_many_as_needed(tmp_path_factory, sizes, new, cap):
    """Sizes in KiB, the cap in KiB: afterwards the kept entries are the newest ones, the new entry fits beside them
    when make_room says so, and one entry fewer deleted would not have made room."""
    directory = tmp_path_factory.mktemp("cache")
    for i, size in enumerate(sizes):
        p = directory / f"e{i}{SUFFIX}"
        p.write_bytes(b"x" * (size << 10))
        os.utime(p, ns=(10**18 + i, 10**18 + i))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYGGML_WEIGHTS_CACHE_GB", str(cap / (1 << 20)))
        room = make_room(directory, new << 10)
    kept = sorted(int(p.name[1:-len(SUFFIX)]) for p in directory.glob("*" + SUFFIX))
    assert kept == list(range(len(sizes) - len(kept), len(sizes)))  # the newest survive
    used = sum(sizes[i] for i in kept)
    if new > cap:
        assert not room and len(kept) == len(sizes)  # nothing deleted for an entry that can never fit
    else:
        assert room and used + new <= cap
        deleted = len(sizes) - len(kept)
        if deleted:  # keeping the youngest deleted one as well would not have fit
            assert used + sizes[deleted - 1] + new > cap


def test_an_entry_leaves_a_tenth_of_the_disk_free(cache, monkeypatch):
    cache.mkdir()
    old = cache / ("old" + SUFFIX)
    old.write_bytes(b"x" * 4096)
    gib = 1 << 30
    usage = {"total": 100 * gib, "free": 12 * gib}
    monkeypatch.setattr(layout_cache.shutil, "disk_usage",
                        lambda path: SimpleNamespace(total=usage["total"], used=0, free=usage["free"]))
    assert make_room(cache, gib) and old.exists()   # 11 GiB left of 100: enough
    assert not make_room(cache, 3 * gib)            # 9 GiB would be left: the entry is not written
    assert not old.exists()                         # (the old entries went first, trying to make room)
    usage.update(total=5 * gib, free=int(2.5 * gib))
    assert not make_room(cache, 2 * gib)            # 0.5 GiB left: under the floor of 1 GiB
    assert make_room(cache, gib)


def test_a_header_longer_than_64_kib_takes_more_of_the_file(cache, model_file):
    """A file of many tensors (a large MoE model's thousands): the header takes as many 64 KiB units as it needs,
    where a fixed 64 KiB refused the load."""
    placed = [Placed(f"blk.{i}.ffn_down_exps.a_rather_long_tensor_name.weight", int(Q4_K), (256, 16), 4096 * i, 4096)
              for i in range(1000)]
    entry = Entry(str(model_file), placed, 4096 * 1000, "v1")
    assert len(entry.header) > HEADER_BYTES and entry.header_bytes == 2 * HEADER_BYTES
    incoming = layout_cache.Incoming.create(entry, cache)
    incoming.array[:] = np.arange(incoming.array.size) % 251
    incoming.commit()
    layout_cache.finish_writes()
    assert entry.path(cache).stat().st_size == 2 * HEADER_BYTES + entry.size
    assert layout_cache.header_facts(entry.path(cache))["size"] == entry.size
    mapped = entry.open(cache, lambda p: [])
    np.testing.assert_array_equal(mapped, np.arange(entry.size) % 251)
