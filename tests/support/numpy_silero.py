"""Silero VAD v6 in plain NumPy (float64), independent of pyggml's graphs: the reference its tests compare with."""

from __future__ import annotations

import numpy as np


def _conv1d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int, pad: int) -> np.ndarray:
    """x [C_in, T], w [C_out, C_in, K] -> [C_out, T'] (PyTorch's Conv1d, zero padding)."""
    k = w.shape[2]
    x = np.pad(x, ((0, 0), (pad, pad)))
    n_out = (x.shape[1] - k) // stride + 1
    cols = np.stack([x[:, i * stride:i * stride + k] for i in range(n_out)], axis=0)   # [T', C_in, K]
    y = np.einsum("tck,ock->ot", cols, w)
    return y if b is None else y + b[:, None]


def silero_probs(weights, audio: np.ndarray, whisper_cpp: bool = False) -> np.ndarray:
    """Speech probability per 512-sample window (the last one zero-padded), each window with the 64 samples
    before it (zeros for the first), as silero-vad and faster-whisper run the model; with `whisper_cpp`, each
    512 window reflect-padded by 64 on both sides instead, as whisper.cpp runs it."""
    w = weights
    audio = np.asarray(audio, np.float64)
    audio = np.pad(audio, (0, -audio.size % 512))
    h = np.zeros(128)
    c = np.zeros(128)
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    out = []
    for i in range(audio.size // 512):
        if whisper_cpp:
            x = np.pad(audio[i * 512:(i + 1) * 512], (64, 64), mode="reflect")
        else:
            x = audio[max(0, i * 512 - 64):(i + 1) * 512]
            x = np.pad(np.pad(x, (576 - x.size, 0)), (0, 64), mode="reflect")
        spec = _conv1d(x[None], w.stft_basis[:, None, :].astype(np.float64), None, 128, 0)
        feat = np.sqrt(spec[:129] ** 2 + spec[129:] ** 2)
        for cw, cb, s in zip(w.conv_w, w.conv_b, (1, 2, 2, 1), strict=True):
            feat = np.maximum(_conv1d(feat, cw.astype(np.float64), cb, s, 1), 0)
        g = w.w_ih @ feat[:, 0] + w.b_ih + w.w_hh @ h + w.b_hh
        gi, gf, gg, go = np.split(g, 4)
        c = sig(gf) * c + sig(gi) * np.tanh(gg)
        h = sig(go) * np.tanh(c)
        out.append(sig(np.maximum(h, 0) @ w.dec_w + w.dec_b))
    return np.asarray(out)


def onnxruntime_probs(onnx_path, audio: np.ndarray) -> np.ndarray:
    """ONNX Runtime on the same file, fed as faster-whisper feeds it (vad.SileroVADModel)."""
    import onnxruntime

    audio = np.asarray(audio, np.float32)
    audio = np.pad(audio, (0, -audio.size % 512)).reshape(-1, 512)
    context = np.concatenate([np.zeros((1, 64), np.float32), audio[:-1, -64:]], axis=0)
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(onnx_path), sess_options=opts, providers=["CPUExecutionProvider"])
    state = np.zeros((1, 1, 128), np.float32)
    probs, _, _ = session.run(None, {"input": np.concatenate([context, audio], 1), "h": state, "c": state})
    return probs.reshape(-1)
