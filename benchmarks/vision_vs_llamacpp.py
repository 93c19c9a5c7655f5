"""Encoding one image: pyggml's vision encoder against llama.cpp's mtmd (llama-cpp-python) on the same random-weight
mmproj file, in the same run: seconds per image and compute buffer, and the ratios pyggml / llama.cpp.

Each side runs in its own process, --repeat rounds alternating; a process encodes one image of the encoder's size
--warmup times untimed, then --runs times timed (the median is its figure); the medians over the rounds are
compared. llama.cpp's compute buffer is read from its own log line ("compute buffer size"); both sides take their
defaults on a CPU: flash attention on, weights as the file holds them (F16 matrices here, as mmproj files ship).
The load average at each side's start is printed.

    python -m benchmarks.vision_vs_llamacpp --size full --llama-python /path/to/venv-with-llama_cpp/bin/python
    python -m benchmarks.vision_vs_llamacpp --size small --repeat 1    # a quick check that it all runs

--size full is SmolVLM-256M's encoder (93M parameters, 512 px), Gemma 3 4B's (SigLIP so400m, 896 px) and
Qwen2.5-VL-3B's (675M parameters, window attention) on a 448 x 448 image (256 tokens). llama.cpp's warm-up reserves
Qwen2.5-VL's compute buffer for a 46 x 46-token image (1288 px), so its buffer is not compared there.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.peer_run import RunLog, differences, run_side, written_apart

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
QWEN25VL = "qwen2.5vl_merger"
PROJECTORS = ("idefics3", "gemma3", QWEN25VL)
SMALL = {"idefics3": dict(image_size=128, patch_size=16, n_embd=192, n_ff=768, n_layer=4, n_head=3,
                          projection_dim=192, scale_factor=4, longest_edge=512),
         "gemma3": dict(image_size=224, patch_size=14, n_embd=192, n_ff=768, n_layer=4, n_head=3,
                        projection_dim=256, scale_factor=4),
         QWEN25VL: dict(patch_size=14, n_embd=128, n_ff=256, n_layer=4, n_head=2, projection_dim=128, n_wa_pattern=2)}
QWEN_IMAGE_SIDE = {"full": 448, "small": 224}


def write_pair(folder: str, projector: str, size: str) -> tuple[str, str, str]:
    """An mmproj of the projector (F16 matrices), a one-layer language model as wide as its embeddings and a PNG
    of the encoder's size (Qwen2.5-VL: QWEN_IMAGE_SIDE)."""
    from gguf import GGMLQuantizationType

    from pyggml.testing.synthetic import write_gemma3, write_llama, write_qwen2vl
    from pyggml.testing.synthetic_vision import (GEMMA3_4B, QWEN25VL_3B, QWEN_IMAGE_TOKENS, SMOLVLM_256M,
                                                 vision_vocab, write_mmproj, write_qwen25vl_mmproj)

    mmproj, lm = Path(folder) / f"{projector}-{size}-mmproj.gguf", Path(folder) / f"{projector}-{size}-lm.gguf"
    image = Path(folder) / f"{projector}-{size}.png"
    if projector == QWEN25VL:
        params = QWEN25VL_3B if size == "full" else SMALL[projector]
        write_qwen25vl_mmproj(mmproj, **params, qtype=GGMLQuantizationType.F16)
        n_embd = params["projection_dim"]
        write_qwen2vl(lm, vocab=vision_vocab(QWEN_IMAGE_TOKENS), n_embd=n_embd, n_head=n_embd // 64, n_head_kv=1,
                      n_ff=64, n_layer=1, sections=(8, 12, 12, 0))
        image.write_bytes(square_png(QWEN_IMAGE_SIDE[size]))
        return str(lm), str(mmproj), str(image)
    params = ({"idefics3": SMOLVLM_256M, "gemma3": GEMMA3_4B}[projector] if size == "full"
              else {"projector": projector, **SMALL[projector]})
    write_mmproj(mmproj, **params, qtype=GGMLQuantizationType.F16)
    n_embd = params["projection_dim"]
    if projector == "gemma3":
        write_gemma3(lm, vocab=vision_vocab(), n_embd=n_embd, n_head=4, n_head_kv=1, head_dim=64, n_ff=64,
                     n_layer=1)
    else:
        write_llama(lm, vocab=vision_vocab(), n_embd=n_embd, n_head=n_embd // 64, n_head_kv=1, n_ff=64, n_layer=1)
    image.write_bytes(square_png(params["image_size"]))
    return str(lm), str(mmproj), str(image)


def square_png(side: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (side, side, 3), np.uint8)).save(out, format="PNG")
    return out.getvalue()


def timed(encode, warmup: int, runs: int) -> list[float]:
    for _ in range(warmup):
        encode()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        encode()
        times.append(time.perf_counter() - start)
    return times


def side_pyggml(args) -> dict:
    from pyggml.models.vision.encoder import VisionEncoder
    from pyggml.models.vision.preprocess import decode_image, preprocess

    encoder = VisionEncoder(args.mmproj)
    tile = preprocess(decode_image(args.image), encoder.hparams).tiles[0]
    times = timed(lambda: encoder.encode(tile), args.warmup, args.runs)
    return {"seconds": statistics.median(times), "compute_buffer": encoder.compute_buffer_size}


def side_llamacpp(args) -> dict:
    """Needs only llama_cpp (it runs under --llama-python)."""
    import ctypes

    import llama_cpp
    from llama_cpp import mtmd_cpp as mtmd


    llm = llama_cpp.Llama(model_path=args.lm, n_ctx=512, n_threads=args.threads, verbose=False)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings, params.warmup = False, args.threads, False, True
    ctx = mtmd.mtmd_init_from_file(args.mmproj.encode(), llm.model, params)
    data = Path(args.image).read_bytes()
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(data), False)
    chunks = mtmd.mtmd_input_chunks_init()
    text = mtmd.mtmd_input_text(b"<__media__>", len(b"<__media__>"), True, True)
    mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1)
    all_chunks = [mtmd.mtmd_input_chunks_get(chunks, i) for i in range(mtmd.mtmd_input_chunks_size(chunks))]
    image = next(c for c in all_chunks if mtmd.mtmd_input_chunk_get_type(c) != 0)  # the first image chunk
    times = timed(lambda: mtmd.mtmd_encode_chunk(ctx, image), args.warmup, args.runs)
    return {"seconds": statistics.median(times)}


def compute_buffer_from_log(stderr: str) -> int | None:
    """llama.cpp's clip compute buffer (its warm-up reserves it for an image of the encoder's size)."""
    sizes = [float(m) for m in re.findall(r"compute buffer size = +([0-9.]+) MiB", stderr)]
    return int(sum(sizes) * MIB) if sizes else None


def compare(args, projector: str, lm: str, mmproj: str, image: str, log: RunLog) -> dict:
    rounds = {"pyggml": [], "llama.cpp": []}
    buffers = {}
    for _ in range(args.repeat):
        for side, python in (("pyggml", sys.executable), ("llama.cpp", args.llama_python)):
            log.start(f"{projector} {side}")
            cmd = [python, "-m", "benchmarks.vision_vs_llamacpp", "--side", side, "--lm", lm, "--mmproj", mmproj,
                   "--image", image, "--runs", str(args.runs), "--warmup", str(args.warmup),
                   "--threads", str(args.threads)]
            result, stderr = run_side(cmd, side, args.threads, REPO)
            rounds[side].append(result["seconds"])
            buffers[side] = result.get("compute_buffer") or compute_buffer_from_log(stderr)
    if projector == QWEN25VL:
        buffers["llama.cpp"] = None  # reserved for its warm-up's 1288 px image, not this one
    t = {side: statistics.median(v) for side, v in rounds.items()}
    row = {"projector": projector, "seconds": t, "compute_buffer_mib": {k: v and v / MIB for k, v in buffers.items()},
           "time_ratio": t["pyggml"] / t["llama.cpp"]}
    if buffers["llama.cpp"]:
        row["buffer_ratio"] = buffers["pyggml"] / buffers["llama.cpp"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--projector", choices=[*PROJECTORS, "all"], default="all")
    p.add_argument("--size", choices=["small", "full"], default="full")
    p.add_argument("--repeat", type=int, default=3, help="rounds, sides alternating (default 3)")
    p.add_argument("--runs", type=int, default=3, help="timed encodes per process (default 3)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-python", default=sys.executable, help="a Python that has llama_cpp")
    p.add_argument("--json", help="write the rows here too")
    p.add_argument("--side", choices=["pyggml", "llama.cpp"], help=argparse.SUPPRESS)
    p.add_argument("--lm", help=argparse.SUPPRESS)
    p.add_argument("--mmproj", help=argparse.SUPPRESS)
    p.add_argument("--image", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        print(json.dumps(side_pyggml(args) if args.side == "pyggml" else side_llamacpp(args)))
        return
    log = RunLog()
    print(log.header())
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for projector in (PROJECTORS if args.projector == "all" else [args.projector]):
            lm, mmproj, image = written_apart(write_pair, folder, projector, args.size)
            rows.append(row := compare(args, projector, lm, mmproj, image, log))
            print(json.dumps(row))
    print(differences([("attention", "flash (F16 K/V)", "flash (auto)"), ("threads", str(args.threads),
                                                                          str(args.threads))],
                      ("pyggml", "llama.cpp")))
    print(log.summary())
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
