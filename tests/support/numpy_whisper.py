"""An independent pure-NumPy Whisper forward pass (float32 or float64), to check pyggml's graphs step by step.

Written from the model's definition (openai-whisper's ``model.py``), not from pyggml's
graphs: conv1d(k=3, pad 1) + GELU twice, sinusoidal/learned positions, pre-norm
blocks, multi-head attention scaled by d_head**-0.5, GELU in the erf form (as the
weights were trained; ``gelu="tanh"`` gives ggml_gelu's approximation), output
projection tied to the token embeddings. The decoder takes new tokens with a KV cache.
With ``audio_ctx_pad`` > 1 the audio's keys and values (the encoder's self-attention, the cross-attention)
get zero rows up to a multiple of it, unmasked, as whisper.cpp's flash-attention path attends them.
"""

from __future__ import annotations

import numpy as np

LN_EPS = 1e-5


def erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): NumPy has no erf."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return s * (1.0 - poly * np.exp(-a * a))


def gelu(x: np.ndarray, form: str = "erf") -> np.ndarray:
    if form == "erf":
        return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + LN_EPS) * w + b


def conv1d(x, w, b, stride):
    """x (C_in, T), w (C_out, C_in, 3), b (C_out, 1); zero padding 1 on both sides."""
    xp = np.pad(x, ((0, 0), (1, 1)))
    t_out = (x.shape[1] - 1) // stride + 1
    out = sum(w[:, :, k] @ xp[:, k:k + stride * (t_out - 1) + 1:stride] for k in range(3))
    return out + b


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class NumpyWhisper:
    """Forward passes over a ``WhisperFile``'s tensors (converted once to ``dtype``)."""

    def __init__(self, file, dtype=np.float32, gelu_form: str = "erf", audio_ctx_pad: int = 1):
        self.hp = file.hparams
        self.dtype = dtype
        self.gelu_form = gelu_form
        self.audio_ctx_pad = audio_ctx_pad
        self.w = {name: weight.to_float32().astype(dtype) for name, weight in file.tensors.items()}

    def _linear(self, x, name, bias=True):
        y = x @ self.w[f"{name}.weight"].T
        return y + self.w[f"{name}.bias"] if bias else y

    def _attention(self, q, k, v, n_head, causal_offset=None):
        """q (n_q, d), k/v (n_kv, d); causal_offset = position of q's first row among the keys."""
        n_q, d = q.shape
        dh = d // n_head
        if causal_offset is None:  # the audio's positions: zero rows up to a multiple of audio_ctx_pad
            zeros = np.zeros((-k.shape[0] % self.audio_ctx_pad, d), k.dtype)
            k, v = np.concatenate([k, zeros]), np.concatenate([v, zeros])
        qh = q.reshape(n_q, n_head, dh).transpose(1, 0, 2)
        kh = k.reshape(-1, n_head, dh).transpose(1, 0, 2)
        vh = v.reshape(-1, n_head, dh).transpose(1, 0, 2)
        scores = qh @ kh.transpose(0, 2, 1) * (dh ** -0.5)
        if causal_offset is not None:
            allowed = np.arange(k.shape[0])[None, :] <= (causal_offset + np.arange(n_q))[:, None]
            scores = np.where(allowed[None], scores, -np.inf)
        return (softmax(scores) @ vh).transpose(1, 0, 2).reshape(n_q, d)

    def _mlp(self, x, p):
        h = layer_norm(x, self.w[f"{p}.mlp_ln.weight"], self.w[f"{p}.mlp_ln.bias"])
        return self._linear(gelu(self._linear(h, f"{p}.mlp.0"), self.gelu_form), f"{p}.mlp.2")

    def encode(self, mel: np.ndarray) -> np.ndarray:
        """mel (n_mels, 2 * n_audio_ctx) -> encoder output (n_audio_ctx, n_audio_state)."""
        w = self.w
        x = gelu(conv1d(mel.astype(self.dtype), w["encoder.conv1.weight"], w["encoder.conv1.bias"], 1), self.gelu_form)
        x = gelu(conv1d(x, w["encoder.conv2.weight"], w["encoder.conv2.bias"], 2), self.gelu_form)
        x = x.T + w["encoder.positional_embedding"][:x.shape[1]]
        for i in range(self.hp.n_audio_layer):
            p = f"encoder.blocks.{i}"
            h = layer_norm(x, w[f"{p}.attn_ln.weight"], w[f"{p}.attn_ln.bias"])
            q, k, v = self._linear(h, f"{p}.attn.query"), self._linear(h, f"{p}.attn.key", False), \
                self._linear(h, f"{p}.attn.value")
            x = x + self._linear(self._attention(q, k, v, self.hp.n_audio_head), f"{p}.attn.out")
            x = x + self._mlp(x, p)
        return layer_norm(x, w["encoder.ln_post.weight"], w["encoder.ln_post.bias"])

    def cross_kv(self, audio_features: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each decoder layer's cross-attention K and V, computed once per 30 s window."""
        return [(self._linear(audio_features, f"decoder.blocks.{i}.cross_attn.key", False),
                 self._linear(audio_features, f"decoder.blocks.{i}.cross_attn.value"))
                for i in range(self.hp.n_text_layer)]

    def new_cache(self) -> list[tuple[np.ndarray, np.ndarray]]:
        d = self.hp.n_text_state
        return [(np.zeros((0, d), self.dtype), np.zeros((0, d), self.dtype)) for _ in range(self.hp.n_text_layer)]

    def decode(self, tokens, cache, cross) -> np.ndarray:
        """Logits (len(tokens), n_vocab) for new tokens after the ``cache``'s positions; the cache grows in place."""
        w = self.w
        offset = cache[0][0].shape[0]
        tokens = np.asarray(tokens)
        x = w["decoder.token_embedding.weight"][tokens] + w["decoder.positional_embedding"][offset:offset + len(tokens)]
        for i in range(self.hp.n_text_layer):
            p = f"decoder.blocks.{i}"
            h = layer_norm(x, w[f"{p}.attn_ln.weight"], w[f"{p}.attn_ln.bias"])
            q = self._linear(h, f"{p}.attn.query")
            k = np.concatenate([cache[i][0], self._linear(h, f"{p}.attn.key", False)])
            v = np.concatenate([cache[i][1], self._linear(h, f"{p}.attn.value")])
            cache[i] = (k, v)
            x = x + self._linear(self._attention(q, k, v, self.hp.n_text_head, causal_offset=offset), f"{p}.attn.out")
            h = layer_norm(x, w[f"{p}.cross_attn_ln.weight"], w[f"{p}.cross_attn_ln.bias"])
            q = self._linear(h, f"{p}.cross_attn.query")
            x = x + self._linear(self._attention(q, *cross[i], self.hp.n_text_head), f"{p}.cross_attn.out")
            x = x + self._mlp(x, p)
        x = layer_norm(x, w["decoder.ln.weight"], w["decoder.ln.bias"])
        return x @ w["decoder.token_embedding.weight"].T

    def greedy(self, mel, prompt, eot, suppress=(), suppress_begin=(), max_tokens=224) -> list[int]:
        """Greedy decoding without timestamps (the check of the whole front end, not whisper.cpp's rules)."""
        cross = self.cross_kv(self.encode(mel))
        cache = self.new_cache()
        logits = self.decode(prompt, cache, cross)[-1]
        out = []
        for step in range(max_tokens):
            logits = logits.copy()
            logits[list(suppress)] = -np.inf
            if step == 0:
                logits[list(suppress_begin)] = -np.inf
            token = int(np.argmax(logits))
            if token == eot:
                break
            out.append(token)
            logits = self.decode([token], cache, cross)[-1]
        return out
