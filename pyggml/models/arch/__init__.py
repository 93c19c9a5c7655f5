"""Model architectures, one module each, found by the GGUF's `general.architecture`."""

from __future__ import annotations

from pyggml.errors import GGUFError
from pyggml.models.arch.bert import Bert
from pyggml.models.arch.gemma2 import Gemma2
from pyggml.models.arch.gemma3 import Gemma3
from pyggml.models.arch.gpt2 import GPT2
from pyggml.models.arch.gpt_oss import GptOss
from pyggml.models.arch.granite import Granite, GraniteMoE
from pyggml.models.arch.llama import Llama, Qwen2
from pyggml.models.arch.nomic_bert import NomicBert
from pyggml.models.arch.olmo2 import Olmo2
from pyggml.models.arch.phi3 import Phi3
from pyggml.models.arch.qwen2moe import Qwen2MoE
from pyggml.models.arch.qwen2vl import Qwen2VL
from pyggml.models.arch.qwen3 import Qwen3
from pyggml.models.arch.qwen3moe import Qwen3MoE
from pyggml.models.arch.smollm3 import SmolLM3
from pyggml.models.arch.starcoder2 import StarCoder2

# llama.cpp's names (llm_arch_from_string); Mistral's files are `llama` (llama.cpp has no `mistral` architecture)
ARCHITECTURES = {"gemma3": Gemma3, "llama": Llama, "qwen2": Qwen2, "gpt2": GPT2, "qwen3": Qwen3, "smollm3": SmolLM3,
                 "granite": Granite, "gemma2": Gemma2, "phi3": Phi3}
ARCHITECTURES |= {"qwen3moe": Qwen3MoE, "gpt-oss": GptOss, "olmo2": Olmo2, "qwen2moe": Qwen2MoE,
                  "granitemoe": GraniteMoE, "starcoder2": StarCoder2, "qwen2vl": Qwen2VL}
ARCHITECTURES |= {"bert": Bert, "nomic-bert": NomicBert}  # encoders: embedding models (Model.embed)


def architecture_of(gguf):
    """The class that builds graphs for this file's architecture; GGUFError naming the supported ones if pyggml
    has none (checked before loading)."""
    arch = gguf.architecture
    try:
        return ARCHITECTURES[arch]
    except KeyError:
        raise GGUFError(f"{gguf.path}: architecture '{arch}' is not supported "
                        f"(supported: {', '.join(sorted(ARCHITECTURES))})") from None
