"""pyggml's image prompts against llama.cpp's mtmd on random-weight model + mmproj pairs (cases.py): the same
layout of text tokens and image embeddings, the embeddings within 1e-5 relative error (F32 weights; idefics3's
without preproc_image_size 1e-4, see cases.py) and the text after the image with a teacher-forced
mean KLD <= 1e-6 (for Qwen2.5-VL's language model at M-RoPE positions: the image's rows at its row and column, the
text after it max(nx, ny) on).

What the looser bound allows is the F16-table GELU's steps alone: given llama.cpp's GELU inputs (committed with its
outputs), every case's embeddings agree within 1e-6.

CI compares with the committed outputs (data/mtmd_refs.npz, written by data/make_mtmd_refs.py); the `peer` test
runs llama-cpp-python's mtmd live.
"""

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from pyggml.backend import tensor_get, tensor_set
from pyggml.core import Context, GGMLType, Graph
from pyggml.core.tensor import Op, UnaryOp
from pyggml.models import load_model
from pyggml.models.llm.model import attach_vision
from pyggml.models.vision.encoder import GRAPH_SIZE, VisionEncoder
from pyggml.models.vision.preprocess import decode_image, preprocess
from pyggml.models.vision.prompt import Prompt
from pyggml.sched import Scheduler
from pyggml.testing.agreement import agreement

from tests.models.vision.cases import CASES, N_CTX, TEXT, sha256

pytest.importorskip("PIL", reason="images need Pillow (the vision extra)")

DATA = Path(__file__).parent / "data"
KLD_BOUND = 1e-6
GIVEN_GELU_INPUTS_RTOL = 1e-6  # measured 1.3e-7 to 3.9e-7
GELU_TABLE_RANGE = 10.0  # ggml_vec_gelu_f32 reads its table for -10 < x < 10 only


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
    # In a process of its own: once an earlier test has loaded ggml-python's libggml (the RPC tests' peer) into this
    # one, llama.cpp's mtmd ran on that ggml's symbols and its embeddings moved by 2e-4 to 5e-4.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as apart:
        reference = apart.submit(mtmd_reference, *got["files"], TEXT, [case.image()], n_ctx=N_CTX).result()
    check(case, reference, got)


def encode_given_gelu_inputs(encoder: VisionEncoder, pixels: np.ndarray, gelu_inputs: np.ndarray) -> np.ndarray:
    """encoder.encode(pixels), except that where a GELU reads its table, it reads it at llama.cpp's input (F16 bits,
    one row per GELU in graph order): computed through a Scheduler whose eval callback overwrites each GELU's
    input once computed, as llama.cpp's cb_eval could."""
    height, width = pixels.shape[1:]
    ctx = Context(no_alloc=True)
    inp = ctx.new_tensor_4d(GGMLType.F32, width, height, 3, 1, "inp_raw").set_input()
    out = encoder.model.build(ctx, inp).set_output()
    graph = Graph(GRAPH_SIZE).build_forward_expand(out)
    gelus = [t for t in graph.nodes if t.op == Op.UNARY and t.unary_op == UnaryOp.GELU]
    assert len(gelus) == len(gelu_inputs), "llama.cpp's encoder ran another number of GELUs"
    theirs = {id(t.src[0]): row.view(np.float16).astype(np.float32) for t, row in zip(gelus, gelu_inputs, strict=True)}

    def callback(t, ask: bool) -> bool:
        if ask:
            return id(t) in theirs
        mine = np.asarray(tensor_get(t), np.float32)
        given = theirs[id(t)].reshape(mine.shape)
        tensor_set(t, np.where(np.abs(mine) < GELU_TABLE_RANGE, given, mine))
        return True

    sched = Scheduler([encoder.backend], graph_size=GRAPH_SIZE)
    sched.set_eval_callback(callback)
    assert sched.alloc_graph(graph)
    tensor_set(inp, np.ascontiguousarray(pixels, dtype=np.float32))
    if encoder.dynamic_size:
        for tensor, values in encoder.model.input_values(width, height).items():
            tensor_set(tensor, values)
    sched.graph_compute(graph)
    return np.asarray(tensor_get(out), np.float32).reshape(-1, encoder.n_embd_out)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_embeddings_agree_within_1e6_given_llamacpps_gelu_inputs(tmp_path, case):
    """The only difference above float32 rounding is the GELU table's: given llama.cpp's GELU inputs, each run
    of the encoder (idefics3's tiles and whole image) agrees within 1e-6 of the largest embedding."""
    _, mmproj = case.write(tmp_path)
    encoder = VisionEncoder(mmproj, weights="f32", flash_attn=False)
    tiles = preprocess(decode_image(case.image()), encoder.hparams)
    pixels = tiles.tiles + ([tiles.overview] if tiles.overview is not None else [])
    with np.load(DATA / "mtmd_refs.npz") as f:
        ref = f[f"{case.name}/embeddings"]
        runs = [f[f"{case.name}/gelu_inputs/{i}"] for i in range(len(pixels))]
    got = np.concatenate([encode_given_gelu_inputs(encoder, p, run) for p, run in zip(pixels, runs, strict=True)])
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= GIVEN_GELU_INPUTS_RTOL, f"{case.name}: embeddings off by {err:.2e} given llama.cpp's GELU inputs"
