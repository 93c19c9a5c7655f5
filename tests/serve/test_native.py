"""llama-server's own endpoints on `pyggml serve`: /completion (whole and streamed), /infill (prompt tokens as
llama-server builds them), /apply-template, /props, /slots with save / restore / erase, /tokenize with pieces,
CORS as llama-server's default; and the KV cells of a slot written to a file and read back giving the same
logits bit for bit."""

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from pyggml.models import load_model
from pyggml.models.llm.batch import Batch
from pyggml.models.llm.kv_cache import CellData
from pyggml.serve.app import create_app
from pyggml.serve.infill import infill_prompt
from pyggml.serve.native import slot_file
from pyggml.serve.protocol import APIError
from pyggml.serve.state import Limits
from tests.serve.infill_cases import CASES
from tests.support.serve import ServerThread, make_state, write_infill_model

REFERENCE = Path(__file__).with_name("data") / "infill_reference.json"


def _post(server, path, body=None, **kw):
    return httpx.post(server.base_url + path, json=body, timeout=60, **kw)


@pytest.fixture(scope="module")
def fim_path(tmp_path_factory):
    return write_infill_model(tmp_path_factory.mktemp("fim") / "fim.gguf")


@pytest.fixture(scope="module")
def fim_server(fim_path, tmp_path_factory):
    saves = tmp_path_factory.mktemp("slots")
    state = make_state(fim_path, Limits(parallel=2, slot_save_path=str(saves)), n_ctx=512)
    with ServerThread(create_app(state)) as srv:
        srv.state, srv.saves = state, saves
        yield srv


# ----- /completion ------------------------------------------------------------------------------------
def test_completion_has_llama_servers_shape_and_the_openai_paths_text(server):
    body = {"prompt": "the sea", "n_predict": 5, "temperature": 0, "ignore_eos": True, "n_probs": 3,
            "return_tokens": True}
    r = _post(server, "/completion", body).json()
    assert r["stop"] is True and r["stop_type"] == "limit" and r["tokens_predicted"] == 5
    assert len(r["tokens"]) == 5 and r["tokens_evaluated"] == r["timings"]["prompt_n"] + r["timings"]["cache_n"]
    assert r["generation_settings"]["n_predict"] == 5 and r["generation_settings"]["temperature"] == 0
    assert r["id_slot"] in range(4) and r["model"] == "tiny" and r["prompt"].endswith("the sea")
    probs = r["completion_probabilities"]
    assert [p["id"] for p in probs] == r["tokens"] and all(len(p["top_logprobs"]) == 3 for p in probs)
    assert all(p["logprob"] <= 0 and p["top_logprobs"][0]["logprob"] >= p["logprob"] for p in probs)
    oai = _post(server, "/v1/completions", {"prompt": "the sea", "max_tokens": 5, "temperature": 0,
                                            "ignore_eos": True}).json()
    assert oai["choices"][0]["text"] == r["content"]


def test_completion_token_prompt_stop_word_and_several_prompts(server):
    ids = _post(server, "/tokenize", {"content": "the sea", "add_special": True}).json()["tokens"]
    by_ids = _post(server, "/completion", {"prompt": ids, "n_predict": 4, "temperature": 0}).json()
    by_text = _post(server, "/completion", {"prompt": "the sea", "n_predict": 4, "temperature": 0}).json()
    assert by_ids["content"] == by_text["content"]
    word = by_text["content"][1:3]
    if word.strip():
        stopped = _post(server, "/completion", {"prompt": "the sea", "n_predict": 4, "temperature": 0,
                                                "stop": [word]}).json()
        assert stopped["stop_type"] == "word" and stopped["stopping_word"] == word
    several = _post(server, "/completion", {"prompt": ["a", "b"], "n_predict": 2}).json()
    assert isinstance(several, list) and [x["index"] for x in several] == [0, 1]


def test_completion_stream_sends_results_then_a_final_one_without_done(server):
    body = {"prompt": "the sea", "n_predict": 4, "temperature": 0, "ignore_eos": True, "stream": True}
    whole = _post(server, "/completion", {**body, "stream": False}).json()
    with httpx.stream("POST", server.base_url + "/completion", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    events = [json.loads(line[6:]) for line in lines]
    assert all(line.startswith("data: {") for line in lines)  # no [DONE] on llama-server's own path
    assert [e["stop"] for e in events] == [False] * 4 + [True]
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["timings"]["predicted_n"] == 4 and "timings" not in events[0]


def test_timings_and_fingerprint_in_openai_responses(server):
    r = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    body = r.json()
    assert body["system_fingerprint"].startswith("pyggml-") and body["timings"]["predicted_n"] >= 1
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
            "timings_per_token": True}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert "timings" not in chunks[0] and all("timings" in c for c in chunks[1:])  # not in the role chunk
    assert chunks[-1]["choices"][0]["finish_reason"]


# ----- /tokenize, /apply-template, /props, CORS ----------------------------------------------------------
def test_tokenize_with_pieces_and_detokenize(server):
    pieces = _post(server, "/tokenize", {"content": "the sea", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces).replace("▁", " ").strip() == "the sea"
    text = _post(server, "/detokenize", {"tokens": [p["id"] for p in pieces]}).json()["content"]
    assert text.strip() == "the sea"


def test_apply_template_is_the_prompt_chat_renders(server, model_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = _post(server, "/apply-template", {"messages": messages}).json()
    assert r["prompt"] == load_model(model_path, n_ctx=64).chat_prompt(messages)


def test_props(server, model_path):
    r = httpx.get(server.base_url + "/props").json()
    assert r["total_slots"] == 4 and r["model_path"] == str(model_path)
    assert r["modalities"] == {"vision": False, "audio": False, "video": False}
    assert r["default_generation_settings"]["params"]["temperature"] == 0.8 and r["chat_template"]
    assert r["build_info"].startswith("pyggml-") and r["bos_token"] == "<bos>"
    assert _post(server, "/props", {}).json() == {"success": True}


def test_cors_by_default_echoes_any_origin_as_llama_server(server):
    r = httpx.options(server.base_url + "/completion", headers={
        "Origin": "http://example.test", "Access-Control-Request-Method": "POST"})
    assert r.headers["access-control-allow-origin"] == "http://example.test"
    assert r.headers["access-control-allow-credentials"] == "true"


def test_cors_origin_restricts(model_path):
    with ServerThread(create_app(make_state(model_path, Limits(parallel=1)), cors_origins=["http://ok.test"])) as s:
        good = httpx.get(s.base_url + "/health", headers={"Origin": "http://ok.test"})
        bad = httpx.get(s.base_url + "/health", headers={"Origin": "http://evil.test"})
    assert good.headers["access-control-allow-origin"] == "http://ok.test"
    assert "access-control-allow-origin" not in bad.headers


# ----- /infill -------------------------------------------------------------------------------------------
def test_infill_is_refused_by_a_model_without_fim_tokens(server):
    r = _post(server, "/infill", {"input_prefix": "def f(", "input_suffix": ")"})
    assert r.status_code == 501 and "Infill is not supported" in r.json()["error"]["message"]


@pytest.mark.skipif(not REFERENCE.exists(), reason="no llama.cpp reference (tests/serve/data/make_infill_reference.py)")
def test_infill_prompt_matches_llama_servers_token_for_token(fim_path):
    tokenizer = load_model(fim_path, n_ctx=64).tokenizer
    cases = json.loads(REFERENCE.read_text())["cases"]
    assert [{k: v for k, v in c.items() if k != "tokens"} for c in cases] == CASES
    for case in cases:
        prompt = tokenizer.encode(case["prompt"], add_special=False, parse_special=True)
        ours = infill_prompt(tokenizer, case["prefix"], case["suffix"], [tuple(x) for x in case["extra"]], prompt,
                             case["n_batch"], case["n_ctx"], case["n_predict"], case["spm"])
        assert ours == case["tokens"]


def test_infill_endpoint(fim_server):
    body = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n",
            "input_extra": [{"filename": "x.py", "text": "x = 1\n"}], "n_predict": 3, "temperature": 0}
    r = _post(fim_server, "/infill", body).json()
    model = fim_server.state.loaded.model
    expected = infill_prompt(model.tokenizer, body["input_prefix"], body["input_suffix"], [("x.py", "x = 1\n")], [],
                             model.n_batch, model.n_ctx // 2)
    assert r["tokens_evaluated"] == len(expected) and r["tokens_predicted"] >= 1
    bad = _post(fim_server, "/infill", {"input_prefix": "a", "input_suffix": "b", "input_extra": [{"name": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input_extra[0].text"


# ----- /slots --------------------------------------------------------------------------------------------
def test_slots_list_and_actions_need_a_save_path(server):
    slots = httpx.get(server.base_url + "/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3] and not any(s["is_processing"] for s in slots)
    r = _post(server, "/slots/0?action=save", {"filename": "a.bin"})
    assert r.status_code == 501


def test_slot_save_restore_erase(fim_server):
    prompt = "the sea was calm and the boats came home one by one"
    first = _post(fim_server, "/completion", {"prompt": prompt, "id_slot": 1, "n_predict": 4, "temperature": 0})
    assert first.json()["id_slot"] == 1
    saved = _post(fim_server, "/slots/1?action=save", {"filename": "one.bin"}).json()
    assert saved["n_saved"] > first.json()["tokens_evaluated"] and (fim_server.saves / "one.bin").is_file()
    assert _post(fim_server, "/slots/1?action=erase").json()["n_erased"] == saved["n_saved"]
    restored = _post(fim_server, "/slots/0?action=restore", {"filename": "one.bin"}).json()
    assert restored["n_restored"] == saved["n_saved"]
    again = _post(fim_server, "/completion", {"prompt": prompt, "id_slot": 0, "n_predict": 4, "temperature": 0})
    assert again.json()["content"] == first.json()["content"]
    assert again.json()["timings"]["cache_n"] == first.json()["tokens_evaluated"] - 1  # read from the file
    for name in ("../x.bin", ".hidden", "a/b", ""):
        r = _post(fim_server, "/slots/0?action=save", {"filename": name})
        assert r.status_code == 400 and r.json()["error"]["param"] == "filename"
    assert _post(fim_server, "/slots/0?action=restore", {"filename": "none.bin"}).status_code == 404
    for junk in (b"not a slot file", b"PK\x03\x04 broken zip"):
        (fim_server.saves / "junk.bin").write_bytes(junk)
        r = _post(fim_server, "/slots/0?action=restore", {"filename": "junk.bin"})
        assert r.status_code == 400 and "slot action failed" in r.json()["error"]["message"]
    assert _post(fim_server, "/slots/0?action=fly", {"filename": "a.bin"}).status_code == 400
    assert _post(fim_server, "/slots/9?action=erase").status_code == 400


def test_slot_file_refuses_every_way_out(tmp_path):
    assert slot_file(str(tmp_path), "ok.bin") == tmp_path.resolve() / "ok.bin"
    for name in ("..", "../a", "/etc/passwd", "a\\b", "a\x00b", "c:x", "."):
        with pytest.raises(APIError):
            slot_file(str(tmp_path), name)


def test_saved_cells_give_the_same_continuation_logits(fim_path, tmp_path):
    """A sequence's cells written to a file and read back into an empty cache: the next tokens' logits are
    bit for bit those of the sequence never saved."""
    model = load_model(fim_path, n_ctx=256)
    prompt, more = model.tokenize("the sea was calm and the boats"), model.tokenize(" came home", add_special=False)
    model.decode(prompt)
    positions, data = model.seq_read(0)
    data.save(tmp_path / "s.npz", positions=positions)
    expected = model.decode_batch(Batch.sequence(more, len(prompt), 0, True))
    model.reset()
    model.decode(model.tokenize("something else entirely, longer than before"))  # other values in the cells
    model.reset()
    loaded, arrays = CellData.load(tmp_path / "s.npz")
    model.seq_write(0, arrays["positions"], loaded)
    got = model.decode_batch(Batch.sequence(more, len(prompt), 0, True))
    assert np.array_equal(got, expected)
