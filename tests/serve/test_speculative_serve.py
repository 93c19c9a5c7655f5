"""`pyggml serve` with prompt lookup: greedy responses as without it, llama-server's timings.draft_n and
draft_n_accepted in the response, the acceptance counters in /metrics; the CLI flags reach the engine."""

import json

import httpx
import pytest

from pyggml.cli.main import build_parser
from pyggml.cli.speculative import open_drafter
from pyggml.models.llm.speculative import NgramDrafter, SpecParams
from pyggml.serve.app import create_app
from tests.support.serve import ServerThread, make_state

PROMPT = "a b c d e f a b c d e f a b c d e f a b c"


@pytest.fixture(scope="module")
def servers(model_path):
    plain, spec = make_state(model_path), make_state(model_path, drafter=NgramDrafter(SpecParams(n_max=6)))
    with ServerThread(create_app(plain)) as a, ServerThread(create_app(spec)) as b:
        yield a, b


def _complete(server, **kw):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, **kw}
    return httpx.post(server.base_url + "/v1/completions", json=body, timeout=120).json()


def test_greedy_response_is_the_same_and_reports_drafts(servers):
    plain, spec = servers
    a, b = _complete(plain), _complete(spec)
    assert b["choices"][0]["text"] == a["choices"][0]["text"]
    assert b["usage"]["completion_tokens"] == a["usage"]["completion_tokens"]
    assert "draft_n" not in a["timings"]  # llama-server reports drafts only where something was drafted
    timings = b["timings"]
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"] and timings["draft_n"] > 0
    metrics = httpx.get(spec.base_url + "/metrics").text
    counters = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
                if line.startswith("llamacpp:n_draft")}
    assert counters["llamacpp:n_draft_total"] >= timings["draft_n"]
    assert counters["llamacpp:n_draft_accepted_total"] >= timings["draft_n_accepted"]


def test_stream_ends_with_the_draft_timings(servers):
    plain, spec = servers
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stream": True}
    with httpx.stream("POST", spec.base_url + "/v1/completions", json=body, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    assert text == _complete(plain)["choices"][0]["text"]
    assert events[-1]["choices"][0]["finish_reason"] and events[-1]["timings"]["draft_n"] > 0
    assert all("timings" not in e for e in events[:-1])


def test_cli_flags_make_the_drafter(model_path):
    parser = build_parser()
    args = parser.parse_args(["serve", "--spec-type", "ngram", "--draft-max", "5", "--draft-min", "2"])
    drafter = open_drafter(args, None, 4)
    assert isinstance(drafter, NgramDrafter) and (drafter.params.n_max, drafter.params.n_min) == (5, 2)
    assert open_drafter(parser.parse_args(["serve"]), None, 4) is None
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--draft-max", "0"])
