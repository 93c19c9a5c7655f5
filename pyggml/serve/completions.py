"""/v1/chat/completions and /v1/completions: a checked request becomes one engine sequence per prompt and
choice (each with its own constraint), whose events are gathered into OpenAI's response or streamed as
OpenAI's chunks over SSE. Every admitted request is released exactly once, whatever ends it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import weakref
from dataclasses import dataclass, field

from pyggml import __version__
from pyggml.errors import GGUFError, ImageError, ParameterError
from pyggml.models.llm.engine import Done, Request
from pyggml.models.llm.generate import SamplingParams
from pyggml.models.vision.content import has_image_parts, split_image_parts
from pyggml.serve.access_log import count_tokens
from pyggml.serve.params import MAX_N, GenerationParams, read_generation
from pyggml.serve.protocol import APIError, Fields, error_body
from pyggml.serve.state import ServerState, run_blocking
from pyggml.serve.tool_calls import ToolCallStream, ToolSpec, parse_tool_calls, read_tools, tool_call_start


@dataclass
class Job:
    """A checked request: the token prompts, the generation fields, tools and the constraint to compile."""

    chat: bool
    prompts: list[list[int]]
    gen: GenerationParams
    tools: ToolSpec | None = None
    constraint: tuple[str, str, str] | None = None   # (llguidance kind, grammar text, request field)
    echo: list[str] = field(default_factory=list)    # /v1/completions echo: the prompts' text
    images: list = field(default_factory=list)       # [(position, embedding rows)] of the one chat prompt
    causal_images: bool = True
    timings_per_token: bool = False                  # llama-server's field: `timings` in every streamed chunk
    slot: int | None = None                          # llama-server's id_slot: the engine slot to run in
    cache_prompt: bool = True                        # llama-server's: start from a cached prefix
    return_tokens: bool = False                      # llama-server's /completion: the token ids too

    @property
    def sequences(self) -> int:
        return len(self.prompts) * self.gen.n


SYSTEM_FINGERPRINT = f"pyggml-{__version__}"
_READS_TEXT_PARTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> bool
MEDIA_PARTS = ("image_url", "input_audio", "image", "audio", "file")


# ----- reading requests ---------------------------------------------------------------------------
def check_room_early(state: ServerState, f: Fields, n_prompts: int = 1) -> None:
    """The 429 before any costly work (rendering, tokenizing): a flood of refused retries must not slow the
    requests being served."""
    state.check_room(n_prompts * f.get("n", int, 1, low=1, high=MAX_N))


def check_messages(messages: list, vision: bool = False) -> None:
    """Roles, and contents as strings or text parts (a media part is refused by check_media; image parts are read
    where the model has a vision projector)."""
    for i, m in enumerate(messages):
        mf = Fields(m, f"messages[{i}]")
        mf.get("role", str, required=True, choices=("system", "developer", "user", "assistant", "tool", "function"))
        content = mf.get("content", (str, list), None, required=m.get("role") != "assistant")
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind = Fields(part, f"messages[{i}].content[{j}]").get("type", str, required=True)
            if not (vision and kind == "image_url"):
                check_media(kind, f"messages[{i}].content[{j}]")


def check_media(kind: str, where: str) -> None:
    """The one place media parts are refused (image_url parts are read where a vision projector is loaded)."""
    if kind in MEDIA_PARTS:
        hint = "this model has no vision (start the server with --mmproj)" if "image" in kind else \
            "this model has no vision or audio input (text only)"
        raise APIError(f"'{where}' is {kind} input: {hint}", param=where)


def reads_text_parts(model) -> bool:
    """Whether the template renders a content given as text parts (llama.cpp's supports_typed_content probe); if
    not, the parts are joined by newlines first, as llama-server does. Found once per model."""
    if model not in _READS_TEXT_PARTS:
        probe = "<probe-8c1f>"
        try:
            text = model.chat_prompt([{"role": "user", "content": [{"type": "text", "text": probe}]}])
        except Exception:  # a template that only concatenates strings fails on a list
            text = ""
        _READS_TEXT_PARTS[model] = probe in text
    return _READS_TEXT_PARTS[model]


async def render_chat(model, f: Fields) -> tuple[str, ToolSpec, list]:
    """The chat request's messages rendered by the file's template (with the tools when they are active), and
    their images (a model with a vision projector reads image_url parts)."""
    messages = f.get("messages", list, required=True)
    if not messages:
        raise APIError("'messages' must not be empty", param="messages")
    check_messages(messages, vision=getattr(model, "vision", None) is not None)
    if not await run_blocking(reads_text_parts, model):
        messages = [{**m, "content": "\n".join(p.get("text", "") for p in m["content"])}
                    if isinstance(m.get("content"), list) else m for m in messages]
    tools = read_tools(f)
    kwargs = f.get("chat_template_kwargs", dict, {})
    template_tools = [{"type": "function", "function": t} for t in
                      (tf["function"] for tf in f.get("tools", list, []))] if tools.active else None
    images = []
    if has_image_parts(messages):
        if model.vision is None:
            raise APIError("this model has no vision (start the server with --mmproj)", param="messages")
        try:
            messages, images = split_image_parts(messages)
        except ImageError as e:
            raise APIError(str(e), param="messages") from None
    try:
        text = await run_blocking(lambda: model.chat_prompt(
            messages, tools=template_tools, add_generation_prompt=f.get("add_generation_prompt", bool, True), **kwargs))
    except (ParameterError, GGUFError) as e:  # the template refused the messages, or the file has no chat format
        raise APIError(str(e), param="messages") from None
    return text, tools, images


async def read_chat(state: ServerState, body) -> Job:
    f = Fields(body)
    state.check_model_name(f.get("model", str))
    check_room_early(state, f)
    model = state.require().model
    gen = read_generation(f, model.n_vocab, chat=True, tokenize=lambda text: model.tokenize(text, False))
    text, tools, images = await render_chat(model, f)
    job = Job(True, [], gen, tools if tools.active else None)
    if images:
        try:
            # encoded on the engine thread, between steps: the encoder computes on the model's CPU backend
            prompt = await asyncio.wrap_future(state.require().engine.call(lambda m: m.image_prompt(text, images)))
        except ImageError as e:
            raise APIError(str(e), param="messages") from None
        ids, job.images = prompt.engine_prompt()
        job.causal_images = model.vision.causal
    else:
        ids = await run_blocking(lambda: model.tokenize(text, add_special=True, parse_special=True))
    job.prompts = [ids]
    read_llama_fields(job, f, state)
    job.constraint = constraint_of(f, tools)
    check_length(state, job, "messages")
    return job


async def read_completion(state: ServerState, body) -> Job:
    f = Fields(body)
    state.check_model_name(f.get("model", str))
    model = state.require().model
    prompt = f.get("prompt", (str, list), required=True)
    prompt = as_prompts(prompt)
    check_room_early(state, f, len(prompt))
    prompts = await tokenize_prompts(model, prompt)
    gen = read_generation(f, model.n_vocab, chat=False, tokenize=lambda text: model.tokenize(text, False))
    job = Job(False, prompts, gen, constraint=constraint_of(f))
    read_llama_fields(job, f, state)
    if f.get("echo", bool, False):
        job.echo = [model.detokenize(p) for p in prompts]
    if f.get("suffix", str) is not None:
        raise APIError("'suffix' (fill-in-the-middle) is not supported", param="suffix")
    check_length(state, job, "prompt")
    return job


def as_prompts(prompt) -> list:
    """A request's `prompt` as a list of prompts: a string or an array holding a token id is one prompt."""
    return [prompt] if isinstance(prompt, (str, dict)) or any(_is_id(x) for x in prompt) else prompt


async def tokenize_prompts(model, prompts: list) -> list[list[int]]:
    """Each prompt as token ids: a string (special tokens parsed, BOS added as the model does), token ids,
    llama-server's mixed form, an array of strings and ids (strings added without BOS after the first), or its
    JSON form {"prompt_string", "multimodal_data"} (media refused)."""
    out = []
    for i, p in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if isinstance(p, dict):
            pf = Fields(p, where)
            if pf.has("multimodal_data"):
                check_media("image", f"{where}.multimodal_data")
            p = pf.get("prompt_string", str, required=True)
        if isinstance(p, str):
            p = [p]
        if not isinstance(p, list) or not p or not all(isinstance(x, str) or _is_id(x) for x in p):
            raise APIError(f"'{where}' must be a string, token ids, or an array of them", param=where)
        ids = []
        for x in p:
            if isinstance(x, str):
                ids += await run_blocking(lambda x=x, first=not ids: model.tokenize(x, add_special=first,
                                                                                    parse_special=True))
            elif 0 <= x < model.n_vocab:
                ids.append(x)
            else:
                raise APIError(f"'{where}' holds token id {x}, outside the vocabulary of {model.n_vocab}",
                               param=where)
        if not ids:
            raise APIError(f"'{where}' is empty", param=where)
        out.append(ids)
    return out


def _is_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_llama_fields(job: Job, f: Fields, state: ServerState) -> None:
    """llama-server's own request fields that the OpenAI paths read too."""
    job.timings_per_token = f.get("timings_per_token", bool, False)
    job.cache_prompt = f.get("cache_prompt", bool, True)
    slot = f.get("id_slot", int, -1, low=-1, high=state.limits.parallel - 1)
    job.slot = None if slot < 0 else slot


def constraint_of(f: Fields, tools: ToolSpec | None = None):
    """The one constraint of a request: tool forcing, response_format or grammar (several at once: 400)."""
    found = []
    if tools is not None and tools.forcing_schema() is not None:
        found.append(("json_schema", json.dumps(tools.forcing_schema()), "tool_choice"))
    rf = f.obj("response_format")
    if rf is not None:
        kind = rf.get("type", str, required=True, choices=("text", "json_object", "json_schema"))
        if kind == "json_object":
            found.append(("json_schema", json.dumps(rf.get("schema", dict, {"type": "object"})), "response_format"))
        elif kind == "json_schema":
            js = rf.obj("json_schema")
            schema = js.get("schema", dict, required=True) if js else rf.get("schema", dict, required=True)
            found.append(("json_schema", json.dumps(schema), "response_format.json_schema.schema"))
    if f.has("json_schema"):  # llama.cpp's own field
        found.append(("json_schema", json.dumps(f.get("json_schema", dict)), "json_schema"))
    if f.has("grammar"):
        found.append(("gbnf", f.get("grammar", str), "grammar"))
    if len(found) > 1:
        raise APIError(f"only one constraint per request: got {', '.join(p for _, _, p in found)}", param=found[1][2])
    return found[0] if found else None


def check_length(state: ServerState, job: Job, param: str) -> None:
    loaded = state.require()
    n_ctx, shift = loaded.model.n_ctx, loaded.engine.context_shift  # with a shift, max_tokens may go past n_ctx
    for ids in job.prompts:
        if len(ids) >= n_ctx:
            raise APIError(f"the prompt has {len(ids)} tokens; the context holds {n_ctx}", param=param,
                           code="context_length_exceeded", extra={"n_prompt_tokens": len(ids), "n_ctx": n_ctx})
        if job.gen.max_tokens > 0 and len(ids) + job.gen.max_tokens > n_ctx and not shift:
            raise APIError(f"the prompt's {len(ids)} tokens plus max_tokens {job.gen.max_tokens} exceed the "
                           f"context of {n_ctx}", param="max_tokens")


# ----- running sequences --------------------------------------------------------------------------
def _requests(state: ServerState, job: Job) -> list:
    loaded = state.require()
    sampling = dict(job.gen.sampling)
    if sampling["repeat_last_n"] == -1:
        sampling["repeat_last_n"] = loaded.model.n_ctx
    out = []
    for ids in job.prompts:
        for i in range(job.gen.n):
            seed = sampling["seed"] + i if sampling["seed"] is not None else None
            constraint = state.constraints.compile(*job.constraint) if job.constraint else None
            params = SamplingParams(**{**sampling, "seed": seed})
            out.append(Request(prompt=ids, max_tokens=job.gen.max_tokens, sampling=params, slot=job.slot,
                               cache_prompt=job.cache_prompt,
                               stop=job.gen.stop, ignore_eos=job.gen.ignore_eos, n_probs=job.gen.top_logprobs,
                               n_keep=job.gen.n_keep,
                               logits_processor=constraint.logits_processor if constraint else None,
                               on_token=constraint.on_token if constraint else None,
                               images=job.images, causal_images=job.causal_images))
    return out


class Run:
    """The sequences of one admitted request: submitted together, their events merged, cancelled together."""

    def __init__(self, state: ServerState, job: Job):
        self.state, self.job = state, job
        self.handles: list = []
        self.admitted = 0
        self.outcome = "error"

    async def __aenter__(self) -> "Run":
        requests = await run_blocking(_requests, self.state, self.job)  # llguidance compiles off the loop
        self.state.admit(len(requests))
        self.admitted = len(requests)
        try:
            engine = self.state.require().engine
            for r in requests:
                self.handles.append(engine.submit(r))
        except ParameterError as e:
            self._cancel()
            self.state.release(len(requests), "refused")
            raise APIError(str(e)) from None
        return self

    async def __aexit__(self, kind, exc, tb) -> None:
        self._cancel()
        if kind in (asyncio.CancelledError, GeneratorExit, ClientGone):
            self.outcome = "cancelled"
        elif kind is TimeoutError:
            self.outcome = "timeout"
        self.state.release(self.admitted, self.outcome)

    def _cancel(self) -> None:
        for h in self.handles:
            h.cancel()

    async def events(self):
        """(sequence index, event) in arrival order until every sequence is done; TimeoutError past the limit."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i, handle):
            async for event in handle:
                queue.put_nowait((i, event))

        tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(self.handles)]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.state.limits.timeout_s
        try:
            left = len(self.handles)
            while left:
                try:  # events that are already there need no timer (wait_for costs a task per call)
                    i, event = queue.get_nowait()
                except asyncio.QueueEmpty:
                    i, event = await asyncio.wait_for(queue.get(), max(0.0, deadline - loop.time()))
                if is_done(event):
                    left -= 1
                    count_tokens(event.prompt_tokens, event.completion_tokens)
                yield i, event
        finally:
            for t in tasks:
                t.cancel()


def is_done(event) -> bool:
    return isinstance(event, Done)


class ChoiceOutput:
    """One choice's text, log-probabilities and (with tools) the part held back while it may be a tool call."""

    def __init__(self, index: int, job: Job, tokenizer):
        self.index, self.job, self.tokenizer = index, job, tokenizer
        self.text, self.sent, self.pending_logprobs = "", 0, []
        self.logprobs: list[dict] = []
        self.text_offset = 0   # where the next streamed log-probability's token starts in the output
        self.tokens: list = []  # the engine's Token events
        self.calls: list = []
        self.done = None
        self.call_stream = ToolCallStream(job.tools) if job.tools else None  # used when streaming
        self.t_start, self.t_first, self.t_end = time.perf_counter(), None, None

    def add(self, token) -> str:
        """The text that may be sent now."""
        now = time.perf_counter()
        self.t_first = self.t_first or now
        self.t_end = now
        self.tokens.append(token)
        self.text += token.text
        if self.job.gen.logprobs and not (self.tokenizer.is_eog(token.id) and not self.job.gen.ignore_eos):
            entry = {"token": self._piece(token.id), "logprob": token.logprob,
                     "bytes": list(self._piece(token.id).encode()), "id": token.id,
                     "top_logprobs": [{"token": self._piece(t), "logprob": lp, "bytes": list(self._piece(t).encode())}
                                      for t, lp in token.top]}
            self.logprobs.append(entry)
            self.pending_logprobs.append(entry)
        limit = tool_call_start(self.text) if self.job.tools else len(self.text)
        limit = max(limit, self.sent)
        out, self.sent = self.text[self.sent:limit], limit
        return out

    def _piece(self, token_id: int) -> str:
        return self.tokenizer.token_to_piece(token_id, special=True).decode("utf-8", "replace")

    def finish(self, done) -> tuple[str, list]:
        """(content not sent yet, tool calls) at the end."""
        self.done = done
        self.t_end = time.perf_counter()
        if done.finish_reason == "error":
            raise APIError(f"generation failed: {done.error}", status=500, kind="server_error")
        if self.job.tools:
            content, self.calls = parse_tool_calls(self.text, self.job.tools)
            if self.calls:
                self.text = content
                return content[self.sent:], self.calls
        return self.text[self.sent:], []

    def tool_deltas(self) -> list[dict]:
        """The streamed tool-call deltas the output so far adds."""
        return self.call_stream.update(self.text) if self.call_stream else []

    def finish_stream(self, done) -> tuple[str, list[dict], str]:
        """(content not sent yet, tool-call deltas not sent yet, finish reason) at the end of a stream."""
        text = self.text
        late = self.call_stream.update(text, final=True) if self.call_stream else []
        rest, calls = self.finish(done)
        if self.call_stream is None or not self.call_stream.started:
            return rest, [c.as_openai(k) for k, c in enumerate(calls)], "tool_calls" if calls else self.finish_reason
        if self.call_stream.matches(calls):
            self.calls = self.call_stream.calls
            return rest, late, "tool_calls"
        # a call streamed that the finished output does not hold (cut short, broken JSON): the whole response
        # would give that output as content, so the stream sends it as content too
        self.text, self.calls = text, []
        return text[self.sent:], late, self.finish_reason

    @property
    def finish_reason(self) -> str:
        return self.done.finish_reason

    def take_logprobs(self):
        out, self.pending_logprobs = self.pending_logprobs, []
        return out

    def timings(self) -> dict:
        """llama-server's `timings`: prompt tokens read (cached ones apart) and tokens generated, with times in ms
        (the prompt's from submission to the first token, queueing included; generation's from there to the last)."""
        first = self.t_first or self.t_end or self.t_start
        prompt_ms, gen_ms = (first - self.t_start) * 1e3, ((self.t_end or first) - first) * 1e3
        cached = self.done.cached_tokens if self.done else 0
        prompt_n = (self.done.prompt_tokens if self.done else 0) - cached
        gen_n = self.done.completion_tokens if self.done else len(self.logprobs)
        return {"cache_n": cached, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
                "prompt_per_second": prompt_n * 1e3 / prompt_ms if prompt_ms else 0.0,
                "predicted_n": gen_n, "predicted_ms": gen_ms,
                "predicted_per_token_ms": gen_ms / gen_n if gen_n else 0.0,
                "predicted_per_second": gen_n * 1e3 / gen_ms if gen_ms else 0.0, **self.draft_timings()}

    def draft_timings(self) -> dict:
        """llama-server's draft_n / draft_n_accepted, there only when something was drafted."""
        drafted = self.done.draft_tokens if self.done else 0
        return {"draft_n": drafted, "draft_n_accepted": self.done.draft_accepted} if drafted else {}

    def stream_legacy_logprobs(self, entries: list[dict]) -> dict:
        """The legacy form of a streamed chunk: offsets go on from the previous chunks', as in the whole response."""
        out = self.legacy_logprobs(entries, self.text_offset)
        self.text_offset += sum(len(e["token"]) for e in entries)
        return out

    def legacy_logprobs(self, entries: list[dict], offset: int = 0) -> dict:
        """The /v1/completions form: tokens, token_logprobs, top_logprobs as {token: logprob}, text_offset."""
        offsets, at = [], offset
        for e in entries:
            offsets.append(at)
            at += len(e["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": offsets}


def _usage(job: Job, outputs: list[ChoiceOutput]) -> dict:
    per_prompt = outputs[::job.gen.n]
    prompt = sum(o.done.prompt_tokens for o in per_prompt)
    cached = sum(o.done.cached_tokens for o in per_prompt)
    completion = sum(o.done.completion_tokens for o in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _chat_logprobs(entries: list[dict]):
    return {"content": [{k: v for k, v in e.items() if k != "id"} for e in entries], "refusal": None}


# ----- whole responses ----------------------------------------------------------------------------
class ClientGone(Exception):
    """The client closed its connection before the response was ready."""


async def complete(state: ServerState, job: Job, model_id: str, disconnected) -> dict:
    """The whole response; `disconnected()` gives an awaitable that ends when the client goes away (then its
    sequences are cancelled and ClientGone is raised)."""
    return _response(job, model_id, await collect_outputs(state, job, disconnected))


async def collect_outputs(state: ServerState, job: Job, disconnected) -> list[ChoiceOutput]:
    """Every sequence of the request run to its end (see complete)."""
    async with Run(state, job) as run:
        outputs = [ChoiceOutput(i, job, state.require().model.tokenizer) for i in range(job.sequences)]

        async def collect():
            async for i, event in run.events():
                if is_done(event):
                    outputs[i].finish(event)
                else:
                    outputs[i].add(event)

        await unless_gone(collect(), disconnected)
        run.outcome = "completed"
    return outputs


async def unless_gone(work, disconnected):
    """Await `work` unless the client goes away first (then ClientGone); its TimeoutError or APIError pass on."""
    work, watcher = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            raise ClientGone()
        return work.result()
    finally:
        for task in (work, watcher):
            task.cancel()
        await asyncio.gather(work, watcher, return_exceptions=True)


def _response(job: Job, model_id: str, outputs: list[ChoiceOutput]) -> dict:
    choices = []
    for o in outputs:
        if job.chat:
            calls = o.calls
            message = {"role": "assistant", "content": o.text if (o.text or not calls) else None}
            if calls:
                message["tool_calls"] = [c.as_openai() for c in calls]
            choices.append({"index": o.index, "message": message,
                            "logprobs": _chat_logprobs(o.logprobs) if job.gen.logprobs else None,
                            "finish_reason": "tool_calls" if calls else o.finish_reason})
        else:
            echo = job.echo[o.index // job.gen.n] if job.echo else ""
            choices.append({"index": o.index, "text": echo + o.text,
                            "logprobs": o.legacy_logprobs(o.logprobs, len(echo)) if job.gen.logprobs else None,
                            "finish_reason": o.finish_reason})
    return {"id": _new_id(job), "object": "chat.completion" if job.chat else "text_completion",
            "created": int(time.time()), "model": model_id, "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices, "usage": _usage(job, outputs), "timings": outputs[0].timings()}


def _new_id(job: Job) -> str:
    return ("chatcmpl-" if job.chat else "cmpl-") + uuid.uuid4().hex


# ----- streaming ----------------------------------------------------------------------------------
def sse(data) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def start_stream(state: ServerState, job: Job, model_id: str):
    """The SSE chunks of an admitted request: admission happens here, before the response starts, so a refusal
    (429, 400) is still an HTTP status. A client that goes away closes the generator, which cancels its
    sequences where it waits (a response that never started is closed when it is collected)."""
    chunks = _stream(state, job, model_id)
    await chunks.__anext__()  # b"": admitted and submitted
    return chunks


async def _stream(state: ServerState, job: Job, model_id: str):
    """b"" once admitted, then the chunks of every choice as it is decoded, the usage chunk if asked for, and
    [DONE]; an error after admission is an error chunk (the response has started), before it an HTTP status."""
    chunks = _Chunks(job, model_id)
    admitted = False
    try:
        async with Run(state, job) as run:
            admitted = True
            yield b""
            for chunk in chunks.start(state.require().model.tokenizer):
                yield chunk
            async for i, event in run.events():
                for chunk in chunks.take(i, event):
                    yield chunk
            run.outcome = "completed"
        if job.gen.include_usage:
            yield chunks.usage()
    except APIError as e:
        if not admitted:
            raise
        yield sse(e.body())
    except TimeoutError:
        yield sse(error_body(f"the request ran past its {state.limits.timeout_s:g} s limit", "timeout_error"))
    yield sse("[DONE]")


class _Chunks:
    """One streamed request's chunks: the fields every chunk repeats, and each choice's output so far."""

    def __init__(self, job: Job, model_id: str):
        self.job = job
        self.head = {"id": _new_id(job), "object": "chat.completion.chunk" if job.chat else "text_completion",
                     "created": int(time.time()), "model": model_id, "system_fingerprint": SYSTEM_FINGERPRINT}
        self.usage_field = {"usage": None} if job.gen.include_usage else {}
        self.outputs: list[ChoiceOutput] = []

    def chunk(self, index, delta=None, text=None, logprobs=None, finish=None, first=False) -> bytes:
        if self.job.chat:
            choice = {"index": index, "delta": delta or {}, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        per_token = self.job.timings_per_token and not first
        timings = {"timings": self.outputs[index].timings()} if finish or per_token else {}
        return sse({**self.head, "choices": [choice], **self.usage_field, **timings})

    def start(self, tokenizer) -> list[bytes]:
        """Each choice's output begun; in a chat stream each choice's first chunk names the role."""
        self.outputs = [ChoiceOutput(i, self.job, tokenizer) for i in range(self.job.sequences)]
        if not self.job.chat:
            return []
        return [self.chunk(o.index, {"role": "assistant", "content": ""}, first=True) for o in self.outputs]

    def take(self, i: int, event) -> list[bytes]:
        """The chunks one event of choice i makes: its new text (with logprobs) and tool-call deltas."""
        if is_done(event):
            return self.finish(i, event)
        job, o = self.job, self.outputs[i]
        text = o.add(event)
        out = [self.chunk(i, **_piece(job, o, text))] if text or (job.gen.logprobs and not job.tools) else []
        return out + [self.chunk(i, {"tool_calls": [delta]}) for delta in o.tool_deltas()]

    def finish(self, i: int, event) -> list[bytes]:
        """Choice i's end: the content not sent yet, the tool-call deltas not sent yet, the finish reason."""
        o = self.outputs[i]
        rest, deltas, reason = o.finish_stream(event)
        out = [self.chunk(i, **_piece(self.job, o, rest))] if rest or o.pending_logprobs else []
        return out + [self.chunk(i, {"tool_calls": [delta]}) for delta in deltas] + [self.chunk(i, finish=reason)]

    def usage(self) -> bytes:
        return sse({**self.head, "choices": [], "usage": _usage(self.job, self.outputs),
                    "timings": self.outputs[0].timings()})


def _piece(job: Job, o: ChoiceOutput, text: str) -> dict:
    entries = o.take_logprobs() if job.gen.logprobs else []
    if job.chat:
        return {"delta": {"content": text}, "logprobs": _chat_logprobs(entries) if job.gen.logprobs else None}
    return {"text": text, "logprobs": o.stream_legacy_logprobs(entries) if job.gen.logprobs else None}

