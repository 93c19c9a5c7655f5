"""A conversation's second turn about an image, as an OpenAI client sends it (the whole history, the image again)
through the engine the server runs: with the image's embeddings and the slot's cells kept (the resend) against
the image encoded and the history read afresh (the encoder's cache emptied, cache_prompt off). Seconds from the
history's rendering (Model.image_prompt) to the answer's last token, medians of --runs alternating pairs, and the
ratio resend / afresh, after an untimed pair. Random-weight pairs as benchmarks/vision_vs_llamacpp.py writes them
(a one-layer language model: the time saved is mostly the encoder's).

    python -m benchmarks.vision_resend --projector idefics3 --size full
    python -m benchmarks.vision_resend --size small --runs 1    # a quick check that it all runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from benchmarks.peer_run import RunLog, written_apart
from benchmarks.vision_vs_llamacpp import PROJECTORS, write_pair

def turn(model, engine, text: str, image: bytes, cached: bool) -> tuple[float, object]:
    """One turn's seconds and its Done."""
    from pyggml.models.llm.engine import Request
    from pyggml.models.vision.image_cache import ImageCache

    if not cached:
        model.vision.cache = ImageCache()
    start = time.perf_counter()
    prompt = model.image_prompt(text, [image])
    ids, images = prompt.engine_prompt()
    events = list(engine.submit(Request(ids, max_tokens=8, images=images, causal_images=model.vision.causal,
                                        cache_prompt=cached)))
    return time.perf_counter() - start, events[-1]


def measure(args, lm: str, mmproj: str, image_path: str, log: RunLog) -> dict:
    from pathlib import Path

    from pyggml.models import load_model
    from pyggml.models.llm.engine import Engine

    image = Path(image_path).read_bytes()
    model = load_model(lm, n_ctx=4096, mmproj=mmproj, n_threads=args.threads)
    first = "User: <__media__> what is it?\nAssistant:"  # the random-weight models have no chat template
    second = first + " a picture.\nUser: and now?\nAssistant:"
    times = {"resend": [], "afresh": []}
    with Engine(model, n_slots=1) as engine:
        for i in range(args.runs + 1):  # the first pair warms up (compiles, plans), untimed
            log.start("afresh / resend pair" if i else "warm-up pair")
            for kind, cached in (("afresh", False), ("resend", True)):
                turn(model, engine, first, image, cached)  # the first turn, so the second can reuse it
                seconds, done = turn(model, engine, second, image, cached)
                times[kind] += [seconds] if i else []
    t = {k: statistics.median(v) for k, v in times.items()}
    return {"projector": args.projector, "size": args.size, "prompt_tokens": done.prompt_tokens,
            "cached_tokens_on_resend": done.cached_tokens, "seconds": t,
            "ratio_resend_afresh": t["resend"] / t["afresh"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--projector", choices=PROJECTORS, default="idefics3")
    p.add_argument("--size", choices=["small", "full"], default="full")
    p.add_argument("--runs", type=int, default=5, help="afresh / resend pairs (default 5)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    log = RunLog()
    print(log.header())
    with tempfile.TemporaryDirectory() as folder:
        lm, mmproj, image = written_apart(write_pair, folder, args.projector, args.size)
        print(json.dumps(measure(args, lm, mmproj, image, log)))
    print(log.summary())


if __name__ == "__main__":
    main()
