"""Speculative decoding options shared by `pyggml generate` and `pyggml serve` (llama.cpp's --model-draft,
--spec-type, --draft-max, --draft-min, --draft-p-min), and generation through the engine with a drafter."""

from __future__ import annotations

import sys

from pyggml.cli.args import non_negative_int, positive_int
from pyggml.models.timings import Stage


def add_arguments(p) -> None:
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--model-draft", "-md", "--spec-draft-model",
                   help="GGUF draft model of the same vocabulary (llama.cpp's --model-draft)")
    g.add_argument("--spec-type", choices=["none", "ngram", "ngram-simple"], default="none",
                   help="ngram: draft-free prompt lookup, the tokens that followed the last n-gram's latest earlier "
                        "occurrence (default none; a --model-draft implies a draft model)")
    g.add_argument("--draft-max", "--draft", "--spec-draft-n-max", type=positive_int, default=16,
                   help="most tokens drafted per step (default 16)")
    g.add_argument("--draft-min", "--spec-draft-n-min", type=non_negative_int, default=0,
                   help="fewer drafted tokens are not tried (default 0)")
    g.add_argument("--draft-p-min", "--spec-draft-p-min", type=float, default=0.75,
                   help="the draft model stops drafting below this top probability (default 0.75)")
    g.add_argument("--spec-ngram-size", type=positive_int, default=3,
                   help="n-gram length prompt lookup matches (default 3, shorter when none matches)")


def open_drafter(args, model, n_seq: int):
    """The drafter the options ask for (None without speculative decoding); a draft model is loaded with the
    target's context, checked for the target's vocabulary."""
    from pyggml.models import load_model
    from pyggml.models.llm.speculative import ModelDrafter, NgramDrafter, SpecParams, check_compatible

    params = SpecParams(n_max=args.draft_max, n_min=args.draft_min, p_min=args.draft_p_min, ngram=args.spec_ngram_size)
    if args.model_draft:
        draft = load_model(args.model_draft, n_ctx=model.n_ctx, n_batch=model.n_batch, n_seq_max=n_seq)
        check_compatible(model, draft)
        return ModelDrafter(draft, params)
    return None if args.spec_type == "none" else NgramDrafter(params)


def generate(model, drafter, prompt_ids: list[int], n: int, sampling, stream) -> None:
    """Generate after prompt_ids through a one-slot engine with the drafter, streaming the text; the model's
    timings get the engine's prompt and generation figures."""
    from pyggml.models.llm.engine import Engine, Request, Token

    with Engine(model, n_slots=1, drafter=drafter) as engine:
        for event in engine.submit(Request(prompt_ids, max_tokens=n, sampling=sampling)):
            if isinstance(event, Token) and event.text:
                stream(event.text)
        stats = engine.stats()
    t = model.timings
    t.prompt, t.gen = Stage(stats.prompt_s, stats.prompt_tokens), Stage(stats.gen_s, stats.gen_tokens)
    rate = stats.draft_accepted / stats.draft_tokens if stats.draft_tokens else 0.0
    print(f"\ndraft:   {stats.draft_tokens:5d} tokens drafted, {stats.draft_accepted} accepted ({100 * rate:.1f}%)",
          end="", file=sys.stderr)
