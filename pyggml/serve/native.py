"""llama-server's own API beside OpenAI's, in its request and response shapes: /completion and /infill (results
with tokens_predicted, generation_settings, timings, completion_probabilities; a stream of `data:` results
without [DONE]), /apply-template, /props, /slots (with save, restore and erase under --slot-save-path)."""

from __future__ import annotations

import asyncio
import time
import zipfile
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from pyggml.errors import ParameterError
from pyggml.serve import completions, lora
from pyggml.serve.completions import SYSTEM_FINGERPRINT, ChoiceOutput, Job, Run, sse
from pyggml.serve.infill import fim_tokens, infill_prompt, read_extra
from pyggml.serve.params import GenerationParams, read_generation
from pyggml.serve.protocol import APIError, Fields
from pyggml.serve.state import ServerState, run_blocking

SAMPLERS = ["penalties", "top_k", "typ_p", "top_p", "min_p", "temperature"]  # the order the engine applies them


def routes(state: ServerState, read_json, disconnect) -> APIRouter:
    """The router; `read_json(request)` parses a body into an APIError-checked object, `disconnect(request)` ends
    when the client has gone."""
    router = APIRouter()

    @router.post("/completion")
    @router.post("/completions")
    async def completion(request: Request):
        state.check_room()  # before the body is parsed
        body = await read_json(request)
        job = await read_native(state, body)
        return await lora.gated(state, body, lambda: _answer(state, job, request, disconnect))

    @router.post("/infill")
    async def infill(request: Request):
        state.check_room()  # before the body is parsed
        body = await read_json(request)
        job = await read_native(state, body, infill=True)
        return await lora.gated(state, body, lambda: _answer(state, job, request, disconnect))

    @router.post("/apply-template")
    async def apply_template(request: Request):
        f = Fields(await read_json(request))
        text, _, _ = await completions.render_chat(state.require().model, f)
        return {"prompt": text}

    @router.post("/chat/completions/input_tokens")
    @router.post("/v1/chat/completions/input_tokens")
    async def input_tokens(request: Request):
        model = state.require().model
        text, _, _ = await completions.render_chat(model, Fields(await read_json(request)))
        ids = await run_blocking(lambda: model.tokenize(text, add_special=True, parse_special=True))
        return {"input_tokens": len(ids)}

    @router.get("/props")
    async def props():
        return _props(state)

    @router.post("/props")
    async def set_props(request: Request):
        Fields(await read_json(request))  # llama-server takes the request and changes nothing either
        return {"success": True}

    @router.get("/slots")
    async def slots(fail_on_no_slot: str = ""):
        loaded = state.require()
        info = await asyncio.wrap_future(loaded.engine.slots_info())
        if fail_on_no_slot and all(busy for _, busy, _ in info):
            raise APIError("no slot available", status=503, kind="unavailable_error")
        n_ctx = _slot_ctx(state)
        speculative = loaded.engine.drafter is not None
        return [{"id": i, "n_ctx": n_ctx, "speculative": speculative, "is_processing": busy,
                 "n_prompt_tokens": len(cached)} for i, busy, cached in info]

    @router.post("/slots/{id_slot}")
    async def slot_action(id_slot: str, request: Request, action: str = ""):
        return await _slot_action(state, id_slot, action, request, read_json)

    return router


# ----- /completion and /infill ----------------------------------------------------------------------
async def read_native(state: ServerState, body, infill: bool = False) -> Job:
    f = Fields(body)
    state.check_model_name(f.get("model", str))
    model = state.require().model
    if infill:
        fim_tokens(model.tokenizer)
        prompts = [f.get("prompt", str, "")]
    else:
        prompts = completions.as_prompts(f.get("prompt", (str, list, dict), required=True))
    completions.check_room_early(state, f, len(prompts))
    gen = read_generation(f, model.n_vocab, chat=False, tokenize=lambda text: model.tokenize(text, False))
    gen.top_logprobs = f.get("n_probs", int, 0, low=0, high=model.n_vocab)
    gen.logprobs = gen.top_logprobs > 0
    if infill:
        prefix, suffix = f.get("input_prefix", str, required=True), f.get("input_suffix", str, required=True)
        extra = read_extra(f)
        prompt = await run_blocking(lambda: model.tokenize(prompts[0], add_special=False, parse_special=True))
        ids = await run_blocking(lambda: infill_prompt(model.tokenizer, prefix, suffix, extra, prompt,
                                                       model.n_batch, _slot_ctx(state)))
        tokens = [ids]
    else:
        tokens = await completions.tokenize_prompts(model, prompts)
    job = Job(False, tokens, gen, constraint=completions.constraint_of(f))
    completions.read_llama_fields(job, f, state)
    job.return_tokens = f.get("return_tokens", bool, False)
    completions.check_length(state, job, "prompt")
    return job


async def _answer(state: ServerState, job: Job, request: Request, disconnect):
    model_id = state.require().model_id
    if job.gen.stream:
        chunks = _stream(state, job, model_id)
        await chunks.__anext__()  # admitted (a refusal is still an HTTP status)
        return StreamingResponse(chunks, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        outputs = await completions.collect_outputs(state, job, lambda: disconnect(request))
    except TimeoutError:
        raise APIError(f"the request ran past its {state.limits.timeout_s:g} s limit", status=504,
                       kind="timeout_error") from None
    results = [_final(state, job, o, model_id) for o in outputs]
    return results[0] if len(results) == 1 else results


def _final(state: ServerState, job: Job, o: ChoiceOutput, model_id: str, stream: bool = False) -> dict:
    """llama-server's final result of a sequence (a stream's last event has its content already sent)."""
    model, done = state.require().model, o.done
    ids = [t.id for t in o.tokens]
    stop_type = {"length": "limit"}.get(done.finish_reason, "none")
    word = ""
    if done.finish_reason == "stop":
        eos = bool(ids) and model.tokenizer.is_eog(ids[-1]) and not job.gen.ignore_eos
        stop_type = "eos" if eos else "word"
        if not eos:
            full = model.detokenize(ids)
            word = next((s for s in job.gen.stop if full[len(o.text):].startswith(s)), "")
    prompt = job.prompts[o.index // job.gen.n]
    out = {"index": o.index, "content": "" if stream else o.text, "tokens": ids if job.return_tokens else [],
           "id_slot": done.slot, "stop": True, "model": model_id, "tokens_predicted": done.completion_tokens,
           "tokens_evaluated": done.prompt_tokens, "generation_settings": _settings(job.gen),
           "prompt": model.detokenize(prompt), "has_new_line": "\n" in o.text, "truncated": False,
           "stop_type": stop_type, "stopping_word": word,
           "tokens_cached": max(done.prompt_tokens + done.completion_tokens - 1, 0), "timings": o.timings()}
    if job.gen.logprobs and not stream:
        out["completion_probabilities"] = [_probs(model, t) for t in o.tokens[:len(o.logprobs)]]
    return out


def _probs(model, token) -> dict:
    """llama-server's completion_probabilities entry (log-probabilities of the raw distribution)."""
    def entry(token_id, logprob):
        raw = model.tokenizer.token_to_piece(token_id, special=True)
        return {"id": token_id, "token": raw.decode("utf-8", "ignore"), "bytes": list(raw), "logprob": logprob}

    return {**entry(token.id, token.logprob), "top_logprobs": [entry(t, lp) for t, lp in token.top]}


async def _stream(state: ServerState, job: Job, model_id: str):
    """Each token's result (`stop: false`), then each sequence's final one (`stop: true`), as `data:` events;
    llama-server sends no [DONE] here."""
    admitted = False
    try:
        async with Run(state, job) as run:
            admitted = True
            yield b""
            model = state.require().model
            outputs = [ChoiceOutput(i, job, model.tokenizer) for i in range(job.sequences)]
            async for i, event in run.events():
                o = outputs[i]
                if completions.is_done(event):
                    rest, _ = o.finish(event)
                    yield sse({**_final(state, job, o, model_id, stream=True), "content": rest})
                    continue
                text = o.add(event)
                chunk = {"index": i, "content": text, "tokens": [event.id] if job.return_tokens else [],
                         "stop": False, "id_slot": -1, "tokens_predicted": len(o.tokens),
                         "tokens_evaluated": len(job.prompts[i // job.gen.n])}
                if job.gen.logprobs and o.take_logprobs():
                    chunk["completion_probabilities"] = [_probs(model, event)]
                if job.timings_per_token:
                    chunk["timings"] = o.timings()
                yield sse(chunk)
            run.outcome = "completed"
    except APIError as e:
        if not admitted:
            raise
        yield sse(e.body())
    except TimeoutError:
        yield sse(APIError(f"the request ran past its {state.limits.timeout_s:g} s limit", status=504,
                           kind="timeout_error").body())


def _settings(gen: GenerationParams) -> dict:
    """llama-server's generation_settings (its names) of a request's generation fields."""
    s = gen.sampling
    return {"n_predict": gen.max_tokens, "max_tokens": gen.max_tokens, "seed": -1 if s["seed"] is None else s["seed"],
            "temperature": s["temperature"], "top_k": s["top_k"], "top_p": s["top_p"], "min_p": s["min_p"],
            "typical_p": s["typical_p"], "repeat_last_n": s["repeat_last_n"], "repeat_penalty": s["repeat_penalty"],
            "presence_penalty": s["presence_penalty"], "frequency_penalty": s["frequency_penalty"],
            "stop": gen.stop, "n_keep": 0, "ignore_eos": gen.ignore_eos, "stream": gen.stream,
            "n_probs": gen.top_logprobs, "min_keep": 0, "samplers": SAMPLERS,
            "logit_bias": [[t, b] for t, b in s["logit_bias"].items()]}


def _default_gen(state: ServerState) -> GenerationParams:
    return read_generation(Fields({}), state.require().model.n_vocab, chat=False)


def _slot_ctx(state: ServerState) -> int:
    """A slot's context as llama-server counts it (n_ctx over the slots)."""
    return state.require().model.n_ctx // state.limits.parallel


# ----- /props -----------------------------------------------------------------------------------------
def _props(state: ServerState) -> dict:
    loaded = state.require()
    model = loaded.model
    tok = model.tokenizer

    def piece(token_id):
        return "" if token_id is None else tok.token_to_piece(token_id, special=True).decode("utf-8", "replace")

    out = {"default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": _slot_ctx(state),
                                           "speculative": loaded.engine.drafter is not None,
                                           "is_processing": False,
                                           "params": _settings(_default_gen(state))},
           "total_slots": state.limits.parallel, "model_alias": loaded.model_id, "model_path": model.gguf.path,
           "modalities": {"vision": getattr(model, "vision", None) is not None, "audio": bool(loaded.whisper),
                          "video": False},
           "endpoint_slots": True, "endpoint_props": True, "endpoint_metrics": True,
           "chat_template": model.chat_template().source or "", "bos_token": piece(tok.bos_id),
           "eos_token": piece(tok.eos_id), "build_info": SYSTEM_FINGERPRINT, "is_sleeping": False}
    tool_use = model.gguf.get("tokenizer.chat_template.tool_use")
    if isinstance(tool_use, str):
        out["chat_template_tool_use"] = tool_use
    return out


# ----- /slots/{id}?action= ----------------------------------------------------------------------------
async def _slot_action(state: ServerState, id_slot: str, action: str, request: Request, read_json) -> dict:
    if state.limits.slot_save_path is None:
        raise APIError("This server does not support slots action. Start it with `--slot-save-path`",
                       status=501, kind="not_supported_error")
    try:
        slot = int(id_slot)
    except ValueError:
        raise APIError("Invalid slot ID", param="id_slot") from None
    engine = state.require().engine
    if not 0 <= slot < state.limits.parallel:
        raise APIError(f"Invalid slot ID: {slot} is outside [0, {state.limits.parallel})", param="id_slot")
    if action == "erase":
        return {"id_slot": slot, "n_erased": await _engine_call(engine.erase_slot(slot))}
    if action not in ("save", "restore"):
        raise APIError("Invalid action: one of save, restore, erase", param="action")
    filename = Fields(await read_json(request)).get("filename", str, required=True)
    path = slot_file(state.limits.slot_save_path, filename)
    start = time.perf_counter()
    if action == "save":
        n = await _engine_call(engine.save_slot(slot, path))
        return {"id_slot": slot, "filename": filename, "n_saved": n, "n_written": path.stat().st_size,
                "timings": {"save_ms": (time.perf_counter() - start) * 1e3}}
    if not path.is_file():
        raise APIError(f"no saved slot named '{filename}'", status=404, param="filename")
    n = await _engine_call(engine.restore_slot(slot, path))
    return {"id_slot": slot, "filename": filename, "n_restored": n, "n_read": path.stat().st_size,
            "timings": {"restore_ms": (time.perf_counter() - start) * 1e3}}


def slot_file(directory: str, filename: str) -> Path:
    """The file a slot is saved to: a plain name inside the save directory (no separators, no `..`, nothing
    hidden, no control characters), so a request can never reach another path."""
    bad = (not filename or len(filename) > 255 or filename in (".", "..") or filename.startswith(".")
           or any(c in filename for c in "/\\:") or any(ord(c) < 32 or ord(c) == 127 for c in filename))
    path = Path(directory).resolve() / filename
    if bad or path.parent != Path(directory).resolve():
        raise APIError("Invalid filename: a plain file name inside the slot save directory", param="filename")
    return path


async def _engine_call(future):
    try:
        return await asyncio.wrap_future(future)
    except (ParameterError, OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        # a busy slot, a file that is no saved slot
        raise APIError(f"slot action failed: {e}") from None
