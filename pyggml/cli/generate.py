"""`pyggml generate`: continue a prompt with a GGUF model (default SmolLM2 135M Instruct) and report speed and
memory like llama.cpp does."""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

from pyggml.cli.model_options import add_model_options, add_sampling_options, open_model, sampling_params
from pyggml.cli.speculative import add_arguments as add_speculative_arguments
from pyggml.errors import ImageError, ParameterError

MIB = 1024 * 1024
DEFAULT_PROMPT = "The capital of France is"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text with a GGUF model")
    p.add_argument("prompt", nargs="?", default=None, help=f"the text to continue (default: {DEFAULT_PROMPT!r})")
    p.add_argument("-p", "--prompt", dest="prompt_option", metavar="PROMPT", help="the prompt, as llama.cpp's -p")
    p.add_argument("-f", "--file", metavar="FILE", help="read the prompt from this file ('-': standard input)")
    add_model_options(p)
    p.add_argument("-n", type=int, default=32, help="tokens to generate (-1: until the end of text or a full context)")
    add_sampling_options(p, temp=0.0)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--image", action="append", default=[],
                   help="an image for the prompt (needs --mmproj; may be given more than once; put <__media__> "
                        "in the prompt where each goes, else they come first)")
    add_speculative_arguments(p)
    p.set_defaults(run=run)


def read_prompt(args) -> str:
    """The prompt from -f FILE, -p, or the positional argument (one of them), else the default."""
    given = [x for x in (args.prompt, args.prompt_option, args.file) if x is not None]
    if len(given) > 1:
        raise ParameterError("give the prompt once: as an argument, with -p, or with -f FILE")
    if args.file == "-":
        return sys.stdin.read()
    if args.file is not None:
        try:
            return Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ParameterError(f"-f {args.file}: cannot read the prompt: {e}") from None
    return given[0] if given else DEFAULT_PROMPT


def run(args) -> int:
    from pyggml.cli.speculative import generate as speculative_generate
    from pyggml.cli.speculative import open_drafter
    from pyggml.core.jit import compile_seconds, when_compiling
    from pyggml.models.llm.generate import check_n_predict

    prompt = read_prompt(args)
    check_n_predict(args.n)  # nonsense counts and thresholds fail before the model loads
    sampling = sampling_params(args)
    if args.image and not args.mmproj:
        raise ImageError("--image needs the model's vision projector: --mmproj FILE")
    if args.image and (args.model_draft or args.spec_type != "none"):
        raise ParameterError("--image does not combine with speculative decoding (nor does llama-server's mtmd)")
    when_compiling(lambda: print("compiling kernels (once: they are cached for later runs)", file=sys.stderr,
                                 flush=True))
    start, compiled = time.perf_counter(), compile_seconds()
    model = open_model(args)
    load_compile_s = compile_seconds() - compiled
    load_s = time.perf_counter() - start - load_compile_s
    drafter = open_drafter(args, model, 1)
    print(prompt, end="", flush=True)
    if drafter is None:
        model.generate(prompt, n=args.n, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                       min_p=args.min_p, repeat_penalty=args.repeat_penalty, seed=args.seed, chat=args.chat,
                       images=args.image, stream=lambda piece: print(piece, end="", flush=True))
    else:
        speculative_generate(model, drafter, model.prompt_ids(prompt, args.chat), args.n, sampling,
                             lambda piece: print(piece, end="", flush=True))
    print()
    for line in report_lines(model, load_s, load_compile_s):
        print(line, file=sys.stderr)
    return 0


def report_lines(model, load_s: float, load_compile_s: float = 0.0) -> list[str]:
    """llama.cpp's timings, with the seconds spent compiling kernels (a first run's) on a line of their own."""
    t = model.timings
    compile_s = load_compile_s + t.compile_s
    plan = model.reserved_plan
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return [
        f"load:    {load_s:8.2f} s  ({model.architecture}, {model.arch.n_layer} layers, n_ctx {model.n_ctx}; "
        f"{model.runner.describe()})",
        f"prompt:  {t.prompt_tokens:5d} tokens in {t.prompt_s:7.2f} s = {t.prompt_tps:8.2f} tokens/s",
        f"eval:    {t.gen_tokens:5d} tokens in {t.gen_s:7.2f} s = {t.gen_tps:8.2f} tokens/s",
        *([f"compile: {compile_s:8.2f} s  (kernels compiled in this run, counted in neither load nor prompt; "
           f"cached for later runs)"] if compile_s else []),
        f"weights: {model.weights.nbytes / MIB:10.2f} MiB "
        f"(GGUF tensors {model.weights.file_tensor_bytes / MIB:.2f} MiB)",
        f"KV cache:{model.kv.nbytes / MIB:10.2f} MiB",
        f"compute: {model.compute_buffer_size / MIB:10.2f} MiB (ggml's planner: {plan.ggml_size / MIB:.2f} MiB, "
        f"lower bound {plan.lower_bound / MIB:.2f} MiB)",
        f"peak RSS:{peak_rss / MIB:10.2f} MiB",
    ]
