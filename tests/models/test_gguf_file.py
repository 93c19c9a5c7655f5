"""GGUF reader: valid files round-trip; every corrupted variant raises GGUFError and nothing else."""

import random
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyggml.errors import GGUFError
from pyggml.models.gguf.gguf_file import GGUFFile

CORPUS = Path(__file__).parent / "data" / "gguf_corpus"


# -- a tiny hand-made GGUF builder, so corruptions can target exact fields ------------


def gstr(s):
    raw = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def kv(key, vtype, payload):
    return gstr(key) + struct.pack("<I", vtype) + payload


def kv_u32(key, value):
    return kv(key, GGUFValueType.UINT32, struct.pack("<I", value))


def kv_str(key, value):
    return kv(key, GGUFValueType.STRING, gstr(value))


def kv_str_array(key, values):
    return kv(key, GGUFValueType.ARRAY,
              struct.pack("<IQ", GGUFValueType.STRING, len(values)) + b"".join(gstr(v) for v in values))


def tinfo(name, ne, ttype, offset):
    dims = struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}q", *ne)
    return gstr(name) + dims + struct.pack("<IQ", ttype, offset)


def build(kvs, infos, data, version=3, alignment=32, n_tensors=None, n_kv=None):
    """Bytes of a GGUF file plus the offsets where each section ends."""
    header = b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                   len(kvs) if n_kv is None else n_kv)
    out, bounds = bytearray(header), [4, 8, 16, 24]
    for part in kvs + infos:
        out += part
        bounds.append(len(out))
    out += b"\0" * (-len(out) % alignment)
    bounds.append(len(out))
    out += data
    return bytes(out), bounds


def f32_bytes(n, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32).tobytes()


def valid_parts():
    kvs = [
        kv_str("general.architecture", "tiny"),
        kv_u32("tiny.block_count", 2),
        kv("tiny.eps", GGUFValueType.FLOAT32, struct.pack("<f", 1e-6)),
        kv("tiny.flag", GGUFValueType.BOOL, b"\x01"),
        kv_str_array("tokenizer.ggml.tokens", ["<s>", "▁héllo", "日本"]),
        kv("tiny.ints", GGUFValueType.ARRAY, struct.pack("<IQ3i", GGUFValueType.INT32, 3, -1, 0, 7)),
        kv("tiny.nested", GGUFValueType.ARRAY, struct.pack("<IQ", GGUFValueType.ARRAY, 2)
           + struct.pack("<IQ2H", GGUFValueType.UINT16, 2, 1, 2) + struct.pack("<IQ", GGUFValueType.UINT8, 0)),
    ]
    a = f32_bytes(64)
    b = b"\x11" * (2 * 34)  # two Q8_0 blocks
    infos = [tinfo("a.weight", [8, 8], GGMLQuantizationType.F32, 0),
             tinfo("b.weight", [64], GGMLQuantizationType.Q8_0, 256)]
    return kvs, infos, a + b


def valid_file():
    return build(*valid_parts())


def must_reject(data):
    with pytest.raises(GGUFError):
        GGUFFile.from_bytes(data)


# -- valid files --------------------------------------------------------------------


def test_handmade_file_parses_every_field():
    data, _ = valid_file()
    f = GGUFFile.from_bytes(data)
    assert f.version == 3 and f.architecture == "tiny" and f.alignment == 32
    assert f.metadata["tiny.block_count"] == 2
    assert f.metadata["tiny.eps"] == pytest.approx(1e-6)
    assert f.metadata["tiny.flag"] is True
    assert f.metadata["tokenizer.ggml.tokens"] == ["<s>", "▁héllo", "日本"]
    assert f.metadata["tiny.ints"].tolist() == [-1, 0, 7]  # numeric arrays come as read-only NumPy arrays
    assert f.metadata["tiny.ints"].dtype == np.int32 and not f.metadata["tiny.ints"].flags.writeable
    assert [a.tolist() for a in f.metadata["tiny.nested"]] == [[1, 2], []]
    assert f.field_types["tiny.ints"].element_type == GGUFValueType.INT32
    a, b = f.tensors
    assert (a.name, a.type, a.ne, a.n_dims, a.nbytes) == ("a.weight", GGMLQuantizationType.F32, (8, 8, 1, 1), 2, 256)
    assert (b.type, b.ne, b.nbytes) == (GGMLQuantizationType.Q8_0, (64, 1, 1, 1), 68)
    assert f.data_offset % 32 == 0 and a.offset_in_file == f.data_offset
    np.testing.assert_array_equal(np.frombuffer(f.tensor_bytes(a), np.float32),
                                  np.frombuffer(f32_bytes(64), np.float32))


def test_gguf_writer_file_round_trips(tmp_path):
    path = tmp_path / "w.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 3)
    w.add_int64("x.i64", -(2**40))
    w.add_float64("x.f64", 2.5)
    w.add_string("x.s", "ünïcode ✓")
    w.add_array("x.strs", ["a", "bb", ""])
    w.add_array("x.floats", [0.5, -1.0])
    w.add_bool("x.no", False)
    tensors = {"t0": np.arange(12, dtype=np.float32).reshape(3, 4), "t1": np.ones((2, 5), np.float16)}
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile.open(path) as f:
        assert f.architecture == "llama"
        assert f.metadata["x.i64"] == -(2**40) and f.metadata["x.f64"] == 2.5
        assert f.metadata["x.s"] == "ünïcode ✓" and f.metadata["x.strs"] == ["a", "bb", ""]
        assert f.metadata["x.floats"].tolist() == [0.5, -1.0] and f.metadata["x.no"] is False
        assert f.get("missing", 7) == 7
        with pytest.raises(GGUFError, match="missing.key"):
            f.require("missing.key")
        assert [t.name for t in f.tensors] == ["t0", "t1"]
        assert f.tensors[0].ne == (4, 3, 1, 1) and f.tensors[1].type == GGMLQuantizationType.F16
        for info, arr in zip(f.tensors, tensors.values(), strict=True):
            view = f.tensor_bytes(info)
            assert isinstance(view, memoryview) and view.tobytes() == arr.tobytes()
        kept = f.tensor_bytes(f.tensors[0])
    assert f.closed
    assert kept.tobytes() == tensors["t0"].tobytes()  # a live view keeps the mapping valid
    with pytest.raises(GGUFError, match="after close"):
        f.tensor_bytes(f.tensors[0])


def test_custom_alignment_and_v2():
    kvs, infos, data = valid_parts()
    data64, _ = build(kvs + [kv_u32("general.alignment", 64)], infos, data, alignment=64, version=2)
    f = GGUFFile.from_bytes(data64)
    assert f.version == 2 and f.alignment == 64 and f.data_offset % 64 == 0


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFFile.open(tmp_path / "nope.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(GGUFError, match="empty"):
        GGUFFile.open(tmp_path / "empty.gguf")


# -- corrupted files ------------------------------------------------------------------


def test_every_truncation_at_a_section_boundary_is_rejected():
    data, bounds = valid_file()
    for cut in sorted(set(bounds) | {b - 1 for b in bounds} | {len(data) - 1}):
        if cut < len(data):
            must_reject(data[:cut])


def test_truncation_at_random_offsets_is_rejected():
    data, _ = valid_file()
    for cut in random.Random(0).sample(range(len(data)), 60):
        must_reject(data[:cut])


def corrupted_variants():
    """(name, bytes, message fragment) for every kind of damage the reader must catch."""
    kvs, infos, data = valid_parts()
    good, _ = build(kvs, infos, data)
    v = [
        ("bad_magic", b"GGML" + good[4:], "magic"),
        ("version_1", good[:4] + struct.pack("<I", 1) + good[8:], "v1"),
        ("version_99", good[:4] + struct.pack("<I", 99) + good[8:], "version 99"),
        ("big_endian", good[:4] + struct.pack(">I", 3) + good[8:], "byte-swapped"),
        ("tensor_count_2e60", build(kvs, infos, data, n_tensors=2**60)[0], "tensor_count"),
        ("kv_count_2e60", build(kvs, infos, data, n_kv=2**60)[0], "metadata_kv_count"),
        ("kv_count_too_high", build(kvs, infos, data, n_kv=len(kvs) + 1)[0], "offset"),
        ("key_length_past_eof", build([gstr("k")[:0] + struct.pack("<Q", 10**6) + b"abc"], [], b"")[0],
         "string length"),
        ("string_value_past_eof", build([kv("k", GGUFValueType.STRING, struct.pack("<Q", 2**62))], [], b"")[0],
         "string length"),
        ("array_count_past_eof", build([kv("k", GGUFValueType.ARRAY, struct.pack("<IQ", GGUFValueType.UINT64, 2**59))],
                                       [], b"")[0], "element count"),
        ("string_array_count_huge",
         build([kv("k", GGUFValueType.ARRAY, struct.pack("<IQ", GGUFValueType.STRING, 2**40))], [], b"")[0],
         "element count"),
        ("unknown_value_type", build([kv("k", 13, b"\0" * 8)], [], b"")[0], "unknown value type 13"),
        ("unknown_array_element_type", build([kv("k", GGUFValueType.ARRAY, struct.pack("<IQ", 99, 1))], [], b"")[0],
         "unknown value type 99"),
        ("nested_too_deep", build([kv("k", GGUFValueType.ARRAY, struct.pack("<IQ", GGUFValueType.ARRAY, 1) * 12
                                      + struct.pack("<IQ", GGUFValueType.UINT8, 0))], [], b"")[0], "nested"),
        ("bad_utf8_key", build([kv(b"\xff\xfe", GGUFValueType.UINT32, b"\0" * 4)], [], b"")[0], "UTF-8"),
        ("bad_utf8_value", build([kv("k", GGUFValueType.STRING, gstr(b"ok\xc3("))], [], b"")[0], "UTF-8"),
        ("bad_utf8_in_string_array", build([kv("k", GGUFValueType.ARRAY, struct.pack("<IQ", GGUFValueType.STRING, 2)
                                               + gstr("fine") + gstr(b"\xed\xa0\x80"))], [], b"")[0], "UTF-8"),
        ("duplicate_key", build([kv_u32("k", 1), kv_u32("k", 2)], [], b"")[0], "duplicate key 'k'"),
        ("alignment_not_power_of_two", build(kvs + [kv_u32("general.alignment", 48)], infos, data)[0], "power of two"),
        ("alignment_wrong_type", build(kvs + [kv_str("general.alignment", "32")], infos, data)[0], "UINT32"),
        ("unknown_tensor_type", build(kvs, [tinfo("a.weight", [8, 8], 4, 0), infos[1]], data)[0],
         "unknown ggml type 4"),
        ("tensor_type_huge", build(kvs, [tinfo("a.weight", [8, 8], 2**31, 0), infos[1]], data)[0], "unknown ggml type"),
        ("too_many_dims", build(kvs, [tinfo("a.weight", [1, 1, 1, 1, 64], 0, 0), infos[1]], data)[0], "dimensions"),
        ("negative_ne", build(kvs, [tinfo("a.weight", [-8, -8], 0, 0), infos[1]], data)[0], "expected >= 0"),
        ("ne_overflow", build(kvs, [tinfo("a.weight", [2**62, 2**62], 0, 0), infos[1]], data)[0], "2\\*\\*63"),
        ("ne_not_multiple_of_block", build(kvs, [infos[0], tinfo("b.weight", [48], GGMLQuantizationType.Q8_0, 256)],
                                           data)[0], "block size 32"),
        ("tensor_offset_past_end", build(kvs, [infos[0], tinfo("b.weight", [64], GGMLQuantizationType.Q8_0, 2**40)],
                                         data)[0], "past the end"),
        ("tensor_offset_misaligned", build(kvs, [infos[0], tinfo("b.weight", [64], GGMLQuantizationType.Q8_0, 260)],
                                           data)[0], "alignment"),
        ("tensor_offset_wraps", build(kvs, [infos[0], tinfo("b.weight", [64], GGMLQuantizationType.Q8_0,
                                                            2**64 - 32)], data)[0], "past the end"),
        ("overlapping_tensors", build(kvs, [infos[0], tinfo("b.weight", [64], GGMLQuantizationType.Q8_0, 224)],
                                      data)[0], "overlaps"),
        ("duplicate_tensor_name", build(kvs, [infos[0], tinfo("a.weight", [64], GGMLQuantizationType.Q8_0, 256)],
                                        data)[0], "duplicate tensor name"),
        ("tensor_name_too_long", build(kvs, [tinfo("x" * 64, [8, 8], 0, 0), infos[1]], data)[0], "name is 64 bytes"),
        ("data_section_missing", build(kvs, infos, b"")[0], "past the end"),
    ]
    return v


@pytest.mark.parametrize("name,data,message", corrupted_variants(), ids=[v[0] for v in corrupted_variants()])
def test_corrupted_variant_raises_gguf_error(name, data, message):
    with pytest.raises(GGUFError, match=message):
        GGUFFile.from_bytes(data)


def test_error_names_field_and_offset():
    kvs, infos, data = valid_parts()
    bad, _ = build(kvs, [infos[0], tinfo("b.weight", [64], 77, 256)], data)
    with pytest.raises(GGUFError) as e:
        GGUFFile.from_bytes(bad)
    type_offset = bad.index(b"b.weight") + len("b.weight") + 4 + 8
    assert "tensor 'b.weight' type" in str(e.value) and f"offset {type_offset}" in str(e.value)


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.gguf")), ids=lambda p: p.name)
def test_regression_corpus_is_rejected(path):
    with pytest.raises(GGUFError):
        GGUFFile.open(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_damage_parses_or_raises_gguf_error(draw):
    data, _ = valid_file()
    damaged = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 6))):
        pos = draw.draw(st.integers(0, len(damaged) - 1))
        damaged[pos] = draw.draw(st.integers(0, 255))
    cut = draw.draw(st.one_of(st.just(len(damaged)), st.integers(0, len(damaged))))
    try:
        f = GGUFFile.from_bytes(bytes(damaged[:cut]))
    except GGUFError:
        return
    for info in f.tensors:  # whatever parsed must be self-consistent
        assert f.data_offset <= info.offset_in_file and info.offset_in_file + info.nbytes <= len(damaged[:cut])


def test_released_pages_read_back_the_same(tmp_path):
    """release_pages only drops resident pages of the read-only mapping: the bytes are read again on use."""
    from tests.support.tiny_models import write_llama

    with GGUFFile.open(write_llama(tmp_path / "tiny.gguf")) as f:
        before = {t.name: bytes(f.tensor_bytes(t)) for t in f.tensors}
        for t in f.tensors:
            f.release_pages(t.offset_in_file, t.nbytes)
        f.release_pages(0, f.file_size + 4096)  # a range past the end is clipped
        assert {t.name: bytes(f.tensor_bytes(t)) for t in f.tensors} == before


def test_string_arrays_read_whole_with_empty_strings_and_every_utf8_width():
    values = ["", "a", "", "é", "日本", "😀x", ""]
    f = GGUFFile.from_bytes(build([kv_str("general.architecture", "tiny"), kv_str_array("k", values)], [], b"")[0])
    assert list(f.get("k")) == values and f.get("k").lengths().tolist() == [len(v.encode()) for v in values]


@pytest.mark.parametrize("values, index", [
    ([b"ok", "日".encode()[:1], "日".encode()[1:]], 1),  # one character cut across two strings: the whole is UTF-8
    ([b"ok", b"", b"\x80"], 2),                          # a string that starts with a continuation byte
    ([b"\xff", b"ok"], 0),
])
def test_a_string_that_is_not_utf8_on_its_own_is_rejected_by_index(values, index):
    with pytest.raises(GGUFError, match=rf"'k'\[{index}\].*invalid UTF-8"):
        GGUFFile.from_bytes(build([kv_str("general.architecture", "tiny"), kv_str_array("k", values)], [], b"")[0])


def test_value_types_are_the_gguf_packages():
    """gguf_file's own enum of metadata value types (see pyggml.core.types) numbers them as the gguf package does."""
    from pyggml.models.gguf import gguf_file

    assert {t.name: int(t) for t in gguf_file.GGUFValueType} == {t.name: int(t) for t in GGUFValueType}
