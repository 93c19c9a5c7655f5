"""Loading weights: zero copy over the mmap, F32 expansion, and GGUFError for every kind of broken file."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from pyggml.backend import BufferUsage, init_by_name
from pyggml.backend.cpu.interleave import has_int8_products
from pyggml.core import GGMLType
from pyggml.errors import GGMLError, GGUFError
from pyggml.models import load_model
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.gguf.gguf_loader import load_weights
from pyggml.testing.synthetic import q4_k_m_mix, write_gpt_oss

from tests.support.tiny_models import write_gemma3, write_llama

Q8_0 = GGMLQuantizationType.Q8_0


@pytest.fixture
def q8_file(tmp_path):
    return write_llama(tmp_path / "q8.gguf", qtype=Q8_0)


def _data_section(gguf) -> tuple[int, int]:
    return (min(i.offset_in_file for i in gguf.tensors), max(i.offset_in_file + i.nbytes for i in gguf.tensors))


def test_quantized_weights_buffer_is_the_mapped_data_section(q8_file, monkeypatch):
    """No copy: the buffer is the file's mapping from the first tensor's byte to the last's (with nothing
    interleaved, as on a CPU without VNNI)."""
    monkeypatch.setattr("pyggml.backend.cpu.interleave.has_int8_products", lambda: False)
    gguf = GGUFFile.open(q8_file)
    w = load_weights(gguf, init_by_name("CPU"), weights="quantized")
    (buf,) = w.buffers
    first, end = _data_section(gguf)
    assert buf.usage == BufferUsage.WEIGHTS and buf.size == end - first
    assert w.file_tensor_bytes <= buf.size < w.file_tensor_bytes + 32 * len(gguf.tensors)  # alignment padding only
    for info in gguf.tensors:
        t = w.tensors[info.name]
        assert t.type == GGMLType(int(info.type)) and t.data - buf.base == info.offset_in_file - first
        assert t.numpy().tobytes() == bytes(gguf.tensor_bytes(info))


def test_f32_weights_place_quantized_matrices_in_the_cpu_f32_buffer_type(q8_file):
    """They keep their file type and shape; the CPU_F32 buffer holds their float32 values."""
    gguf = GGUFFile.open(q8_file)
    w = load_weights(gguf, init_by_name("CPU"), weights="f32")
    info = gguf.tensor("blk.0.attn_q.weight")
    t = w.tensors[info.name]
    raw = np.frombuffer(gguf.tensor_bytes(info), np.uint8).reshape(info.ne[1], -1)
    assert t.type == GGMLType.Q8_0 and t.buffer.buft.name == "CPU_F32"
    np.testing.assert_array_equal(t.buffer.values(t)[0, 0], dequantize(raw, Q8_0))
    assert w.file_bytes(t).tobytes() == raw.tobytes()
    assert (w.tensors["blk.0.attn_norm.weight"].data - w.buffers[0].base
            == gguf.tensor("blk.0.attn_norm.weight").offset_in_file
            - min(i.offset_in_file for i in gguf.tensors if int(i.type) == GGMLType.F32))  # the mapped F32 ones
    assert all(b.usage == BufferUsage.WEIGHTS for b in w.buffers) and len(w.buffers) == 2


def test_progress_bar_is_drawn_when_asked(q8_file, capsys):
    load_weights(GGUFFile.open(q8_file), init_by_name("CPU"), weights="f32", progress=True)
    err = capsys.readouterr().err
    assert "loading: 100%" in err


def test_no_bar_off_a_terminal_nor_when_refused(q8_file, capsys):
    """progress None draws a bar on a terminal only (capsys's stderr is none), False never."""
    for progress in (None, False):
        load_weights(GGUFFile.open(q8_file), init_by_name("CPU"), weights="f32", progress=progress)
        assert capsys.readouterr().err == ""


@pytest.mark.parametrize("drop, message", [
    ("llama.block_count", "'llama.block_count' is missing"),
    ("blk.1.ffn_up.weight", "tensor 'blk.1.ffn_up.weight' is missing"),
])
def test_missing_keys_and_tensors_are_named(tmp_path, drop, message):
    path = write_llama(tmp_path / "broken.gguf", drop=[drop])
    with pytest.raises(GGUFError, match=message):
        load_model(path)


def test_a_tensor_of_the_wrong_shape_is_named(tmp_path):
    path = write_llama(tmp_path / "bad.gguf", n_ff=96)
    gguf = GGUFFile.open(path)
    gguf.metadata["llama.feed_forward_length"] = 128
    from pyggml.models.llm.model import Model
    with pytest.raises(GGUFError, match=r"'blk.0.ffn_gate.weight' has shape \[64, 96\], expected \[64, 128\]"):
        Model(gguf, [init_by_name("CPU")], 16, 4, "f32", GGMLType.F16, None)


def test_unsupported_architecture_is_refused(tmp_path):
    path = write_llama(tmp_path / "m.gguf", arch="llama")
    data = path.read_bytes().replace(b"llama", b"mamba")
    (tmp_path / "mamba.gguf").write_bytes(data)
    with pytest.raises(GGUFError, match=r"architecture 'mamba' is not supported \(supported: .*llama"):
        load_model(tmp_path / "mamba.gguf")


def test_tensors_the_architecture_does_not_use_are_refused(tmp_path):
    """A Gemma 3 file relabelled gemma2: llama.cpp's gemma2 creates no q/k norms and refuses the file ("wrong
    number of tensors"); pyggml names the tensors it would otherwise leave out of the graph."""
    data = write_gemma3(tmp_path / "g3.gguf", n_layer=2).read_bytes().replace(b"gemma3", b"gemma2")
    (tmp_path / "g2.gguf").write_bytes(data)
    with pytest.raises(GGUFError, match=r"4 tensor\(s\) that pyggml's 'gemma2' does not use .*: "
                                        r"blk.0.attn_k_norm.weight, blk.0.attn_q_norm.weight"):
        load_model(tmp_path / "g2.gguf", n_ctx=16)


def test_mistral_is_no_architecture_and_is_not_written(tmp_path):
    with pytest.raises(GGMLError, match="not 'mistral'"):
        write_llama(tmp_path / "m.gguf", arch="mistral")


def test_truncated_file_is_refused(tmp_path, q8_file):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(q8_file.read_bytes()[: q8_file.stat().st_size // 2])
    with pytest.raises(GGUFError):
        load_model(cut)


def test_a_type_without_dequantization_cannot_be_expanded(tmp_path, q8_file, monkeypatch):
    import pyggml.models.gguf.gguf_loader as loader
    from pyggml.errors import UnsupportedTypeError

    def refuse(type_, data):
        raise UnsupportedTypeError(f"dequantization of {GGMLType(type_).name} is not supported")

    monkeypatch.setattr(loader.T, "to_float", refuse)
    with pytest.raises(GGUFError, match="token_embd.weight' of type Q8_0 cannot be placed in CPU_F32"):
        load_weights(GGUFFile.open(q8_file), init_by_name("CPU"), weights="f32")


def test_the_former_repack_keyword_and_unknown_weight_kinds_are_refused(q8_file):
    with pytest.raises(GGMLError, match='pass weights="f32"'):
        load_model(q8_file, repack=True)
    with pytest.raises(GGMLError, match="weights must be one of quantized, f32, got 'int8'"):
        load_weights(GGUFFile.open(q8_file), init_by_name("CPU"), weights="int8")


@pytest.fixture
def q4_0_file(tmp_path):
    return write_llama(tmp_path / "q4_0.gguf", qtype=GGMLQuantizationType.Q4_0)


@pytest.mark.skipif(not has_int8_products(), reason="Q4_0 is interleaved only where AVX-512 VNNI or AVX2 multiplies it")
def test_q4_0_matrices_are_interleaved_except_the_token_embedding(q4_0_file, q8_file):
    """Same bytes, moved: the weights take the file's tensor bytes; get_rows' embedding stays in the file."""
    gguf = GGUFFile.open(q4_0_file)
    w = load_weights(gguf, init_by_name("CPU"))
    placed = {name: t.buffer.buft.name for name, t in w.tensors.items()}
    assert placed["blk.0.attn_q.weight"] == placed["output.weight"] == "CPU_INTERLEAVED"
    assert placed["token_embd.weight"] == placed["blk.0.attn_norm.weight"] == "CPU_Mapped"
    assert w.nbytes == w.file_tensor_bytes
    model = load_model(q4_0_file, n_ctx=64)
    assert np.isfinite(model.decode(model.tokenize("hello world"))).all()
    assert load_weights(GGUFFile.open(q8_file), init_by_name("CPU")).tensors["blk.1.ffn_up.weight"].buffer.buft.name \
        == "CPU_INTERLEAVED"


def test_without_vnni_q4_0_stays_in_the_file(q4_0_file, monkeypatch):
    monkeypatch.setattr("pyggml.backend.cpu.interleave.has_int8_products", lambda: False)
    w = load_weights(GGUFFile.open(q4_0_file), init_by_name("CPU"))
    assert {t.buffer.buft.name for t in w.tensors.values()} == {"CPU_Mapped"} and len(w.buffers) == 1


@pytest.mark.skipif(not has_int8_products(), reason="matrices are interleaved only where int8 products run")
def test_a_model_whose_layers_mix_in_other_quantized_types_keeps_them_all_in_the_file(tmp_path):
    """Q4_0 layers whose FFN gate and up have 148 rows (not whole groups of 8 or 16 rows, no integer product here):
    nothing is interleaved (integer and float products mixed moved the logits further from llama.cpp's than
    either alone)."""
    path = write_llama(tmp_path / "mix.gguf", n_embd=256, n_ff=148, qtype=GGMLQuantizationType.Q4_0)
    w = load_weights(GGUFFile.open(path), init_by_name("CPU"))
    assert {t.buffer.buft.name for t in w.tensors.values()} == {"CPU_Mapped"}


@pytest.mark.skipif(not has_int8_products(), reason="matrices are interleaved only where int8 products run")
def test_a_q4_k_m_mix_is_interleaved_whole(tmp_path, monkeypatch):
    """llama.cpp's Q4_K_M mix (Q6_K for attn_v, ffn_down and the output head, Q4_K elsewhere): every layer
    matrix has an integer product, so all go to CPU_INTERLEAVED in the file's bytes; without VNNI, none."""
    qtypes = {"attn_v": GGMLQuantizationType.Q6_K, "ffn_down": GGMLQuantizationType.Q6_K,
              "output": GGMLQuantizationType.Q6_K, "*": GGMLQuantizationType.Q4_K}
    path = write_llama(tmp_path / "q4_k_m.gguf", n_embd=256, n_ff=512, qtype=qtypes)
    w = load_weights(GGUFFile.open(path), init_by_name("CPU"))
    placed = {name: (t.type.name, t.buffer.buft.name) for name, t in w.tensors.items()}
    assert placed["blk.0.attn_q.weight"] == ("Q4_K", "CPU_INTERLEAVED")
    assert placed["blk.1.ffn_down.weight"] == placed["output.weight"] == ("Q6_K", "CPU_INTERLEAVED")
    assert placed["token_embd.weight"][1] == "CPU_Mapped" and w.nbytes == w.file_tensor_bytes
    model = load_model(path, n_ctx=64)
    assert np.isfinite(model.decode(model.tokenize("hello world"))).all()
    monkeypatch.setattr("pyggml.backend.cpu.interleave.has_int8_products", lambda: False)
    w = load_weights(GGUFFile.open(path), init_by_name("CPU"))
    assert {t.buffer.buft.name for t in w.tensors.values()} == {"CPU_Mapped"}


@pytest.mark.skipif(not has_int8_products(), reason="matrices are interleaved only where int8 products run")
def test_a_tied_embedding_goes_with_the_layers_and_its_rows_still_read(tmp_path, monkeypatch):
    """Llama 3.2 1B's Q4_K_M (tied): the Q6_K token embedding is the output head too, so it is interleaved with
    the layers (its rows then read back by GET_ROWS); the logits match those with the embedding left in the file
    (its head then a float product: within the activations' Q8_K rounding)."""
    path = write_llama(tmp_path / "tied.gguf", n_embd=256, n_ff=512, tied=True, qtype=q4_k_m_mix(tied=True))
    w = load_weights(GGUFFile.open(path), init_by_name("CPU"))
    assert (w.tensors["token_embd.weight"].type.name, w.tensors["token_embd.weight"].buffer.buft.name) == \
        ("Q6_K", "CPU_INTERLEAVED") and w.nbytes == w.file_tensor_bytes
    ids = load_model(path, n_ctx=64).tokenize("hello world")
    logits = load_model(path, n_ctx=64).decode(ids)
    monkeypatch.setattr("pyggml.models.gguf.gguf_loader.OUTPUT", "token_embd.weight")  # as if untied: left in the file
    assert load_weights(GGUFFile.open(path), init_by_name("CPU")).tensors["token_embd.weight"].buffer.buft.name \
        == "CPU_Mapped"
    in_file = load_model(path, n_ctx=64).decode(ids)
    assert np.abs(logits - in_file).max() < 5e-2 * np.abs(in_file).max()


@pytest.mark.skipif(not has_int8_products(), reason="matrices are interleaved only where int8 products run")
def test_the_low_bit_k_quant_and_iq4_mixes_are_interleaved_whole(tmp_path):
    """Q2_K, Q3_K (the Q2_K and Q3_K_* mixes), IQ4_NL and IQ4_XS have integer products too: a file mixing them
    with Q4_K .. Q6_K goes wholly to CPU_INTERLEAVED, and decodes."""
    qtypes = {"attn_q": GGMLQuantizationType.Q2_K, "attn_k": GGMLQuantizationType.Q3_K,
              "ffn_up": GGMLQuantizationType.IQ4_XS, "ffn_gate": GGMLQuantizationType.IQ4_NL,
              "ffn_down": GGMLQuantizationType.Q6_K, "attn_output": GGMLQuantizationType.Q5_K,
              "*": GGMLQuantizationType.Q4_K}
    path = write_llama(tmp_path / "k_mix.gguf", n_embd=256, n_ff=512, qtype=qtypes)
    w = load_weights(GGUFFile.open(path), init_by_name("CPU"))
    layers = {t.type.name: t.buffer.buft.name for name, t in w.tensors.items() if name.startswith("blk.")
              and name.endswith("attn_q.weight") or "ffn" in name and t.ne[1] > 1}
    assert set(layers) >= {"Q2_K", "IQ4_XS", "IQ4_NL", "Q6_K"} and set(layers.values()) == {"CPU_INTERLEAVED"}
    assert w.tensors["blk.0.attn_k.weight"].buffer.buft.name == "CPU_INTERLEAVED"
    model = load_model(path, n_ctx=64)
    assert np.isfinite(model.decode(model.tokenize("hello world"))).all()


@pytest.mark.skipif(not has_int8_products(), reason="matrices are interleaved only where int8 products run")
def test_expert_stacks_are_interleaved_with_the_layers(tmp_path, monkeypatch):
    """gpt-oss's MXFP4 experts (3-D stacks) go to CPU_INTERLEAVED with the Q8_0 layers, in the file's bytes, and
    mul_mat_id multiplies them in int8: the logits stay within the activations' Q8_0 rounding of the float
    products on the file's blocks."""
    path = write_gpt_oss(tmp_path / "oss.gguf", seed=3,
                         qtype={"_exps": GGMLQuantizationType.MXFP4, "ffn_gate_inp": None,
                                "*": GGMLQuantizationType.Q8_0})
    w = load_weights(GGUFFile.open(path), init_by_name("CPU"))
    experts = [t for name, t in w.tensors.items() if name.endswith("_exps.weight")]
    assert len(experts) == 12 and {(t.type.name, t.buffer.buft.name) for t in experts} == {("MXFP4", "CPU_INTERLEAVED")}
    assert w.nbytes == w.file_tensor_bytes
    tokens = list(range(3, 40))
    logits = load_model(path, n_ctx=64).decode(tokens, all_logits=True)
    monkeypatch.setattr("pyggml.backend.cpu.interleave.has_int8_products", lambda: False)
    floats = load_model(path, n_ctx=64).decode(tokens, all_logits=True)
    assert np.abs(logits - floats).max() < 5e-2 * np.abs(floats).max()
