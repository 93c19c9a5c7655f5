"""The model options every command that loads a language model takes (generate, chat, serve), added and opened
in one place so they mean the same everywhere: --model/-m, --threads/-t, --ctx/-c, --batch/-b, --backend,
--rpc, --weights, --kv-type/-ctk/-ctv, --flash-attn/-fa, --mmproj, --image-cache, --lora."""

from __future__ import annotations

from pyggml.cli.args import non_negative_int, positive_int
from pyggml.cli.lora import add_lora_options, lora_specs

DEFAULT_CTX = 4096  # one default for every command (llama.cpp's CLI and server took 4096 too)


def kv_type_names() -> list[str]:
    from pyggml.models.llm.model import KV_TYPES

    return [t.name for t in KV_TYPES]


def add_backend_options(p) -> None:
    """--backend and --threads/-t, which Whisper's commands take too."""
    p.add_argument("--backend", default="CPU",
                   help="backend name, or several comma-separated (CPU,TORCH_CPU,...) to split the layers across "
                        "them with the scheduler")
    p.add_argument("--threads", "-t", type=positive_int, default=None, help="CPU threads (default: all cores)")


def add_model_options(p) -> None:
    from pyggml.models.llm.known_models import DEFAULT_MODEL, KNOWN_MODELS

    p.add_argument("--model", "-m", default=DEFAULT_MODEL,
                   help=f"GGUF file, or an installed model's name ({', '.join(KNOWN_MODELS)})")
    add_backend_options(p)
    p.add_argument("--ctx", "-c", type=positive_int, default=DEFAULT_CTX, help="context size in tokens")
    p.add_argument("--batch", "-b", type=positive_int, default=512, help="prompt tokens per step")
    p.add_argument("--rpc", help="RPC servers host:port[,host:port...] (pyggml or ggml rpc-server): the layers are "
                                 "split across their devices and the local CPU by free memory, as llama.cpp's --rpc "
                                 "(the weights go as the file holds them)")
    p.add_argument("--weights", default="quantized", choices=["quantized", "f32"],
                   help="quantized: weights stay in the file's block formats, mapped; f32: expanded to float32 at "
                        "load (4 bytes a weight)")
    p.add_argument("--kv-type", default="F16", type=str.upper, choices=kv_type_names(),
                   help="KV cache type of K and V (F16 as llama.cpp; F32: twice the memory, no rounding; Q8_0, Q4_0: "
                        "0.53x and 0.28x of F16's memory, attended with flash attention)")
    p.add_argument("--cache-type-k", "-ctk", type=str.upper, choices=kv_type_names(),
                   help="KV cache type of K alone, as llama.cpp's -ctk (default: --kv-type)")
    p.add_argument("--cache-type-v", "-ctv", type=str.upper, choices=kv_type_names(),
                   help="KV cache type of V alone, as llama.cpp's -ctv (default: --kv-type)")
    p.add_argument("--flash-attn", "-fa", default="auto", choices=["on", "off", "auto"],
                   help="attend with flash attention, as llama.cpp's -fa (auto: when the KV cache is quantized, "
                        "which needs it; on: also with F16, where a cell the mask hides is never read, so many "
                        "sequences in one cache each pay for their own cells)")
    p.add_argument("--mmproj", help="vision projector GGUF (llama.cpp's mmproj file): prompts may then hold images")
    p.add_argument("--image-cache", type=non_negative_int, default=64, metavar="MIB",
                   help="MiB of image embeddings kept by content, so an image sent again is not encoded again "
                        "(default 64)")
    add_lora_options(p)


def add_sampling_options(p, temp: float) -> None:
    """llama.cpp's sampler settings, as generate and chat take them (`temp`: the command's default)."""
    p.add_argument("--temp", type=float, default=temp, help="temperature; 0 = greedy")
    p.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling threshold")
    p.add_argument("--min-p", type=float, default=0.05, help="drop tokens below this share of the most likely")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="penalty on repeated tokens (1: none)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")


def sampling_params(args):
    """The SamplingParams of add_sampling_options' values (ParameterError for nonsense)."""
    from pyggml.models.llm.generate import SamplingParams

    return SamplingParams(args.temp, args.top_k, args.top_p, args.min_p, args.repeat_penalty, seed=args.seed)


def open_model(args, **kwargs):
    """load_model with the options' values (keywords such as n_seq_max go through)."""
    from pyggml.models import load_model

    backend = args.backend
    if args.rpc:
        from pyggml.backend import rpc

        devices = [dev for endpoint in args.rpc.split(",") for dev in rpc.add_server(endpoint.strip())]
        backend = [dev.init_backend() for dev in devices] + backend.split(",")
    return load_model(args.model, backend=backend, n_ctx=args.ctx, n_batch=args.batch, weights=args.weights,
                      kv_type=args.kv_type, kv_type_k=args.cache_type_k, kv_type_v=args.cache_type_v,
                      n_threads=args.threads, lora=lora_specs(args), mmproj=args.mmproj,
                      image_cache=args.image_cache << 20,
                      flash_attn={"on": True, "off": False, "auto": None}[args.flash_attn], **kwargs)
