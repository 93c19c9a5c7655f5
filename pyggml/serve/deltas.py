"""One chat answer as a sequence of deltas (text pieces, a tool call's start and the pieces of its arguments, the
end), for the APIs that send an answer as typed content blocks rather than OpenAI's chat chunks: Anthropic's
messages and OpenAI's responses. The tool-call reading is the chat API's own (ChoiceOutput, ToolCallStream),
so every API streams and parses calls alike."""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.models.llm.engine import Done
from pyggml.serve.completions import ChoiceOutput, Job, Run, unless_gone
from pyggml.serve.state import ServerState


@dataclass
class TextDelta:
    text: str


@dataclass
class CallStart:
    index: int          # the call's number in the answer
    id: str
    name: str


@dataclass
class CallArguments:
    index: int
    text: str           # a piece of the arguments' JSON text


@dataclass
class Finished:
    output: ChoiceOutput   # text (content) and calls of the finished answer
    reason: str            # stop, length or tool_calls
    stop_sequence: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


async def open_deltas(state: ServerState, job: Job):
    """The deltas of the job's one answer, once admitted: a refusal (429, 400) is raised here, before a response
    starts. The generator must be read to its end (or closed) so that its sequence is released."""
    deltas = _deltas(state, job)
    await deltas.__anext__()
    return deltas


async def collect(state: ServerState, job: Job, disconnected) -> Finished:
    """The whole answer; ClientGone when the client goes away first (its sequence is cancelled)."""
    deltas = await open_deltas(state, job)

    async def last():
        return [d async for d in deltas][-1]
    try:
        return await unless_gone(last(), disconnected)
    finally:
        await deltas.aclose()


async def _deltas(state: ServerState, job: Job):
    async with Run(state, job) as run:
        yield None  # admitted and submitted
        model = state.require().model
        output, sent, ids = ChoiceOutput(0, job, model.tokenizer), "", []
        async for _, event in run.events():
            if isinstance(event, Done):
                rest, calls, reason = output.finish_stream(event)
                if rest:
                    yield TextDelta(rest)
                for delta in calls:
                    for d in _call_deltas(delta):
                        yield d
                stop = _stop_sequence(model, job, ids, sent, event.finish_reason)
                run.outcome = "completed"
                yield Finished(output, reason, stop, event.prompt_tokens, event.cached_tokens, event.completion_tokens)
            else:
                sent += event.text
                ids.append(event.id)
                text = output.add(event)
                if text:
                    yield TextDelta(text)
                for delta in output.tool_deltas():
                    for d in _call_deltas(delta):
                        yield d


def _call_deltas(delta: dict):
    """An OpenAI tool_calls delta as CallStart / CallArguments."""
    if "id" in delta:
        yield CallStart(delta["index"], delta["id"], delta["function"]["name"])
    if delta["function"].get("arguments"):
        yield CallArguments(delta["index"], delta["function"]["arguments"])


def _stop_sequence(model, job: Job, ids: list[int], sent: str, finish_reason: str) -> str | None:
    """The stop string that ended the answer (the engine's text stops where the first one begins), None when it
    ended otherwise."""
    if finish_reason != "stop" or not job.gen.stop or (ids and model.tokenizer.is_eog(ids[-1])):
        return None
    full = model.detokenize(ids)
    return next((s for s in job.gen.stop if full.startswith(s, len(sent))), None)
