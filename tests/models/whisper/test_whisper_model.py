"""Placing a Whisper file's weights on a backend: the file's pages read for the copy do not stay resident
(they raised the peak RSS of a quantized base model by the file's size, which whisper.cpp does not keep)."""

import sys

import pytest

from pyggml.core.types import GGMLType
from pyggml.models.llm.runner import backend_list
from pyggml.models.whisper import load_whisper_file
from pyggml.models.whisper.ggml_bin import write_ggml_bin
from pyggml.models.whisper.model import WhisperWeights
from tests.support.resident import mapping_of

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and madvise are Linux's")


@pytest.mark.parametrize("type_name", ["F16", "Q8_0"])
def test_placed_weights_leave_no_file_pages_resident(type_name, tiny_en, tmp_path):
    """The CTranslate2 file (F16) and whisper.cpp's .bin of Q8_0 (interleaved for the integer products): after
    the copy, under 1/20 of the mapping stays resident (tiny.en's CTranslate2 file: 1.8 of 72 MiB, the pages
    tensors share with their neighbours and the small tensors made F32 copies when read), was all of it."""
    if type_name == "F16":
        wf = tiny_en
    else:
        write_ggml_bin(tiny_en, tmp_path / "tiny.bin", GGMLType[type_name])
        wf = load_whisper_file(tmp_path / "tiny.bin")
    embedding = wf.tensors["decoder.token_embedding.weight"].data
    embedding.sum()                                    # resident now, whatever the tests before did
    mapping = mapping_of(embedding)
    assert mapping.rss_kib * 1024 >= embedding.nbytes
    weights = WhisperWeights(wf, backend_list("CPU"))
    assert weights.nbytes >= sum(w.nbytes for w in wf.tensors.values()) * 0.9
    assert mapping_of(embedding).rss_kib * 1024 < (mapping.end - mapping.start) / 20
