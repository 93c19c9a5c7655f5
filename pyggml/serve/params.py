"""The generation fields shared by /v1/chat/completions and /v1/completions, read as llama.cpp's server reads
them (its defaults where OpenAI's request leaves a field out: temperature 0.8, top_k 40, top_p 0.95,
min_p 0.05) and checked against OpenAI's ranges."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyggml.serve.protocol import APIError, Fields

MAX_N = 16            # choices per request
MAX_TOP_LOGPROBS = 20  # as OpenAI


@dataclass
class GenerationParams:
    sampling: dict                      # SamplingParams keywords
    max_tokens: int = -1                # -1: until the end of generation or a full context
    stop: list[str] = field(default_factory=list)
    n: int = 1
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    n_keep: int = 0                     # context shift: prompt tokens kept (-1: all; llama.cpp's field)


def read_generation(f: Fields, n_vocab: int, chat: bool, tokenize=None) -> GenerationParams:
    """`tokenize(text)` gives the ids of a logit_bias key written as text (llama-server's form)."""
    sampling = {
        "temperature": f.get("temperature", float, 0.8, low=0.0, high=2.0),
        "top_k": f.get("top_k", int, 40, low=0),
        "top_p": f.get("top_p", float, 0.95, low=0.0, high=1.0),
        "min_p": f.get("min_p", float, 0.05, low=0.0, high=1.0),
        "typical_p": f.get("typical_p", float, 1.0, low=0.0, high=1.0),
        "repeat_penalty": f.get("repeat_penalty", float, 1.0, low=0.0),
        "repeat_last_n": f.get("repeat_last_n", int, 64, low=-1),
        "presence_penalty": f.get("presence_penalty", float, 0.0, low=-2.0, high=2.0),
        "frequency_penalty": f.get("frequency_penalty", float, 0.0, low=-2.0, high=2.0),
        "logit_bias": read_logit_bias(f, n_vocab, tokenize),
        "seed": f.get("seed", int, None, low=0),
    }
    for name in ("repeat_penalty", "typical_p"):
        if sampling[name] == 0.0:
            raise APIError(f"'{name}' must be > 0 (1.0 disables it)", param=name)
    max_name = "max_completion_tokens" if chat and f.has("max_completion_tokens") else "max_tokens"
    max_tokens = f.get(max_name, int, None, low=1)
    if f.has("n_predict") and max_tokens is None:  # llama.cpp's own name
        max_tokens = f.get("n_predict", int, -1, low=-1)
    stop = f.get("stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) and s for s in stop):
        raise APIError("'stop' must be a string or an array of non-empty strings", param="stop")
    if chat:
        logprobs = f.get("logprobs", bool, False)
        top = f.get("top_logprobs", int, 0, low=0, high=MAX_TOP_LOGPROBS)
        if top and not logprobs:
            raise APIError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    else:  # the legacy completions API: logprobs is the number of top alternatives
        top = f.get("logprobs", int, None, low=0, high=MAX_TOP_LOGPROBS)
        logprobs, top = top is not None, top or 0
    options = f.obj("stream_options")
    stream = f.get("stream", bool, False)
    include_usage = options.get("include_usage", bool, False) if options else False
    if options and not stream:
        raise APIError("'stream_options' is only allowed with 'stream': true", param="stream_options")
    return GenerationParams(sampling, -1 if max_tokens is None else max_tokens, stop,
                            n=f.get("n", int, 1, low=1, high=MAX_N), ignore_eos=f.get("ignore_eos", bool, False),
                            logprobs=logprobs, top_logprobs=top, stream=stream, include_usage=include_usage,
                            n_keep=f.get("n_keep", int, 0, low=-1))


def read_logit_bias(f: Fields, n_vocab: int, tokenize=None) -> dict[int, float]:
    """OpenAI's {"token id": bias in [-100, 100]} or llama.cpp's [[id, bias], ...]; false bans the token. With
    `tokenize`, a key that is text and no id biases each of its tokens (llama-server's [["text", bias]])."""
    raw = f.get("logit_bias", (dict, list), {})
    pairs = raw.items() if isinstance(raw, dict) else raw
    out = {}
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise APIError("'logit_bias' entries must be [token id, bias] pairs", param="logit_bias")
        key, bias = pair
        try:
            tokens = [int(key)]
        except (TypeError, ValueError):
            if not (isinstance(key, str) and tokenize is not None):
                raise APIError(f"'logit_bias' key {key!r} is not a token id", param="logit_bias") from None
            tokens = tokenize(key)
        if not all(0 <= token < n_vocab for token in tokens):
            raise APIError(f"'logit_bias' token id {key} is outside the vocabulary of {n_vocab}", param="logit_bias")
        if bias is False:
            bias = float("-inf")
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise APIError(f"'logit_bias' value for {key} must be a number in [-100, 100], got {bias!r}",
                           param="logit_bias")
        out.update((token, float(bias)) for token in tokens)
    return out
