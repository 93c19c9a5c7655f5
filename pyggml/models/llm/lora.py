"""LoRA adapters in GGUF, as llama.cpp's convert_lora_to_gguf.py writes them and llama-adapter.cpp loads them.

An adapter file has `general.type` "adapter", `adapter.type` "lora", `adapter.lora.alpha` and, for each matrix W
of the base model it adapts, `<W's name>.lora_a` (ggml [n_in, rank]) and `<W's name>.lora_b` ([rank, n_out]).
Every projection of a step's graph goes through arch/layers.py's lora_mm, which adds scale·B(A·x) for each
active adapter that adapts its matrix, scale = alpha / rank · the adapter's scale (alpha 0: the scale alone).

The scales can change between steps without reloading (`Model.set_lora_scales`: llama-server's
/lora-adapters and per-request `lora`); an adapter of scale 0 is left out of the graph, as llama.cpp leaves it.
Adapters of the token embeddings, of mixture-of-experts routers and experts, or of a reranker's head are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path

from pyggml.core import Tensor
from pyggml.errors import GGUFError, ParameterError
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.gguf.gguf_loader import load_weights

SUFFIXES = (".lora_a", ".lora_b")
# what llama.cpp adapts and pyggml does not yet: the embedding's rows (build_inp_embd), the router, the experts
# (build_lora_mm_id) and shared experts of MoE layers, a reranker's head
UNSUPPORTED = ("token_embd.", "ffn_gate_inp", "_exps.", "_shexp.", "cls.")


@dataclass
class LoraAdapter:
    """One adapter file's A and B matrices by the name of the base tensor they adapt."""

    path: str
    alpha: float
    pairs: dict[str, tuple[Tensor, Tensor]]
    weights: object = field(repr=False)   # the Weights holding the tensors' buffers (kept alive with them)

    @classmethod
    def load(cls, path, backend, base) -> LoraAdapter:
        """The adapter at `path`, on `backend`, checked against the base model's Weights `base` as llama.cpp
        checks it (GGUFError naming what is wrong): its type, architecture, pairs and shapes."""
        gguf = GGUFFile.open(path)
        try:
            for key, want in (("general.type", "adapter"), ("adapter.type", "lora")):
                if gguf.get(key) != want:
                    raise GGUFError(f"{path}: metadata key '{key}' is {gguf.get(key)!r}; a LoRA adapter has {want!r}")
            if gguf.architecture != base.gguf.architecture:
                raise GGUFError(f"{path}: a LoRA adapter for '{gguf.architecture}', but the model is "
                                f"'{base.gguf.architecture}'")
            alpha = gguf.get("adapter.lora.alpha", 0.0)
            if isinstance(alpha, bool) or not isinstance(alpha, Real):
                raise GGUFError(f"{path}: metadata key 'adapter.lora.alpha' is {alpha!r}; expected a number")
            weights = load_weights(gguf, backend, progress=False)
        except BaseException:
            gguf.close()
            raise
        return cls(str(path), float(alpha), _pairs(path, weights.tensors, base.tensors), weights)

    def get(self, name: str) -> tuple[Tensor, Tensor] | None:
        """(A, B) for the base tensor of this name, or None where the adapter leaves it as it is."""
        return self.pairs.get(name)

    def scale(self, pair: tuple[Tensor, Tensor], user_scale: float) -> float:
        """llama.cpp's llama_adapter_lora_weight::get_scale: user_scale · alpha / rank (alpha 0: user_scale)."""
        rank = pair[1].ne[0]
        return user_scale * self.alpha / rank if self.alpha else user_scale


def _pairs(path, tensors: dict, base: dict) -> dict:
    """{base name: (A, B)} of the adapter's tensors, refusing what llama.cpp refuses."""
    halves: dict[str, dict[str, Tensor]] = {}
    for name, t in tensors.items():
        suffix = next((s for s in SUFFIXES if name.endswith(s)), None)
        if suffix is None:
            raise GGUFError(f"{path}: LoRA tensor '{name}' has unexpected suffix (expected .lora_a or .lora_b)")
        halves.setdefault(name[:-len(suffix)], {})[suffix] = t
    pairs = {}
    for name, half in halves.items():
        if len(half) != 2:
            raise GGUFError(f"{path}: LoRA tensor pair for '{name}' is missing one component")
        if name not in base:
            raise GGUFError(f"{path}: LoRA tensor '{name}' does not exist in the base model (wrong base model?)")
        if any(part in name for part in UNSUPPORTED):
            raise GGUFError(f"{path}: a LoRA of '{name}' is not supported (pyggml adapts the attention, dense FFN "
                            f"and output matrices)")
        a, b, w = half[".lora_a"], half[".lora_b"], base[name]
        if w.ne[0] != a.ne[0] or w.ne[1] != b.ne[1]:
            raise GGUFError(f"{path}: LoRA tensors of '{name}' have shapes {a.ne[:2]} and {b.ne[:2]}, which do not "
                            f"fit its {w.ne[:2]} (wrong base model?)")
        if a.ne[1] != b.ne[0]:
            raise GGUFError(f"{path}: '{name}.lora_a' is not transposed (rank {a.ne[1]} against {b.ne[0]})")
        pairs[name] = (a, b)
    return pairs


class LoraSet:
    """A model's adapters and their current scales (llama-server's /lora-adapters list: ids are positions)."""

    def __init__(self, adapters: list[LoraAdapter], scales: list[float]):
        self.adapters, self.scales = adapters, list(scales)

    @classmethod
    def load(cls, specs, backend, base) -> LoraSet:
        """`specs`: (path, scale) pairs or paths (scale 1), as `load_model(lora=...)` takes them."""
        adapters, scales = [], []
        for spec in specs or ():
            path, scale = (spec, 1.0) if isinstance(spec, (str, Path)) else spec
            adapters.append(LoraAdapter.load(path, backend, base))
            scales.append(check_scale(scale, f"lora scale of {path}"))
        return cls(adapters, scales)

    def active(self) -> tuple:
        """(adapter, scale) of the adapters a step adds (those of scale 0 are left out, as in llama.cpp)."""
        return tuple((a, s) for a, s in zip(self.adapters, self.scales, strict=True) if s != 0)

    def every(self) -> tuple:
        """Every adapter at scale 1: the worst-case step the compute buffers are reserved for."""
        return tuple((a, 1.0) for a in self.adapters)

    def set_scales(self, scales: dict[int, float]) -> bool:
        """Set the scales of the adapters by id (the others keep theirs); whether any changed."""
        for i, scale in scales.items():
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.adapters):
                raise ParameterError(f"lora id {i!r} is not one of the {len(self.adapters)} loaded adapters")
            check_scale(scale, f"lora {i} scale")
        changed = any(self.scales[i] != float(s) for i, s in scales.items())
        for i, scale in scales.items():
            self.scales[i] = float(scale)
        return changed

    def describe(self) -> list[dict]:
        """llama-server's GET /lora-adapters entries."""
        return [{"id": i, "path": a.path, "scale": s} for i, (a, s) in enumerate(zip(self.adapters, self.scales,
                                                                                       strict=True))]


def check_scale(scale, what: str) -> float:
    if isinstance(scale, bool) or not isinstance(scale, Real) or scale != scale:
        raise ParameterError(f"{what} must be a number, got {scale!r}")
    return float(scale)
