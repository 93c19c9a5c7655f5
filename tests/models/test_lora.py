"""LoRA adapters (pyggml.models.llm.lora): a model with an adapter of scale s gives the logits of the model whose
matrices are W + s·alpha/rank·B·A (the adapter merged into the weights, as llama.cpp's export-lora merges it);
scales change without reloading; adapters llama.cpp refuses are refused, naming what is wrong. The agreement
with llama.cpp's own logits for the same adapter is in test_llamacpp_parity.py."""

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from pyggml.errors import GGUFError, ParameterError
from pyggml.models import load_model
from pyggml.testing.agreement import F32_BOUND, agreement, within_yardstick
from pyggml.testing.synthetic import write_f32_copy, write_llama, write_lora, write_starcoder2

from tests.support.gguf_rewrite import rewrite
from tests.support.lora_cases import LORA_CASES
from tests.support.parity_cases import sha256

TOKENS = [1, 5, 9, 14, 3, 22, 7]


def _merged(base, adapter, dst, scale):
    """base with every adapted matrix W replaced by W + scale·alpha/rank·B·A (NumPy, float64; alpha 0: scale·B·A)."""
    reader = GGUFReader(str(adapter))
    alpha = float(reader.fields["adapter.lora.alpha"].contents())
    lora = {t.name: np.array(t.data, np.float64) for t in reader.tensors}

    def merge(tensors):
        out = dict(tensors)
        for name in {n.rsplit(".", 1)[0] for n in lora}:
            a, b = lora[name + ".lora_a"], lora[name + ".lora_b"]
            factor = scale * alpha / a.shape[0] if alpha else scale   # alpha 0: the scale alone
            out[name] = (tensors[name] + factor * (b @ a)).astype(np.float32)
        return out

    return rewrite(base, dst, merge)


@pytest.fixture
def files(tmp_path):
    base = write_llama(tmp_path / "base.gguf", "llama", n_vocab=64, n_embd=64, n_head=4, n_head_kv=2)
    return base, write_lora(tmp_path / "lora.gguf", base, rank=4, alpha=8.0, seed=3), tmp_path


def _logits(path, **kw):
    return load_model(path, n_ctx=16, n_batch=4, kv_type="F32", **kw).decode(TOKENS, all_logits=True)


def test_an_adapter_gives_the_logits_of_its_merged_weights(files):
    base, adapter, tmp = files
    got = _logits(base, lora=[(adapter, 0.7)])
    expected = _logits(_merged(base, adapter, tmp / "merged.gguf", 0.7))
    plain = _logits(base)
    assert np.abs(got - plain).max() > 0.1            # the adapter moves the logits
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_scales_change_without_reloading(files):
    base, adapter, tmp = files
    model = load_model(base, n_ctx=16, n_batch=4, kv_type="F32", lora=[adapter])
    assert model.loras.describe() == [{"id": 0, "path": str(adapter), "scale": 1.0}]
    for scale in (1.0, 0.0, -0.5):
        model.set_lora_scales({0: scale})
        model.reset()
        got = model.decode(TOKENS, all_logits=True)
        expected = _logits(base) if scale == 0 else _logits(_merged(base, adapter, tmp / f"m{scale}.gguf", scale))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_two_adapters_add_up(files):
    base, adapter, tmp = files
    second = write_lora(tmp / "second.gguf", base, rank=2, alpha=0.0, targets=("ffn_down", "attn_v"), seed=9)
    got = _logits(base, lora=[(adapter, 0.5), (second, 2.0)])
    merged = _merged(_merged(base, adapter, tmp / "m1.gguf", 0.5), second, tmp / "m2.gguf", 2.0)
    np.testing.assert_allclose(got, _logits(merged), rtol=0, atol=1e-4 * np.abs(got).max())


def test_every_projection_of_a_fused_qkv_architecture_is_adapted(tmp_path):
    base = write_starcoder2(tmp_path / "sc2.gguf", fused_qkv=True, tied=False)
    adapter = write_lora(tmp_path / "lora.gguf", base, targets=("attn_qkv", "attn_output", "ffn_up", "ffn_down",
                                                                  "output"))
    got = _logits(base, lora=[(adapter, 1.0)])
    np.testing.assert_allclose(got, _logits(_merged(base, adapter, tmp_path / "m.gguf", 1.0)), rtol=0,
                               atol=1e-4 * np.abs(got).max())


@pytest.mark.parametrize("change, message", [
    (lambda t: {k: v for k, v in t.items() if k != "blk.0.attn_q.weight.lora_b"}, "missing one component"),
    (lambda t: {**t, "blk.9.attn_q.weight.lora_a": t["blk.0.attn_q.weight.lora_a"],
                "blk.9.attn_q.weight.lora_b": t["blk.0.attn_q.weight.lora_b"]}, "does not exist in the base model"),
    (lambda t: {**t, "blk.0.attn_q.weight.lora_b": t["blk.0.attn_k.weight.lora_b"]}, "do not fit"),
    (lambda t: {**t, "blk.0.attn_q.weight.extra": t["blk.0.attn_q.weight.lora_a"]}, "unexpected suffix"),
    (lambda t: {**t, "token_embd.weight.lora_a": np.zeros((2, 64), np.float32),
                "token_embd.weight.lora_b": np.zeros((64, 2), np.float32)}, "'token_embd.weight' is not supported"),
])
def test_adapters_llamacpp_refuses_are_refused(files, change, message):
    base, adapter, tmp = files
    bad = rewrite(adapter, tmp / "bad.gguf", change)
    with pytest.raises(GGUFError, match=message):
        load_model(base, lora=[bad])


def test_an_adapter_for_another_architecture_or_not_an_adapter_is_refused(files):
    base, adapter, tmp = files
    other = write_starcoder2(tmp / "sc2.gguf")
    with pytest.raises(GGUFError, match="for 'llama', but the model is 'starcoder2'"):
        load_model(other, lora=[adapter])
    with pytest.raises(GGUFError, match="'general.type' is None; a LoRA adapter has 'adapter'"):
        load_model(base, lora=[base])


def test_bad_scales_and_ids_are_refused(files):
    base, adapter, _ = files
    with pytest.raises(ParameterError, match="must be a number"):
        load_model(base, lora=[(adapter, "x")])
    model = load_model(base, n_ctx=16, lora=[adapter])
    with pytest.raises(ParameterError, match="lora id 3 is not one of the 1 loaded adapters"):
        model.set_lora_scales({3: 1.0})


LORA_DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("case", LORA_CASES, ids=[c.name for c in LORA_CASES])
def test_adapters_give_llamacpps_logits(tmp_path, case):
    """llama.cpp's logits with the same random-weight adapter at the same scale (committed): mean KLD <= 1e-6 for
    an F32 adapter; an F16 one within llama.cpp's own distance from its F32 copy (the yardstick, 2.2e-6 here:
    ggml rounds the activations of an F16 product to F16, pyggml multiplies them in F32)."""
    summary = json.loads((LORA_DATA / "llamacpp_lora.json").read_text())["cases"][case.name]
    base, adapter = case.write(tmp_path)
    assert (sha256(base), sha256(adapter)) == (summary["base_sha256"], summary["adapter_sha256"]), (
        f"{case.name}: the files differ from those llama.cpp ran on; rerun make_llamacpp_refs.py lora")
    with np.load(LORA_DATA / "llamacpp_lora.npz") as f:
        reference = f[f"{case.name}/logits"]
    got = load_model(base, n_ctx=64, n_batch=12, kv_type="F32", lora=[(adapter, case.scale)]).decode(
        case.tokens(), all_logits=True)
    plain = agreement(reference, load_model(base, n_ctx=64, n_batch=12, kv_type="F32").decode(case.tokens(),
                                                                                               all_logits=True))
    measured = agreement(reference, got)
    assert plain["kld_mean"] > 10 * F32_BOUND   # the adapter matters (7.5e-5 for the smallest case)
    if "yardstick" not in summary:
        assert measured["kld_mean"] <= F32_BOUND
    for what, holds in within_yardstick(measured, summary["yardstick"]) if "yardstick" in summary else ():
        assert holds, f"{case.name}: {what}"


@pytest.mark.peer
@pytest.mark.parametrize("case", LORA_CASES, ids=[c.name for c in LORA_CASES])
def test_adapters_give_live_llamacpps_logits(tmp_path, case):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from pyggml.testing.llamacpp import llamacpp_logits

    base, adapter = case.write(tmp_path)
    reference = llamacpp_logits(base, case.tokens(), lora=(adapter, case.scale))
    got = agreement(reference, load_model(base, n_ctx=64, n_batch=12, kv_type="F32", lora=[(adapter, case.scale)])
                    .decode(case.tokens(), all_logits=True))
    if case.qtype is None:
        assert got["kld_mean"] <= F32_BOUND
        return
    write_f32_copy(adapter, tmp_path / "f32.gguf")
    yardstick = agreement(reference, llamacpp_logits(base, case.tokens(), lora=(tmp_path / "f32.gguf", case.scale)))
    for what, holds in within_yardstick(got, yardstick):
        assert holds, f"{case.name}: {what}"
