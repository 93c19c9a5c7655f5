"""GGUF fuzzing beyond tests/models/test_gguf_file.py (which covers hand-made corruptions, truncations and
random byte damage of the reader): field-aware damage of a real llama file written by gguf.GGUFWriter (every
count, length, type, dimension and offset set to absurd values), driven through the reader and through
`pyggml.models.load_model`, and hyperparameters that are missing, of the wrong type or absurd. Each bad file
raises GGUFError (never another exception), within a time limit and without an absurd allocation
(tracemalloc peak)."""

from __future__ import annotations

import signal
import tracemalloc
from contextlib import contextmanager

import numpy as np
import pytest
from gguf import GGUFReader
from hypothesis import given, strategies as st

from pyggml.core.types import GGMLType
from pyggml.backend import init_by_name
from pyggml.errors import GGUFError
from pyggml.models import load_model
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.llm.model import Model

from tests.support.tiny_models import write_llama  # noqa: E402 - the models tests' small random GGUF writer

TIME_LIMIT_S = 10
PEAK_LIMIT = 64 << 20  # the valid file loads in a few MiB; a bad count must not make the loader allocate more


@pytest.fixture(scope="module")
def llama_bytes(tmp_path_factory) -> bytes:
    path = write_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf", n_embd=32, n_ff=48, n_vocab=48, n_layer=1)
    return path.read_bytes()


@pytest.fixture(scope="module")
def numeric_fields(llama_bytes, tmp_path_factory) -> list[tuple[str, int, int]]:
    """(field name, byte offset, byte width) of every number in the header: counts, lengths, types, dims, offsets."""
    path = tmp_path_factory.mktemp("gguf") / "fields.gguf"
    path.write_bytes(llama_bytes)
    reader = GGUFReader(path)
    base = reader.data.ctypes.data
    fields = []
    parts = [(name, i, part) for name, f in reader.fields.items() for i, part in enumerate(f.parts) if i not in f.data]
    parts += [(t.name, i, part) for t in reader.tensors for i, part in enumerate(t.field.parts)]
    for name, i, part in parts:  # a tensor info's parts: name length, name, n_dims, dims, type, data offset
        if part.dtype != np.uint8:  # numbers, not string bytes
            for j in range(part.size):
                fields.append((f"{name}[{i}]", part.ctypes.data - base + j * part.itemsize, part.itemsize))
    del reader
    return fields


@contextmanager
def limits():
    """Fail a call that hangs (SIGALRM) or allocates more than PEAK_LIMIT bytes of Python memory."""
    def hang(*_):
        raise TimeoutError(f"took more than {TIME_LIMIT_S} s")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(TIME_LIMIT_S)
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
        assert peak < PEAK_LIMIT, f"peak allocation {peak} bytes"
    finally:
        tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def absurd_values(width: int, original: int, file_size: int) -> list[int]:
    top = (1 << (8 * width)) - 1
    return sorted({v & top for v in (0, 1, original + 1, original - 1, file_size, 2**31, 2**32 - 1, 2**63 - 1, top)})


def damaged(data: bytes, offset: int, width: int, value: int) -> bytes:
    return data[:offset] + value.to_bytes(width, "little") + data[offset + width:]


def must_reject_or_load(load):
    """GGUFError, or a successful load: nothing else."""
    with limits():
        try:
            load()
        except GGUFError as e:
            assert "offset" in str(e) or "'" in str(e), f"message names neither a field nor an offset: {e}"


def test_every_header_number_set_to_absurd_values_is_rejected_by_the_reader(llama_bytes, numeric_fields):
    tried = 0
    for _name, offset, width in numeric_fields:
        original = int.from_bytes(llama_bytes[offset:offset + width], "little")
        for value in absurd_values(width, original, len(llama_bytes)):
            if value != original:
                must_reject_or_load(lambda o=offset, w=width, v=value:
                                    GGUFFile.from_bytes(damaged(llama_bytes, o, w, v)))
                tried += 1
    assert tried > 500


@given(data=st.data())
def test_damaged_header_numbers_through_load_model(llama_bytes, numeric_fields, tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "bad.gguf"
    blob = llama_bytes
    for _ in range(data.draw(st.integers(1, 3))):
        name, offset, width = data.draw(st.sampled_from(numeric_fields))
        original = int.from_bytes(blob[offset:offset + width], "little")
        blob = damaged(blob, offset, width, data.draw(st.sampled_from(absurd_values(width, original, len(blob)))))
    path.write_bytes(blob)
    must_reject_or_load(lambda: load_model(path, n_ctx=16, n_batch=4))


HPARAMS = ["context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
           "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count"]


@pytest.mark.parametrize("key", ["general.architecture"] + [f"llama.{k}" for k in HPARAMS])
def test_missing_architecture_keys_are_named(tmp_path, key):
    path = write_llama(tmp_path / "missing.gguf", n_embd=32, n_ff=48, n_vocab=48, n_layer=1, drop=[key])
    try:
        with limits():
            load_model(path, n_ctx=16, n_batch=4)
    except GGUFError as e:  # the key itself, or (for a key with a default) a tensor the default contradicts
        assert key in str(e) or "has shape" in str(e)


@pytest.mark.parametrize("value", ["sixteen", -1, 0, 2**40, 1.5, [1, 2], True], ids=repr)
@pytest.mark.parametrize("key", HPARAMS)
def test_hyperparameters_of_the_wrong_type_or_absurd_are_refused(llama_bytes, tmp_path, key, value):
    """Values a GGUF can hold but a model cannot use: GGUFError naming the key, never a TypeError, a
    ZeroDivisionError or a KV cache of 2**40 heads."""
    path = tmp_path / "tiny.gguf"
    path.write_bytes(llama_bytes)
    gguf = GGUFFile.open(path)
    gguf.metadata[f"llama.{key}"] = value
    try:
        with limits():
            Model(gguf, [init_by_name("CPU")], 16, 4, "f32", GGMLType.F16, None)
    except GGUFError as e:  # the key itself, or a tensor the value contradicts (its shape, or one too many)
        assert f"llama.{key}" in str(e) or "has shape" in str(e) or "is missing" in str(e)
    finally:
        gguf.close()


def test_overlapping_tensor_data_in_a_writer_file_is_rejected(llama_bytes, numeric_fields):
    """The second tensor's data offset moved onto the first tensor's bytes."""
    tensor_offsets = [(o, w) for n, o, w in numeric_fields if n.endswith(".weight[5]")]
    offset, width = tensor_offsets[1]
    with pytest.raises(GGUFError, match="overlaps"):
        GGUFFile.from_bytes(damaged(llama_bytes, offset, width, 0))
