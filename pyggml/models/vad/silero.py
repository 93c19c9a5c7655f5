"""Silero VAD v6 on pyggml graphs: a speech probability per 32 ms window (512 samples at 16 kHz).

As silero-vad (and faster-whisper, which bundles its ONNX export) runs it, each window is fed with the 64
samples before it (zeros before the first), reflect-padded by 64 on the right; the STFT is a convolution
with the 258 x 256 basis (hop 128, 4 frames), its magnitude goes through four convolutions (kernel 3,
strides 1, 2, 2, 1, ReLU), the one remaining frame into an LSTM cell whose state carries over from window
to window, then ReLU, a 1x1 convolution and a sigmoid. (whisper.cpp reflect-pads each 512 window on both
sides instead of prepending the context, which moves its probabilities by up to 0.2 from Silero's.)

One graph computes `n` windows: the encoder for all of them at once (im2col + one product per
convolution, windows side by side), then the LSTM cell over the n windows (the input projection of all
windows is one product, the steps one `ops.lstm` node: unrolled, they were ten nodes a window) and the
output layer over the n hidden states. The LSTM's h and c live in a tensor of their own, copied back at the
end of the graph, so consecutive calls continue the stream; `reset()` clears them. Graphs are kept per
window count (a block of `block` windows, and the remainder).
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pyggml.alloc import alloc_ctx_tensors_from_buft
from pyggml.backend import Backend, BufferUsage, tensor_get, tensor_set
from pyggml.core import Context, GGMLType, Graph, Tensor
from pyggml.core import ops
from pyggml.errors import AudioError
from pyggml.models.llm.runner import SingleBackend
from pyggml.models.vad.files import CONTEXT, CONV_STRIDES, HIDDEN, WINDOW, load_silero

SAMPLE_RATE = 16000
BLOCK = 512             # windows per graph (16 s of audio)
STFT_HOP = 128
# frames into each convolution: the STFT's 4 (640 samples, 256 taps, hop 128), then (F - 1) // stride + 1 each
FRAMES_IN = list(accumulate(CONV_STRIDES[:-1], lambda frames, stride: (frames - 1) // stride + 1, initial=4))


class SileroVAD:
    """Silero VAD on a backend. `probs(audio)` for a whole signal (state reset first); `process(samples)` for
    a stream: the probabilities of the complete windows so far, the rest kept for the next call."""

    def __init__(self, weights=None, backend: Backend | None = None, n_threads: int | None = 1, block: int = BLOCK):
        from pyggml.backend import init_by_name, set_n_threads

        self.weights = load_silero(weights)
        self.backend = backend if backend is not None else init_by_name("CPU")
        if n_threads is not None:
            set_n_threads(self.backend, n_threads)  # where the backend takes a thread count (the CPU's)
        self.block = block
        self._make_tensors()
        self.runner = SingleBackend(self.backend)
        self.runner.reserve(self._build(block)[1])
        self._graphs: dict[int, tuple] = {}
        self._placed = None
        self.reset()

    def _make_tensors(self) -> None:
        """Weights (float32; the LSTM's two biases summed) and the LSTM state [h | c], in one buffer."""
        w = self.weights
        ctx = Context(no_alloc=True)
        arrays = {"stft": w.stft_basis.reshape(258, 1, 256), "w_ih": w.w_ih, "w_hh": w.w_hh,
                  "b": w.b_ih + w.b_hh, "dec_w": w.dec_w.reshape(1, HIDDEN), "dec_b": w.dec_b.reshape(1)}
        for i in range(4):
            kernel = w.conv_w[i]                                   # [out, in, 3]
            if self._one_frame_out(i):  # the taps that meet the input's frames, frame-major: [out, frames, in]
                kernel = kernel[:, :, 1:1 + FRAMES_IN[i]].transpose(0, 2, 1)
            arrays[f"conv{i}"], arrays[f"conv{i}_b"] = kernel, w.conv_b[i]
        self.t = {name: ctx.new_tensor(GGMLType.F32, a.shape[::-1], name) for name, a in arrays.items()}
        self.state = ctx.new_tensor_2d(GGMLType.F32, HIDDEN, 2, "lstm_state")
        self.buffer = alloc_ctx_tensors_from_buft(ctx, self.backend.default_buffer_type)
        self.buffer.usage = BufferUsage.WEIGHTS
        for name, a in arrays.items():
            tensor_set(self.t[name], np.ascontiguousarray(a, np.float32))

    def reset(self) -> None:
        """A new stream: zero LSTM state, zero context, nothing pending."""
        tensor_set(self.state, np.zeros((2, HIDDEN), np.float32))
        self._context = np.zeros(CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)

    # ----- the graph ------------------------------------------------------------------------------------
    @staticmethod
    def _one_frame_out(i: int) -> bool:
        """Whether convolution i gives one frame: its input's frames fit in one stride. Its kernel's tap 0 (and
        any past the frames) then meets only padding: one product over the frames as they lie replaces the
        permute, im2col and a third or more of the product."""
        return FRAMES_IN[i] <= CONV_STRIDES[i]

    def _conv(self, ctx: Context, x: Tensor, i: int) -> Tensor:
        """Conv (kernel 3, padding 1) + bias + ReLU of x [channels, frames, n] -> [out channels, frames', n]."""
        k, n = self.t[f"conv{i}"], x.ne[2]
        if self._one_frame_out(i):
            cols, frames = x, 1                                                            # [C, frames, n]
        else:
            x = ops.cont(ctx, ops.permute(ctx, x, 1, 0, 2, 3))                               # [frames, C, n]
            cols = ops.im2col(ctx, k, x, CONV_STRIDES[i], 0, 1, 0, 1, 0, False, GGMLType.F32)  # [3C, frames', n]
            frames = cols.ne[1]
        depth = k.ne[0] * k.ne[1]                                                          # taps x channels
        y = ops.mul_mat(ctx, ops.reshape_2d(ctx, k, depth, k.ne[2]), ops.reshape_2d(ctx, cols, depth, frames * n))
        y = ops.relu(ctx, ops.add(ctx, y, self.t[f"conv{i}_b"]))
        return ops.reshape_3d(ctx, y, y.ne[0], frames, n)

    def _build(self, n: int) -> tuple[Tensor, Graph, Tensor]:
        """(input [576, n] windows with their context, graph, output [n] probabilities)."""
        ctx = Context(no_alloc=True)
        graph = Graph()
        frames = ctx.new_tensor_2d(GGMLType.F32, CONTEXT + WINDOW, n, "vad_windows").set_input()
        x = ops.reshape_3d(ctx, ops.pad_reflect_1d(ctx, frames, 0, CONTEXT), CONTEXT * 2 + WINDOW, 1, n)
        basis = self.t["stft"]
        cols = ops.im2col(ctx, basis, x, STFT_HOP, 0, 0, 0, 1, 0, False, GGMLType.F32)   # [256, 4, n]
        spec = ops.mul_mat(ctx, ops.reshape_2d(ctx, basis, 256, 258),
                           ops.reshape_2d(ctx, cols, 256, cols.ne[1] * n))                 # [258, 4n]
        re = ops.view_2d(ctx, spec, 129, spec.ne[1], spec.nb[1], 0)
        im = ops.view_2d(ctx, spec, 129, spec.ne[1], spec.nb[1], 129 * spec.nb[0])
        mag = ops.sqrt(ctx, ops.add(ctx, ops.sqr(ctx, ops.cont(ctx, re)), ops.sqr(ctx, ops.cont(ctx, im))))
        feat = ops.reshape_3d(ctx, mag, 129, cols.ne[1], n)
        for i in range(4):
            feat = self._conv(ctx, feat, i)                                                # [128, 1, n]
        gates_x = ops.add(ctx, ops.mul_mat(ctx, self.t["w_ih"], ops.reshape_2d(ctx, feat, HIDDEN, n)),
                          self.t["b"])                                                     # [512, n]
        steps = ops.lstm(ctx, gates_x, self.t["w_hh"], self.state)                         # [128, n + 2]
        hs = ops.view_2d(ctx, steps, HIDDEN, n, steps.nb[1], 0)
        logit = ops.add(ctx, ops.mul_mat(ctx, self.t["dec_w"], ops.relu(ctx, hs)), self.t["dec_b"])
        probs = ops.sigmoid(ctx, logit).set_output()
        graph.build_forward_expand(probs)
        graph.build_forward_expand(ops.cpy(ctx, ops.view_2d(ctx, steps, HIDDEN, 2, steps.nb[1], n * steps.nb[1]),
                                           self.state))
        return frames, graph, probs

    def _run(self, span: np.ndarray) -> np.ndarray:
        """Probabilities of the whole windows of `span` (the 64 samples of context, then the windows), each
        window with the 64 samples before it: overlapping views of the span, copied once into the input."""
        n = (span.size - CONTEXT) // WINDOW
        entry = self._graphs.get(n)
        if entry is None:
            entry = self._graphs[n] = self._build(n)
        frames, graph, probs = entry
        if self._placed is not graph:
            self.runner.alloc_graph(graph)
            self._placed = graph
        tensor_set(frames, np.ascontiguousarray(sliding_window_view(span, CONTEXT + WINDOW)[::WINDOW]))
        self.runner.compute(graph)
        return np.asarray(tensor_get(probs), np.float32).reshape(n)

    # ----- use ------------------------------------------------------------------------------------------
    def process(self, samples) -> np.ndarray:
        """Probabilities of the complete 512-sample windows that `samples` (16 kHz float) completes, in order;
        what is left over waits for the next call. The samples go in a block of windows at a time (never copied
        whole: a copy of 10 minutes of audio costs more than its VAD's products, in fresh pages)."""
        samples = np.asarray(samples, np.float32).reshape(-1)
        if samples.size and not np.isfinite([samples.min(), samples.max()]).all():  # NaN or inf: no temporary
            raise AudioError("VAD input has NaN or infinite samples")
        carry, used, out = np.concatenate([self._context, self._pending]), 0, []
        while True:
            take = CONTEXT + self.block * WINDOW - carry.size   # up to a block of windows after the context
            span = np.concatenate([carry, samples[used:used + take]])
            used += take
            end = CONTEXT + (span.size - CONTEXT) // WINDOW * WINDOW
            if end == CONTEXT:
                break
            out.append(self._run(span[:end]))
            carry = span[end - CONTEXT:]
        self._context, self._pending = span[:CONTEXT].copy(), span[CONTEXT:].copy()
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def flush(self) -> np.ndarray:
        """The probability of the last partial window (zero-padded), if any."""
        if self._pending.size == 0:
            return np.zeros(0, np.float32)
        return self.process(np.zeros(WINDOW - self._pending.size, np.float32))

    def probs(self, audio) -> np.ndarray:
        """A probability per 512-sample window of the whole signal, the last window zero-padded."""
        self.reset()
        out = np.concatenate([self.process(audio), self.flush()])
        self.reset()
        return out
