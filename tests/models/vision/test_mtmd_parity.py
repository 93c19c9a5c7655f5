"""pyggml's image prompts against llama.cpp's mtmd on random-weight model + mmproj pairs (cases.py): the same
layout of text tokens and image embeddings, the embeddings within 1e-5 relative error (F32 weights; Qwen2.5-VL's
and idefics3's without preproc_image_size 1e-4, see cases.py) and the text after the image with a teacher-forced
mean KLD <= 1e-6 (for Qwen2.5-VL's language model at M-RoPE positions: the image's rows at its row and column, the
text after it max(nx, ny) on).

CI compares with the committed outputs (data/mtmd_refs.npz, written by data/make_mtmd_refs.py); the `peer` test
runs llama-cpp-python's mtmd live.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from pyggml.models import load_model
from pyggml.models.llm.model import attach_vision
from pyggml.models.vision.prompt import Prompt
from pyggml.testing.agreement import agreement

from tests.models.vision.cases import CASES, N_CTX, TEXT, sha256

pytest.importorskip("PIL", reason="images need Pillow (the vision extra)")

DATA = Path(__file__).parent / "data"
KLD_BOUND = 1e-6


def pyggml_outputs(case, folder) -> dict:
    """The same three things mtmd_reference gives, from pyggml."""
    lm, mmproj = case.write(folder)
    model = load_model(lm, n_ctx=N_CTX, n_batch=N_CTX, kv_type="F32", weights="f32")
    model.vision = attach_vision(model, mmproj, model.backend, flash_attn=False)  # as the references ran
    prompt = model.image_prompt(TEXT, [case.image()])
    layout = [t for c in prompt.chunks for t in (c if isinstance(c, list) else [-1] * len(c))]
    *before, last = prompt.chunks
    model.decode_prompt(Prompt(before))
    return {"layout": np.asarray(layout), "embeddings": np.concatenate([c for c in before if not isinstance(c, list)]),
            "logits": model.decode(last, all_logits=True), "files": (lm, mmproj)}


def check(case, ref: dict, got: dict) -> None:
    assert got["layout"].tolist() == ref["layout"].tolist(), f"{case.name}: tokens around the image differ"
    err = np.abs(got["embeddings"] - ref["embeddings"]).max() / np.abs(ref["embeddings"]).max()
    assert err <= case.embd_rtol, f"{case.name}: image embeddings off by {err:.2e} (relative)"
    kld = agreement(ref["logits"], got["logits"])["kld_mean"]
    assert kld <= KLD_BOUND, f"{case.name}: mean KLD {kld:.3e} after the image"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_image_prompt_agrees_with_committed_mtmd_outputs(tmp_path, case):
    summary = json.loads((DATA / "mtmd_refs.json").read_text())[case.name]
    with np.load(DATA / "mtmd_refs.npz") as f:
        ref = {key: f[f"{case.name}/{key}"] for key in ("layout", "embeddings", "logits")}
    got = pyggml_outputs(case, tmp_path)
    lm, mmproj = got["files"]
    assert (sha256(lm), sha256(mmproj)) == (summary["lm_sha256"], summary["mmproj_sha256"]), (
        f"{case.name}: the files differ from those llama.cpp ran on; rerun data/make_mtmd_refs.py")
    check(case, ref, got)


@pytest.mark.peer
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_image_prompt_agrees_with_live_mtmd(tmp_path, case):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from pyggml.testing.mtmd import mtmd_reference

    got = pyggml_outputs(case, tmp_path)
    check(case, mtmd_reference(*got["files"], TEXT, [case.image()], n_ctx=N_CTX), got)
