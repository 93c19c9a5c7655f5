"""An mmproj GGUF as llama.cpp's clip.cpp reads it: the vision hyperparameters (`clip.vision.*`) and the projector
type (`clip.projector_type`), with the same keys, defaults and refusals (tools/mtmd/clip-impl.h, load_hparams).

Qwen2.5-VL's files (`qwen2.5vl_merger`) add `clip.vision.n_wa_pattern` (every n-th layer attends the whole image,
the others windows of WINDOW_PIXELS) and `clip.vision.spatial_merge_size` (2 by default); its images keep their
aspect and size (within token limits), so `image_size` is not the input's size there."""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.errors import GGUFError

PROJECTORS = ("idefics3", "gemma3", "qwen2.5vl_merger")  # llama.cpp's projector type names that pyggml builds
QWEN25VL = "qwen2.5vl_merger"
WINDOW_PIXELS = 112  # Qwen2.5-VL's attention window side in pixels (clip.cpp's default; its files do not set it)
QWEN_TOKENS_MIN, QWEN_TOKENS_MAX = 8, 4096  # clip.cpp's image token limits for Qwen-VL (set_limit_image_tokens)


@dataclass(frozen=True)
class VisionHParams:
    projector: str
    image_size: int        # the encoder's input side (a tile's side for idefics3)
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    projection_dim: int
    eps: float
    image_mean: tuple
    image_std: tuple
    use_gelu: bool         # gelu (tanh) in the FFN, else gelu_quick (llama.cpp's default)
    scale_factor: int      # idefics3's pixel shuffle, gemma3's pooling kernel (llama.cpp's n_merge)
    longest_edge: int      # idefics3: the longer side images are resized to before tiling (0: none)
    use_silu: bool = False  # silu in the FFN (Qwen2.5-VL's gated one)
    n_wa_pattern: int = 0  # qwen2.5vl: layers il with (il + 1) % n_wa_pattern == 0 attend fully (0: all do)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_patches_side(self) -> int:
        return self.image_size // self.patch_size


def _count(gguf, key: str, default=None) -> int:
    value = gguf.get(key, default)
    if value is None:
        raise GGUFError(f"{gguf.path}: required metadata key '{key}' is missing (is this an mmproj file?)")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GGUFError(f"{gguf.path}: metadata key '{key}' is {value!r}; expected an integer >= 0")
    return value


def _triple(gguf, key: str) -> tuple:
    value = gguf.get(key)
    values = [] if value is None else list(value.tolist() if hasattr(value, "tolist") else value)
    if len(values) < 3:
        raise GGUFError(f"{gguf.path}: metadata key '{key}' must hold 3 numbers (R, G, B), got {value!r}")
    return tuple(float(v) for v in values[:3])


def read_hparams(gguf) -> VisionHParams:
    """The vision encoder's hyperparameters; GGUFError naming the key for a missing or bad one, or for a projector
    pyggml does not build."""
    projector = gguf.get("clip.projector_type") or gguf.get("clip.vision.projector_type")
    if projector not in PROJECTORS:
        raise GGUFError(f"{gguf.path}: projector type {projector!r} is not supported "
                        f"(supported: {', '.join(PROJECTORS)})")
    v = "clip.vision."
    h = VisionHParams(
        projector=projector, image_size=_count(gguf, v + "image_size"), patch_size=_count(gguf, v + "patch_size"),
        n_embd=_count(gguf, v + "embedding_length"), n_ff=_count(gguf, v + "feed_forward_length"),
        n_layer=_count(gguf, v + "block_count"), n_head=_count(gguf, v + "attention.head_count"),
        projection_dim=_count(gguf, v + "projection_dim", 0), eps=float(gguf.get(v + "attention.layer_norm_epsilon",
                                                                                  1e-6)),
        image_mean=_triple(gguf, v + "image_mean"), image_std=_triple(gguf, v + "image_std"),
        use_gelu=bool(gguf.get("clip.use_gelu", False)), use_silu=bool(gguf.get("clip.use_silu", False)),
        scale_factor=(_count(gguf, v + "spatial_merge_size", 2) if projector == QWEN25VL
                      else _count(gguf, v + "projector.scale_factor", 4 if projector == "gemma3" else 1)),
        longest_edge=_count(gguf, v + "preproc_image_size", 0),
        n_wa_pattern=_count(gguf, v + "n_wa_pattern") if projector == QWEN25VL else 0)
    if h.use_gelu and h.use_silu:
        raise GGUFError(f"{gguf.path}: clip.use_gelu and clip.use_silu are both true")
    for key, n in (("patch_size", h.patch_size), ("attention.head_count", h.n_head), ("image_size", h.image_size),
                   ("block_count", h.n_layer)):
        if n < 1:
            raise GGUFError(f"{gguf.path}: metadata key '{v}{key}' is {n}; expected a positive integer")
    if h.image_size % h.patch_size or h.n_embd % h.n_head or h.n_patches_side % h.scale_factor:
        raise GGUFError(f"{gguf.path}: image_size {h.image_size}, patch_size {h.patch_size}, scale_factor "
                        f"{h.scale_factor} and {h.n_head} heads of embedding_length {h.n_embd} do not divide evenly")
    if projector == QWEN25VL and (h.scale_factor != 2 or h.head_dim % 4):
        raise GGUFError(f"{gguf.path}: qwen2.5vl_merger needs spatial_merge_size 2 and a head size divisible by 4, "
                        f"got {h.scale_factor} and {h.head_dim}")
    return h
