"""The random-weight models pyggml is compared with llama.cpp on, one per case: every architecture, GQA
with n_head not a multiple of 4, rope NORMAL (llama) and NEOX (qwen2, gemma3), tied and separate
output, real BPE and SentencePiece token lists, F32 and each quantized type gguf can write or read.

A case's file is rewritten from its seed wherever it is needed; a SHA-256 of its contents is recorded with llama.cpp's
logits (data/llamacpp_logits.npz, written by data/make_llamacpp_refs.py), so a writer or gguf change that
alters the file is caught instead of compared against another model's references.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.testing.agreement import F32_BOUND
from pyggml.testing.synthetic import (llama3_rope_freqs, write_gpt_oss, write_mixtral, write_olmo2, write_qwen2moe,
                                      write_qwen3moe, write_starcoder2)

from tests.support.tiny_models import (bpe_vocab, gemma3_vocab, write_gemma2, write_gemma3, write_gpt2, write_granite,
                                      write_llama, write_phi3, write_qwen3, write_smollm3)

N_TOKENS = 32          # teacher-forced positions per case (BOS first)
N_BATCH = 12           # pyggml's batch: later batches attend to earlier ones through the KV cache
N_CTX = 64


@dataclass(frozen=True)
class Case:
    name: str
    write: object                  # path -> path
    quantized: bool = False        # compared with the F32-weights yardstick rather than the F32 bound
    bos: int = 1
    n_vocab: int = 0
    notes: str = field(default="", compare=False)
    n_tokens: int = N_TOKENS
    n_ctx: int = N_CTX             # pyggml's context (llama.cpp's is the tokens')
    f32_bound: float = F32_BOUND   # the mean KLD allowed with F32 weights

    def tokens(self) -> list[int]:
        rng = np.random.default_rng(len(self.name))
        return [self.bos] + rng.integers(4, self.n_vocab, self.n_tokens - 1).tolist()


def _spm(n=1024):
    return gemma3_vocab().resized(n)


def _bpe(pre):
    return bpe_vocab(pre)


BPE_N = 459            # the BPE vocabularies' size (256 bytes, 200 merges, 3 specials)
GEMMA_BOS, BPE_BOS = 2, 456
K_MIX = {"attn_q": Q.Q2_K, "attn_k": Q.Q3_K, "attn_v": Q.Q6_K, "attn_output": Q.Q5_K, "ffn_down": Q.Q6_K,
         "ffn_up": Q.IQ4_XS, "ffn_gate": Q.IQ4_NL, "output": Q.Q6_K, "*": Q.Q4_K}
Q4_K_M_LIKE = {"token_embd": Q.Q8_0, "attn_v": Q.Q8_0, "ffn_down": Q.Q6_K, "attn_output": Q.Q4_K, "*": Q.Q5_0}


# Llama 3.1's layout scaled down: head_dim 64, base 500000, frequency factors for an original context of 256
# (so that pairs 0-1 keep 1, pair 2 is smoothed and the low-frequency rest is divided by 8).
LLAMA31 = dict(arch="llama", n_vocab=128, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_ctx=1024, freq_base=500000.0,
               rope_factors={"rope_freqs": llama3_rope_freqs(64, 500000.0, n_ctx_orig=256)})
# Phi-3-mini-128k's LongRoPE scaled down (training context 4 x the original: attn_factor sqrt(1.25)); with an
# original context of 256 llama.cpp's padded context (256) takes the short factors, with 32 the long ones.
PHI3_SHORT = dict(n_embd=96, n_head=4, n_head_kv=4, n_ff=160, n_ctx=1024, n_ctx_orig=256)
PHI3_LONG = dict(n_embd=192, n_head=6, n_head_kv=2, rope_dims=24, n_ff=256, n_ctx=128, n_ctx_orig=32, tied=True)
GEMMA2_CAPS = dict(n_layer=4, sliding_window=8, swa_pattern=[True, False, False, True], freq_base_swa=20000.0,
                   attn_softcap=2.0, final_softcap=5.0)
QWEN2_YARN = dict(arch="qwen2", n_vocab=128, n_embd=128, n_head=4, n_head_kv=2, n_ff=192, n_ctx=128,
                  rope_scaling={"type": "yarn", "factor": 4.0, "original_context_length": 32})


def _llama(arch, vocab, **kw):
    return lambda p: write_llama(p, arch, vocab=vocab(), n_ctx=N_CTX, **kw)


CASES = [
    Case("llama-f32-spm", _llama("llama", _spm, n_vocab=1024, n_embd=96, n_head=6, n_head_kv=2, n_ff=160,
                                 output_std=0.3), bos=GEMMA_BOS, n_vocab=1024,
         notes="rope NORMAL, GQA 6/2, separate output"),
    Case("llama-f32-bpe-tied", _llama("llama", partial(_bpe, "llama3"), n_vocab=BPE_N, n_embd=144, n_head=9,
                                        n_head_kv=3, n_ff=192, tied=True, seed=1),
         bos=BPE_BOS, n_vocab=BPE_N, notes="mistral-style: GQA 9/3, tied output (llama.cpp has no mistral arch)"),
    Case("qwen2-f32-bpe", _llama("qwen2", partial(_bpe, "qwen2"), n_vocab=BPE_N, n_embd=96, n_head=6, n_head_kv=2,
                                 n_ff=160, seed=2),
         bos=BPE_BOS, n_vocab=BPE_N, notes="rope NEOX, q/k/v biases"),
    Case("gemma3-f32-spm", lambda p: write_gemma3(p, vocab=_spm(), n_vocab=1024, n_ctx=N_CTX, seed=3),
         bos=GEMMA_BOS, n_vocab=1024, notes="7 layers: sliding window 16 and a global layer, GQA 3/1, head_dim 32"),
    Case("gpt2-f32-bpe-tied", lambda p: write_gpt2(p, vocab=bpe_vocab("gpt-2"), n_vocab=BPE_N, n_head=4, n_ctx=N_CTX,
                                                    seed=4), bos=BPE_BOS, n_vocab=BPE_N),
    Case("gpt2-f32-bpe-untied", lambda p: write_gpt2(p, vocab=bpe_vocab("starcoder"), n_vocab=BPE_N, n_embd=96,
                                                      n_head=6, tied=False, n_ctx=N_CTX, seed=5),
         bos=BPE_BOS, n_vocab=BPE_N),
    Case("llama-q4_0", _llama("llama", _spm, n_vocab=1024, n_embd=96, n_head=6, n_head_kv=2, n_ff=160, qtype=Q.Q4_0,
                              output_std=0.3, seed=6), quantized=True, bos=GEMMA_BOS, n_vocab=1024),
    Case("llama-q4_1", _llama("llama", partial(_bpe, "default"), n_vocab=BPE_N, n_embd=96, n_head=6, n_head_kv=2,
                              n_ff=160, qtype=Q.Q4_1, seed=7), quantized=True, bos=BPE_BOS, n_vocab=BPE_N),
    Case("qwen2-q8_0", _llama("qwen2", partial(_bpe, "qwen2"), n_vocab=BPE_N, n_embd=96, n_head=6, n_head_kv=2,
                              n_ff=160, qtype=Q.Q8_0, tied=True, seed=8), quantized=True, bos=BPE_BOS, n_vocab=BPE_N),
    Case("llama-q5_0-q5_1", _llama("llama", partial(_bpe, "llama3"), n_vocab=BPE_N, n_embd=96, n_head=3,
                                     n_head_kv=1, n_ff=160, qtype={"ffn": Q.Q5_1, "*": Q.Q5_0},
                                     seed=9), quantized=True, bos=BPE_BOS, n_vocab=BPE_N),
    Case("llama-f16", _llama("llama", _spm, n_vocab=1024, n_embd=96, n_head=6, n_head_kv=2, n_ff=160, qtype=Q.F16,
                             output_std=0.3, seed=10), quantized=True, bos=GEMMA_BOS, n_vocab=1024),
    Case("llama-k-quants", _llama("llama", _spm, n_vocab=1024, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                                  qtype=K_MIX, seed=11), quantized=True, bos=GEMMA_BOS, n_vocab=1024,
         notes="Q2_K..Q6_K, IQ4_NL, IQ4_XS"),
    Case("gemma3-q4_k_m", lambda p: write_gemma3(p, vocab=_spm(), n_vocab=1024, n_embd=256, n_head=4, n_head_kv=1,
                                                 head_dim=64, n_ff=512, n_ctx=N_CTX, qtype=Q4_K_M_LIKE, seed=12,
                                                 embd_std=0.12),
         quantized=True, bos=GEMMA_BOS, n_vocab=1024, notes="Gemma 3 270M's mix of types"),
    Case("gpt2-q8_0", lambda p: write_gpt2(p, vocab=bpe_vocab("gpt-2"), n_vocab=BPE_N, n_ctx=N_CTX, qtype=Q.Q8_0,
                                            seed=13), quantized=True, bos=BPE_BOS, n_vocab=BPE_N),
    Case("qwen3-f32-bpe", partial(write_qwen3, vocab=bpe_vocab("qwen2"), n_vocab=BPE_N, n_ff=160, n_ctx=N_CTX, seed=19),
         bos=BPE_BOS, n_vocab=BPE_N, notes="per-head q/k norms, head_dim 32 with n_embd 64 / 4 heads, GQA 4/2"),
    Case("qwen3-q4_k_m", partial(write_qwen3, vocab=bpe_vocab("qwen2"), n_vocab=BPE_N, n_embd=256, head_dim=128,
                                 n_ff=512, n_ctx=N_CTX, qtype=Q4_K_M_LIKE, seed=20),
         quantized=True, bos=BPE_BOS, n_vocab=BPE_N),
    Case("smollm3-f32-spm", partial(write_smollm3, vocab=_spm(256), n_vocab=256, n_embd=96, n_head=6, n_head_kv=2,
                                    n_ff=160, n_ctx=N_CTX, seed=21),
         bos=GEMMA_BOS, n_vocab=256, notes="4 layers, NoPE on the 4th"),
    Case("smollm3-q4_0", partial(write_smollm3, vocab=_spm(256), n_vocab=256, n_embd=96, n_head=6, n_head_kv=2,
                                 n_ff=160, n_ctx=N_CTX, qtype=Q.Q4_0, seed=22),
         quantized=True, bos=GEMMA_BOS, n_vocab=256),
    Case("granite-f32-bpe", partial(write_granite, vocab=bpe_vocab("default"), n_vocab=BPE_N, n_ff=160, n_ctx=N_CTX,
                                    output_std=1.0, seed=23),
         bos=BPE_BOS, n_vocab=BPE_N, notes="embedding, attention, residual and logit scales"),
    Case("granite-q8_0", partial(write_granite, vocab=bpe_vocab("default"), n_vocab=BPE_N, n_ff=160, n_ctx=N_CTX,
                                 output_std=1.0, qtype=Q.Q8_0, seed=24),
         quantized=True, bos=BPE_BOS, n_vocab=BPE_N),
    Case("gemma3-f32-swa-keys", lambda p: write_gemma3(p, vocab=_spm(256), n_vocab=256, n_layer=4, sliding_window=8,
                                                       swa_pattern=[True, False, True, True], freq_base_swa=20000.0,
                                                       n_ctx=N_CTX, seed=18),
         bos=GEMMA_BOS, n_vocab=256, n_tokens=48, notes="sliding_window_pattern as bools, rope.freq_base_swa"),
    Case("llama31-f32-rope-freqs", partial(write_llama, **LLAMA31, seed=14), n_vocab=128, n_tokens=256, n_ctx=256,
         f32_bound=1e-8, notes="Llama 3.1's rope_freqs.weight (factors 1..8), 256 positions, base 500000"),
    Case("llama31-q4_k-rope-freqs", partial(write_llama, **LLAMA31, qtype=K_MIX, seed=15), quantized=True,
         n_vocab=128, n_tokens=64, n_ctx=64),
    Case("qwen2-f32-yarn", partial(write_llama, **QWEN2_YARN, seed=16), n_vocab=128, n_tokens=128, n_ctx=128,
         f32_bound=1e-8, notes="rope.scaling.type yarn, factor 4 over an original context of 32"),
    Case("qwen2-q8_0-yarn", partial(write_llama, **QWEN2_YARN, qtype=Q.Q8_0, seed=17), quantized=True, n_vocab=128,
         n_tokens=64, n_ctx=64),
]
# Mixture-of-experts models: quantized as llama.cpp's mixes leave them (the router F32; gpt-oss's experts MXFP4)
MOE_K_MIX = {"ffn_gate_inp": None, "ffn_down_exps": Q.Q6_K, "attn_v": Q.Q6_K, "output": Q.Q6_K, "*": Q.Q4_K}
GPT_OSS_MIX = {"ffn_gate_inp": None, "_exps": Q.MXFP4, "*": Q.Q8_0}
CASES += [
    Case("mixtral-f32-spm", partial(write_mixtral, vocab=_spm(256), n_vocab=256, n_embd=64, n_ff=96, n_ctx=N_CTX,
                                    seed=25),
         bos=GEMMA_BOS, n_vocab=256, notes="llama with 8 experts of which 2 are used, GQA 8/2"),
    Case("mixtral-k-quants", partial(write_mixtral, vocab=_spm(256), n_vocab=256, n_embd=256, n_ff=256,
                                     n_ctx=N_CTX, qtype=MOE_K_MIX, seed=26),
         quantized=True, bos=GEMMA_BOS, n_vocab=256, notes="Q4_K experts, Q6_K down experts, F32 router"),
    Case("qwen3moe-f32-bpe", partial(write_qwen3moe, vocab=bpe_vocab("qwen2"), n_vocab=BPE_N, n_ff=96, n_ctx=N_CTX,
                                     seed=27),
         bos=BPE_BOS, n_vocab=BPE_N, notes="16 experts of 32, 4 used, head_dim 32, GQA 4/1, q/k norms"),
    Case("qwen3moe-q8_0", partial(write_qwen3moe, vocab=bpe_vocab("qwen2"), n_vocab=BPE_N, n_ff=96, n_ctx=N_CTX,
                                  qtype={"ffn_gate_inp": None, "*": Q.Q8_0}, seed=28),
         quantized=True, bos=BPE_BOS, n_vocab=BPE_N),
    Case("qwen3moe-q4_k_m", partial(write_qwen3moe, vocab=bpe_vocab("qwen2"), n_vocab=BPE_N, n_embd=256, head_dim=64,
                                    n_ff=512, n_ff_exp=256, n_ctx=N_CTX, qtype=MOE_K_MIX, seed=37),
         quantized=True, bos=BPE_BOS, n_vocab=BPE_N, notes="Q4_K experts, Q6_K down experts, F32 router"),
    Case("gpt-oss-f32-bpe", partial(write_gpt_oss, vocab=bpe_vocab("default"), n_vocab=BPE_N, n_ctx=N_CTX, seed=29),
         bos=BPE_BOS, n_vocab=BPE_N, notes="sinks, window 8 on even layers, YaRN 4x over 32, biases, GQA 8/1"),
    Case("gpt-oss-mxfp4", partial(write_gpt_oss, vocab=bpe_vocab("default"), n_vocab=BPE_N, n_ctx=N_CTX,
                                  qtype=GPT_OSS_MIX, seed=30),
         quantized=True, bos=BPE_BOS, n_vocab=BPE_N, notes="MXFP4 experts, Q8_0 attention and embeddings"),
    Case("qwen2moe-f32-bpe", partial(write_qwen2moe, vocab=bpe_vocab("qwen2"), n_vocab=BPE_N, n_ctx=N_CTX, seed=34),
         bos=BPE_BOS, n_vocab=BPE_N, notes="8 experts of 32, 4 used, a shared expert of 128 gated by a sigmoid"),
    Case("qwen2moe-q4_0", partial(write_qwen2moe, vocab=bpe_vocab("qwen2"), n_vocab=BPE_N, n_ctx=N_CTX,
                                  qtype={"ffn_gate_inp": None, "*": Q.Q4_0}, seed=35),
         quantized=True, bos=BPE_BOS, n_vocab=BPE_N),
    Case("granitemoe-f32-shared", partial(write_granite, arch="granitemoe", vocab=bpe_vocab("default"), n_vocab=BPE_N,
                                          n_ff=64, n_expert=8, n_expert_used=2, n_ff_shexp=96, n_ctx=N_CTX,
                                          output_std=1.0, seed=36),
         bos=BPE_BOS, n_vocab=BPE_N, notes="granite's scales, 8 experts of 64 with 2 used, a shared expert"),
    Case("granitemoe-q8_0", partial(write_granite, arch="granitemoe", vocab=bpe_vocab("default"), n_vocab=BPE_N,
                                    n_ff=64, n_expert=8, n_expert_used=2, n_ff_shexp=96, n_ctx=N_CTX, output_std=1.0,
                                    qtype={"ffn_gate_inp": None, "*": Q.Q8_0}, seed=38),
         quantized=True, bos=BPE_BOS, n_vocab=BPE_N),
    Case("olmo2-f32-spm", partial(write_olmo2, vocab=_spm(256), n_vocab=256, n_ctx=N_CTX, seed=31),
         bos=GEMMA_BOS, n_vocab=256, notes="no pre-norms, q/k norms over the projection, post-norms, GQA 4/2"),
    Case("olmo3-f32-swa-yarn", partial(write_olmo2, vocab=_spm(256), n_vocab=256, n_ctx=N_CTX, sliding_window=8,
                                       rope_scaling={"type": "yarn", "factor": 4.0, "original_context_length": 16},
                                       seed=32),
         bos=GEMMA_BOS, n_vocab=256, n_tokens=48, notes="window 8 on 3 layers of 4, YaRN on the global one"),
    Case("olmo2-q4_k_m", partial(write_olmo2, vocab=_spm(256), n_vocab=256, n_embd=256, n_ff=512, n_ctx=N_CTX,
                                 qtype=Q4_K_M_LIKE, seed=33), quantized=True, bos=GEMMA_BOS, n_vocab=256),
]
CASES += [
    Case("gemma2-f32-spm", partial(write_gemma2, vocab=_spm(256), n_vocab=256, n_ctx=N_CTX, attn_softcap=None,
                                   final_softcap=None, embd_std=1.0, seed=25),
         bos=GEMMA_BOS, n_vocab=256, n_tokens=48,
         notes="window 16 on even layers; soft-caps left to llama.cpp's defaults 50 and 30 (logits of spread ~10)"),
    Case("gemma2-f32-caps-keys", partial(write_gemma2, vocab=_spm(256), n_vocab=256, n_ctx=N_CTX, **GEMMA2_CAPS,
                                         seed=26),
         bos=GEMMA_BOS, n_vocab=256, n_tokens=48,
         notes="attention and final soft-caps 2 and 5, sliding_window_pattern as bools, rope.freq_base_swa"),
    Case("gemma2-q4_k_m", partial(write_gemma2, vocab=_spm(), n_vocab=1024, n_embd=256, head_dim=64, n_ff=512,
                                  n_ctx=N_CTX, qtype=Q4_K_M_LIKE, embd_std=0.12, seed=27),
         quantized=True, bos=GEMMA_BOS, n_vocab=1024),
    Case("phi3-f32-longrope-short", partial(write_phi3, vocab=_spm(256), n_vocab=256, **PHI3_SHORT, sliding_window=2047,
                                            seed=28),
         bos=GEMMA_BOS, n_vocab=256, notes="fused attn_qkv and gate+up, LongRoPE short factors, a window to ignore"),
    Case("phi3-f32-bpe-longrope-long", partial(write_phi3, vocab=bpe_vocab("default"), n_vocab=BPE_N, **PHI3_LONG,
                                               seed=29),
         bos=BPE_BOS, n_vocab=BPE_N, n_tokens=48,
         notes="Phi-4-mini-like: GQA 6/2, 3/4 of each head rotated, tied; LongRoPE long factors"),
    Case("phi3-k-quants", partial(write_phi3, vocab=_spm(), n_vocab=1024, n_embd=256, n_head=8, n_head_kv=8,
                                  n_ff=512, n_ctx=1024, n_ctx_orig=256, qtype=K_MIX, seed=30),
         quantized=True, bos=GEMMA_BOS, n_vocab=1024),
]
# Optional tensors llama.cpp's loaders take: llama's attention and FFN biases, granite's FFN biases, qwen2's
# output.bias (added to the logits)
LLAMA_BIASES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
SPM256 = dict(vocab=_spm(256), n_vocab=256, n_ctx=N_CTX)
CASES += [
    Case("llama-f32-biases", partial(write_llama, arch="llama", **SPM256, n_embd=96, n_head=6, n_head_kv=2,
                                     n_ff=160, biases=LLAMA_BIASES, seed=40),
         bos=GEMMA_BOS, n_vocab=256, notes="q, k, v, output, gate, up and down biases"),
    Case("llama-k-quants-biases", partial(write_llama, arch="llama", **SPM256, n_embd=256, n_head=4, n_head_kv=2,
                                          n_ff=512, qtype=K_MIX, biases=LLAMA_BIASES, seed=41),
         quantized=True, bos=GEMMA_BOS, n_vocab=256),
    Case("granite-f32-ffn-biases", partial(write_granite, vocab=bpe_vocab("default"), n_vocab=BPE_N, n_ff=160,
                                           n_ctx=N_CTX, output_std=1.0, biases=("ffn_gate", "ffn_up", "ffn_down"),
                                           seed=42),
         bos=BPE_BOS, n_vocab=BPE_N, notes="granite's scales with gate, up and down biases"),
    Case("qwen2-f32-output-bias", partial(write_llama, arch="qwen2", vocab=_bpe("qwen2"), n_vocab=BPE_N,
                                          n_ctx=N_CTX, n_embd=96, n_head=6, n_head_kv=2, n_ff=160,
                                          biases=("output",), seed=43),
         bos=BPE_BOS, n_vocab=BPE_N, notes="q/k/v biases and output.bias on the logits"),
]
# StarCoder 2: LayerNorms and every projection with biases, GELU, NeoX RoPE; tied with separate q/k/v, and
# untied with one fused attn_qkv
CASES += [
    Case("starcoder2-f32-bpe", partial(write_starcoder2, vocab=bpe_vocab("starcoder"), n_vocab=BPE_N, n_ctx=N_CTX,
                                       seed=44),
         bos=BPE_BOS, n_vocab=BPE_N, notes="LayerNorms, q/k/v/o and FFN biases, GELU, tied"),
    Case("starcoder2-f32-fused-qkv", partial(write_starcoder2, vocab=bpe_vocab("starcoder"), n_vocab=BPE_N,
                                             n_ctx=N_CTX, tied=False, fused_qkv=True, seed=45),
         bos=BPE_BOS, n_vocab=BPE_N, notes="one attn_qkv with its bias, separate output"),
]
BY_NAME = {c.name: c for c in CASES}


def write_case(case: Case, directory: Path) -> Path:
    return case.write(Path(directory) / f"{case.name}.gguf")


def plain(value):
    """A metadata value with its arrays (NumPy arrays, string tables) as lists, whose repr shows every element."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return [plain(v) for v in value] if isinstance(value, list) else value


def sha256(path) -> str:
    """A digest of what the logits depend on: every metadata value and every tensor's name, type, shape and
    bytes (not the file's layout, which another gguf version may write differently)."""
    h = hashlib.sha256()
    with GGUFFile.open(path) as f:
        h.update(repr(sorted((k, plain(v)) for k, v in f.metadata.items() if not k.startswith("GGUF."))).encode())
        for t in sorted(f.tensors, key=lambda t: t.name):
            h.update(f"{t.name} {t.type.name} {t.ne}".encode())
            h.update(f.tensor_bytes(t))
    return h.hexdigest()
