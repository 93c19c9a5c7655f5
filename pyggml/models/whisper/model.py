"""Whisper's encoder and decoder as pyggml graphs, with weights on backends and planned compute buffers.

As whisper.cpp builds them: the encoder is two 1-D convolutions (im2col + one matrix product each) with
GELU, the positional embedding and pre-norm blocks over the 1500 frames of a 30 s window; at its end the
cross-attention keys and values of every decoder layer are computed once and copied into buffers of
their own (whisper.cpp's kv_cross). The decoder is a causal text transformer whose self-attention keys and
values go to a KV cache (pyggml.models.llm.kv_cache); a step's tokens may belong to different sequences (beam
search keeps one sequence per beam in its own block of cells), so the cells written and the mask are
inputs. A step of the same shape as the previous one reuses its graph and plan, as the LLM models do.

Weights keep their file types (F16, Q8_0, Q5_0, ...) for the matrix products and the token embedding; norms,
biases and positional embeddings are F32 (as whisper.cpp stores them). Quantized matrices are interleaved for
the CPU's integer products where it has them (WhisperWeights). `f32=True` expands the matrices
to F32 at load (more memory, no per-step conversion by the CPU's products).

GELU is the erf form by default (the weights were trained with it); `gelu="tanh"` uses ggml_gelu's tanh
approximation, as whisper.cpp does.

The audio's attention (the encoder's self-attention and the decoder's cross-attention) is over the 1500
frames padded as whisper.cpp's flash-attention path pads them: whisper.cpp attends over n_audio_ctx rounded
up to a multiple of 256 (1536), and the 36 cells past the audio hold zero keys and values without a mask,
so each softmax's denominator gains 36·exp(0 - max). Against whisper.cpp's teacher-forced logits that is
a median KL of 5e-5 to 1.6e-4 per step when it is left out, 2e-6 to 1.3e-5 with it, and it decides
near-ties. Here the zero cells are a sink of logit ln(36) per head: the same sum without the cells.
`audio_ctx_pad=1` attends over the audio alone, as the model was trained and as faster-whisper and
whisper.cpp without flash attention compute; `pad_audio_attention(False)` does the same for the transcriptions
that follow faster-whisper (Whisper.log_mel's padding="faster-whisper").
"""

from __future__ import annotations

import math

import numpy as np

from pyggml.alloc import alloc_ctx_tensors_from_buft
from pyggml.backend import Backend, BufferUsage, is_cpu, set_n_threads, tensor_get, tensor_set
from pyggml.core import Context, GGMLType, Graph, Tensor
from pyggml.core import ops
from pyggml.core import types as T
from pyggml.core.host_memory import release_file_pages
from pyggml.errors import GGMLError, GGUFError
from pyggml.models.arch.blocks import Step, attention, layer_norm, linear
from pyggml.models.gguf.gguf_loader import interleave_buffer_type, interleaved_names
from pyggml.models.llm.kv_cache import KVCache
from pyggml.models.llm.runner import Scheduled, SingleBackend, move_tensors, plan_layers
from pyggml.models.whisper.files import is_conv_kernel, is_matrix

N_FRAMES = 3000          # mel frames of a 30 s window (hop 10 ms)
LN_EPS = 1e-5
GELU_FORMS = ("erf", "tanh")
RUN_KV_PAD = 32          # a batched step attends its sequences' first cells in multiples of this (a new graph
                         # every 32 steps; the cache's 256 would read up to 8x the cells in use)
AUDIO_CTX_PAD = 256      # whisper.cpp's padding of the audio positions with flash attention (GGML_PAD(.., 256))


def with_cpu_fallback(backends: list[Backend]) -> tuple[list[Backend], list | None]:
    """(backends, placement): one backend other than pyggml's CPU gets a CPU backend after it, for the scheduler
    to run the ops it has no kernel for (TORCH_CPU has no im2col), with every block on the first; otherwise
    the backends as given and no placement (planned by free memory when there are several)."""
    if len(backends) != 1 or is_cpu(backends[0]):
        return backends, None
    from pyggml.backend import init_by_name
    return [backends[0], init_by_name("CPU")], [(backends[0], None)]


def _unit_of(name: str, n_audio_layer: int) -> int | None:
    """The layer number (encoder blocks first, then decoder blocks) that a block weight belongs to."""
    for prefix, first in (("encoder.blocks.", 0), ("decoder.blocks.", n_audio_layer)):
        if name.startswith(prefix):
            return first + int(name[len(prefix):].split(".", 1)[0])
    return None


def _dims(ne) -> tuple[int, ...]:
    """ne without its trailing 1s, as ggml counts a tensor's dimensions."""
    ne = tuple(ne)
    while len(ne) > 1 and ne[-1] == 1:
        ne = ne[:-1]
    return ne


HEAD = "decoder.token_embedding.weight"   # the tied token embedding, also the output head


def _head_padding(wf, buft) -> int:
    """Zero rows that make the head's rows whole 16-row groups of `buft` (51864 and 51865 tokens are not)."""
    return -wf.tensors[HEAD].ne[1] % buft.group_rows


def _interleaved(wf, where: dict) -> set[str]:
    """The matrices that go to their backend's interleaved buffer type for the integer products: the LLMs' rule
    (gguf_loader.interleaved_names) on each backend over its encoder and decoder blocks' matrices. The tied
    token embedding goes with them, padded with zero rows to whole groups (see WhisperWeights)."""
    names = set()
    for backend in {id(b): b for b in where.values()}.values():
        buft = interleave_buffer_type(backend)
        if buft is not None:
            here = [(n, int(w.type), _dims(w.ne)) for n, w in wf.tensors.items() if where[n] is backend]
            here = [(n, t, (ne[0], ne[1] + _head_padding(wf, buft)) if n == HEAD else ne) for n, t, ne in here]
            names |= interleaved_names(buft, here, lambda n: n.startswith(("encoder.blocks.", "decoder.blocks.")))
    return names


class WhisperWeights:
    """The file's tensors placed on backends: block i of the encoder / decoder on the backend of its layer
    (placement over encoder + decoder blocks), everything else on the local backend (the last).

    Quantized matrices go to the backend's interleaved buffer type (the integer products, activations quantized
    to Q8_0 as whisper.cpp's CPU products do) by the LLMs' all-or-none rule. The token embedding, the output
    head too, then gets `head_padding` zero rows up to whole 16-row groups (51864 tokens are 3241.5 groups):
    its logits are cut off after the product, and GET_ROWS never reads them."""

    def __init__(self, wf, backends: list[Backend], f32: bool = False, placement=None):
        hp = wf.hparams
        n_units = hp.n_audio_layer + hp.n_text_layer
        if placement is not None:       # [(backend, units or None: every block)]
            self.placement = [(b, list(range(n_units)) if units is None else units) for b, units in placement]
            self.placement += [(b, []) for b in backends if all(b is not p for p, _ in self.placement)]
        else:
            self.placement = plan_layers(n_units, backends) if len(backends) > 1 else None
        backend_of_unit = {u: b for b, units in (self.placement or []) for u in units}
        where = {name: backend_of_unit.get(_unit_of(name, hp.n_audio_layer), backends[-1]) for name in wf.tensors}
        interleaved = set() if f32 else _interleaved(wf, where)
        ctxs: dict[tuple, tuple[object, Context]] = {}   # (backend, interleaved) -> (buffer type, tensors)
        self.tensors: dict[str, Tensor] = {}
        sources = {}
        for name, w in wf.tensors.items():
            keep = (is_matrix(name, tuple(w.ne)) or is_conv_kernel(name)) and not f32
            type_ = T.as_type(w.type) if keep else GGMLType.F32
            backend = where[name]
            key = (id(backend), name in interleaved)
            buft = interleave_buffer_type(backend) if name in interleaved else backend.default_buffer_type
            _, ctx = ctxs.setdefault(key, (buft, Context(no_alloc=True)))
            ne = _dims(w.ne)
            pad = _head_padding(wf, buft) if name == HEAD and name in interleaved else 0
            self.tensors[name] = ctx.new_tensor(type_, (ne[0], ne[1] + pad) if pad else ne, name)
            sources[name] = (w, keep)
        self.head_padding = self.tensors[HEAD].ne[1] - wf.tensors[HEAD].ne[1]
        self.buffers = []
        for buft, ctx in ctxs.values():
            buf = alloc_ctx_tensors_from_buft(ctx, buft)
            buf.usage = BufferUsage.WEIGHTS
            self.buffers.append(buf)
        for name, t in self.tensors.items():
            w, keep = sources[name]
            data = np.frombuffer(w.data, dtype=np.uint8) if keep else w.to_float32().ravel()
            if name == HEAD and self.head_padding:   # zero blocks (scale 0): rows of zeros, logits 0 never read
                data = np.concatenate([data, np.zeros(t.nbytes - data.nbytes, np.uint8)])
            tensor_set(t, data)
            release_file_pages(w.data)   # copied: the file's pages need not stay resident (peak RSS)

    @property
    def nbytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def get(self, name: str) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            raise GGUFError(f"Whisper model: tensor '{name}' is missing")
        return t

    def optional(self, name: str) -> Tensor | None:
        return self.tensors.get(name)

    def backend_of(self, unit: int, backends: list[Backend]) -> Backend:
        if self.placement is None:
            return backends[-1]
        return next(b for b, units in self.placement if unit in units)


class Linear:
    """A weight and optional bias by whisper.cpp name prefix."""

    def __init__(self, w: WhisperWeights, prefix: str):
        self.weight = w.get(prefix + ".weight")
        self.bias = w.optional(prefix + ".bias")

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        return linear(ctx, self.weight, x, self.bias)


class Norm(Linear):
    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        return layer_norm(ctx, x, self.weight, self.bias, LN_EPS)


class Block:
    """One pre-norm transformer block's weights (cross-attention only in the decoder)."""

    def __init__(self, w: WhisperWeights, prefix: str, cross: bool):
        self.attn_ln = Norm(w, prefix + ".attn_ln")
        self.q, self.k, self.v, self.o = (Linear(w, f"{prefix}.attn.{p}") for p in ("query", "key", "value", "out"))
        if cross:
            self.cross_ln = Norm(w, prefix + ".cross_attn_ln")
            self.cq, self.ck, self.cv, self.co = (Linear(w, f"{prefix}.cross_attn.{p}")
                                                  for p in ("query", "key", "value", "out"))
        self.mlp_ln = Norm(w, prefix + ".mlp_ln")
        self.mlp0, self.mlp2 = Linear(w, prefix + ".mlp.0"), Linear(w, prefix + ".mlp.2")

    def mlp(self, ctx: Context, x: Tensor, gelu) -> Tensor:
        return ops.add(ctx, self.mlp2(ctx, gelu(ctx, self.mlp0(ctx, self.mlp_ln(ctx, x)))), x)


def _heads_attention(ctx: Context, q: Tensor, k: Tensor, v: Tensor, scale: float, flash: bool,
                     sinks: Tensor | None) -> Tensor:
    """softmax(scale·qkᵀ)·v per head for q [hd, n_q, H, B], k [hd, n_k, H, B] -> [hd·H, n_q·B] (B: sequences
    of a batch, each attending to its own audio); sinks (F32 [H] or None) join each softmax's denominator.

    With `flash`, one flash_attn_ext (v as [hd, n_k, H]; the n_q x n_k scores never enter the compute
    buffer, as whisper.cpp with flash attention); else mul_mat, soft_max_ext, mul_mat with v given
    transposed, as [n_k, hd, H]."""
    if flash:
        out = ops.flash_attn_ext(ctx, q, k, v, None, scale, 0.0, 0.0)                  # [hd, H, n_q]
        ops.flash_attn_ext_add_sinks(out, sinks)
        return ops.reshape_2d(ctx, out, q.ne[0] * q.ne[2], q.ne[1] * q.ne[3])
    kq = ops.soft_max_ext(ctx, ops.mul_mat(ctx, k, q), None, scale, 0.0)   # [n_k, n_q, H]
    ops.soft_max_add_sinks(kq, sinks)
    kqv = ops.mul_mat(ctx, v, kq)                                            # [hd, n_q, H]
    return ops.cont_2d(ctx, ops.permute(ctx, kqv, 0, 2, 1, 3), q.ne[0] * q.ne[2], q.ne[1] * q.ne[3])


def _runner(backends: list[Backend], placement, planner: str):
    """A graph's planner and executor: one backend's GraphAllocator, or the Scheduler over several."""
    if len(backends) == 1:
        return SingleBackend(backends[0], planner)
    return Scheduled(backends, [(b.name, units) for b, units in placement])


class WhisperModel:
    """A loaded Whisper model: weights, the encoder graph, the cross-attention K/V, the decoder's KV cache.

    `encode(mel)` runs a 30 s window ([n_mels, 3000] log-mel) and leaves its cross-attention K/V in place;
    `decode(tokens, positions, seqs, out_rows)` runs one decoder step over them.
    `n_seq` sequences (beams) of up to n_text_ctx tokens each fit the KV cache (ensure_sequences grows it).
    Batched transcription encodes several windows into `n_cross` slots of cross-attention K/V
    (`encode(mel, slot)`, ensure_cross_slots grows them) and steps one sequence per slot together
    (`decode(..., n_batch=B)`).
    """

    reuse_graphs = True

    def __init__(self, wf, backends: list[Backend], f32: bool = False, gelu: str = "erf", n_seq: int = 1,
                 planner: str = "best", decoder_threads: int | None = 1, flash_attn: bool = True, placement=None,
                 audio_ctx_pad: int = AUDIO_CTX_PAD):
        if gelu not in GELU_FORMS:
            raise GGMLError(f"gelu must be one of {GELU_FORMS}, got {gelu!r}")
        if isinstance(audio_ctx_pad, bool) or not isinstance(audio_ctx_pad, int) or audio_ctx_pad < 1:
            raise GGMLError(f"audio_ctx_pad must be an integer >= 1, got {audio_ctx_pad!r}")
        hp = self.hparams = wf.hparams
        self.backends = backends
        self.gelu = ops.gelu_erf if gelu == "erf" else ops.gelu
        self.n_state, self.n_head = hp.n_text_state, hp.n_text_head
        self.n_audio_ctx, self.n_text_ctx, self.n_vocab = hp.n_audio_ctx, hp.n_text_ctx, hp.n_vocab
        self.n_mels = hp.n_mels
        if hp.n_audio_state != hp.n_text_state:
            raise GGUFError(f"Whisper model: n_audio_state {hp.n_audio_state} != n_text_state {hp.n_text_state}")
        w = self.weights = WhisperWeights(wf, backends, f32, placement)
        self.conv1, self.conv2 = Linear(w, "encoder.conv1"), Linear(w, "encoder.conv2")
        self.enc_pos = w.get("encoder.positional_embedding")
        self.enc_blocks = [Block(w, f"encoder.blocks.{i}", False) for i in range(hp.n_audio_layer)]
        self.ln_post = Norm(w, "encoder.ln_post")
        self.tok_emb = w.get("decoder.token_embedding.weight")
        self.dec_pos = w.get("decoder.positional_embedding")
        self.dec_blocks = [Block(w, f"decoder.blocks.{i}", True) for i in range(hp.n_text_layer)]
        self.dec_ln = Norm(w, "decoder.ln")
        self._check_shapes()
        self.n_seq = n_seq
        self.n_cross = 1
        self.flash_attn = flash_attn
        self.n_audio_pad = -self.n_audio_ctx % audio_ctx_pad   # zero cells whisper.cpp's attention adds
        self._make_caches()
        placement = w.placement
        self.enc_runner = _runner(backends, placement, planner)
        self.dec_runner = _runner(self._decoder_backends(decoder_threads), placement, planner)
        self._ggml_sizes = {}
        self._reserve_encoder()
        self._reserve_decoder()
        self._last = None  # (shape, step): the last decoder step graph planned

    def _decoder_backends(self, n_threads: int | None) -> list[Backend]:
        """The decoder's backends: on one CPU, a second CPU backend with its own thread count. A step of a few
        tokens is a handful of matrix-vector products, which BLAS threads slow down (they wait for each
        other, badly so on a busy machine); the encoder's large products keep every thread."""
        if n_threads is None or len(self.backends) > 1 or not is_cpu(self.backends[0]):
            return self.backends
        backend = self.backends[0].device.init_backend(None)
        set_n_threads(backend, n_threads)
        return [backend]

    def _check_shapes(self) -> None:
        d, hp = self.n_state, self.hparams
        checks = (("encoder.conv1.weight", self.conv1.weight, (3, hp.n_mels, d)),
                  ("encoder.conv2.weight", self.conv2.weight, (3, d, d)),
                  ("encoder.positional_embedding", self.enc_pos, (d, hp.n_audio_ctx)),
                  ("decoder.token_embedding.weight", self.tok_emb, (d, hp.n_vocab + self.weights.head_padding)),
                  ("decoder.positional_embedding", self.dec_pos, (d, hp.n_text_ctx)))
        for name, t, ne in checks:
            if tuple(t.ne[:len(ne)]) != ne:
                raise GGUFError(f"Whisper model: tensor '{name}' has shape {list(t.ne[:len(ne)])}, expected {list(ne)}")

    def _make_caches(self) -> None:
        """Decoder KV cache (n_seq blocks of n_text_ctx cells) and cross K [hd, 1500, H, n_cross] and V (as K
        with flash attention, else Vᵀ [1500, hd, H, n_cross]) per layer, each on the backend of its decoder layer
        (each window's head one contiguous block: a decoder step reads it as one stream, 2.4x faster than rows
        of a head strided by the other heads' values, the cross-attention being most of a batched step);
        with padded audio attention, the sinks that stand for the zero cells (one per encoder head, one per
        decoder head)."""
        d, n_layer, n_audio = self.n_state, self.hparams.n_text_layer, self.hparams.n_audio_layer
        self._make_kv()
        ctxs: dict[int, tuple[Backend, Context]] = {}
        self.cross_k, self.cross_v = [], []
        H, n = self.n_head, self.n_audio_ctx
        for il in range(n_layer):
            backend = self.weights.backend_of(n_audio + il, self.backends)
            _, ctx = ctxs.setdefault(id(backend), (backend, Context(no_alloc=True)))
            self.cross_k.append(ctx.new_tensor_4d(GGMLType.F32, d // H, n, H, self.n_cross, f"cross_k_l{il}"))
            v_ne = (d // H, n) if self.flash_attn else (n, d // H)   # Vᵀ for mul_mat
            self.cross_v.append(ctx.new_tensor_4d(GGMLType.F32, *v_ne, H, self.n_cross, f"cross_v_l{il}"))
        self.enc_sinks = self.cross_sinks = None
        if self.n_audio_pad:
            _, ctx = next(iter(ctxs.values()))
            self.enc_sinks = ctx.new_tensor_1d(GGMLType.F32, self.hparams.n_audio_head, "audio_pad_sinks_enc")
            self.cross_sinks = ctx.new_tensor_1d(GGMLType.F32, self.n_head, "audio_pad_sinks_cross")
        self.cross_buffers = [alloc_ctx_tensors_from_buft(ctx, b.default_buffer_type) for b, ctx in ctxs.values()]
        self._audio_padded = None
        self.pad_audio_attention(True)

    def pad_audio_attention(self, padded: bool) -> None:
        """From the next encode on, attend over the audio as whisper.cpp does (its zero cells, as sinks) or over
        the audio alone, as faster-whisper and openai do (sinks of -inf add nothing to a softmax). Nothing to
        switch in a model made with audio_ctx_pad=1."""
        if self.enc_sinks is None or padded == self._audio_padded:
            return
        value = math.log(self.n_audio_pad) if padded else -np.inf
        for sinks in (self.enc_sinks, self.cross_sinks):
            tensor_set(sinks, np.full(sinks.ne[0], value, np.float32))
        self._audio_padded = padded

    def _make_kv(self) -> None:
        """The self-attention KV cache for n_seq sequences, each layer's on the backend of its layer."""
        d, n_layer, n_audio = self.n_state, self.hparams.n_text_layer, self.hparams.n_audio_layer
        local = self.backends[-1]
        self.kv = KVCache(local, n_layer, self.n_head, d, d, self.n_seq * self.n_text_ctx)
        self._moved_kv = []
        for il in range(n_layer):
            backend = self.weights.backend_of(n_audio + il, self.backends)
            if backend is not local:
                self._moved_kv.append(move_tensors([self.kv.k[il], self.kv.v[il]], backend.default_buffer_type,
                                                   BufferUsage.ANY))

    def ensure_sequences(self, n_seq: int) -> None:
        """Room for n_seq sequences (beams) in the KV cache: a larger cache (and newly planned step graphs)
        when it has fewer; the cells' contents are not kept."""
        if n_seq <= self.n_seq:
            return
        self.n_seq = n_seq
        self._make_kv()
        self._last = None
        self._reserve_decoder()

    def ensure_cross_slots(self, n_slots: int) -> None:
        """Room for n_slots encoded windows' cross-attention K/V (batched transcription): larger buffers and
        encoder graphs built anew when there are fewer; the KV cache and the slots' contents are not kept."""
        if n_slots <= self.n_cross:
            return
        self.n_cross = n_slots
        self._make_caches()
        self._reserve_encoder()
        self._last = None
        self._reserve_decoder()

    def _reserve_encoder(self) -> None:
        """Plan the encoder's compute buffer for its worst graph, all n_cross windows at once, before any encoder
        graph is placed: every graph (first slot, windows) then fits that plan, and none keeps tensors in a
        buffer that a later, larger plan would have replaced."""
        self._encoders = {(0, self.n_cross): self._build_encoder(0, self.n_cross)}  # (first slot, B) -> (mel, graph)
        self._placed_encoder = None   # the key of the encoder graph last placed
        self.enc_runner.reserve(self._encoders[0, self.n_cross][1])
        self._ggml_sizes["encoder"] = self.enc_runner.plan.ggml_size

    def _reserve_decoder(self) -> None:
        """Plan the decoder's compute buffer for its worst step: the longest prefix (a 223-token prompt and the
        start tokens) over every cell of the cache."""
        n_tokens = max(2 * self.n_seq, self.n_text_ctx // 2 + 4)
        self.dec_runner.reserve(self._build_decoder(n_tokens, 2 * self.n_seq, self.kv.size).graph)
        self._ggml_sizes["decoder"] = self.dec_runner.plan.ggml_size

    # ----- memory ----------------------------------------------------------------------------------
    @property
    def kv_bytes(self) -> int:
        return self.kv.nbytes + sum(b.size for b in self.cross_buffers)

    @property
    def compute_bytes(self) -> int:
        return self.enc_runner.buffer_size + self.dec_runner.buffer_size

    @property
    def ggml_compute_bytes(self) -> int:
        """What ggml's own planner takes for the same worst-case graphs the compute buffers were reserved for."""
        return sum(self._ggml_sizes.values())

    # ----- encoder ---------------------------------------------------------------------------------
    def _conv(self, ctx: Context, conv: Linear, x: Tensor, stride: int) -> Tensor:
        """Conv1d (kernel 3, half padding) of x [time, channels, B] as im2col + one product over the B windows'
        columns together: [out channels, time' * B]."""
        cols = ops.im2col(ctx, conv.weight, x, stride, 0, 1, 0, 1, 0, False, GGMLType.F32)   # [3·IC, T', B]
        k = conv.weight
        y = ops.mul_mat(ctx, ops.reshape_2d(ctx, k, k.ne[0] * k.ne[1], k.ne[2]),
                        ops.reshape_2d(ctx, cols, cols.ne[0], cols.ne[1] * cols.ne[2]))   # [OC, T'·B]
        return self.gelu(ctx, ops.add(ctx, y, ops.reshape_1d(ctx, conv.bias, conv.bias.nelements)))

    def _build_encoder(self, first_slot: int, n_windows: int) -> tuple[Tensor, Graph]:
        """The encoder over n_windows windows in one graph (mel [3000, n_mels, B]), their cross K/V into slots
        first_slot.. : every product has the B windows' 1500 frames as its columns (the weights read once for
        all), attention per window (the window the 4th dimension)."""
        ctx = Context(no_alloc=True)
        graph = Graph(4096)
        d, H, n, B = self.n_state, self.hparams.n_audio_head, self.n_audio_ctx, n_windows
        hd = d // H
        mel = ctx.new_tensor_3d(GGMLType.F32, N_FRAMES, self.n_mels, B, "mel").set_input()
        x = ops.reshape_3d(ctx, self._conv(ctx, self.conv1, mel, 1), d, N_FRAMES, B)
        x = self._conv(ctx, self.conv2, ops.cont(ctx, ops.permute(ctx, x, 1, 0, 2, 3)), 2)   # [d, 1500·B]
        x = ops.reshape_2d(ctx, ops.add(ctx, ops.reshape_3d(ctx, x, d, n, B), self.enc_pos), d, n * B)
        scale = 1.0 / math.sqrt(hd)

        def heads(t: Tensor) -> Tensor:   # [d, n·B] -> [hd, H, n, B]
            return ops.reshape_4d(ctx, t, hd, H, n, B)

        for b in self.enc_blocks:
            cur = b.attn_ln(ctx, x)
            q = ops.permute(ctx, heads(b.q(ctx, cur)), 0, 2, 1, 3)                    # [hd, n, H, B]
            k = ops.permute(ctx, heads(b.k(ctx, cur)), 0, 2, 1, 3)
            v = heads(b.v(ctx, cur))
            v = ops.permute(ctx, v, 0, 2, 1, 3) if self.flash_attn else ops.cont(ctx, ops.permute(ctx, v, 1, 2, 0, 3))
            x = ops.add(ctx, b.o(ctx, _heads_attention(ctx, q, k, v, scale, self.flash_attn, self.enc_sinks)), x)
            x = b.mlp(ctx, x, self.gelu)
        x = self.ln_post(ctx, x)
        for il, b in enumerate(self.dec_blocks):
            for cross, t in ((self.cross_k[il], b.ck(ctx, x)), (self.cross_v[il], b.cv(ctx, x))):
                t = ops.reshape_4d(ctx, t, hd, H, n, B)
                if cross is self.cross_v[il] and not self.flash_attn:
                    t = ops.permute(ctx, t, 1, 2, 0, 3)                                  # Vᵀ [1500, hd, H, B]
                else:
                    t = ops.permute(ctx, t, 0, 2, 1, 3)                                  # [hd, 1500, H, B]
                dst = ops.view_4d(ctx, cross, *cross.ne[:3], B, cross.nb[1], cross.nb[2], cross.nb[3],
                                  first_slot * cross.nb[3])
                graph.build_forward_expand(ops.cpy(ctx, t, dst))
        return mel, graph

    def encode(self, mel: np.ndarray, slot: int = 0) -> None:
        """Run the encoder on one window's log-mel [n_mels, 3000] into cross-attention slot `slot`; the
        decoder then attends to it (sequence b of a batch to slot b)."""
        self.encode_batch(np.asarray(mel)[None], slot)

    def encode_batch(self, mels: np.ndarray, first_slot: int = 0) -> None:
        """Run the encoder on B windows' log-mel [B, n_mels, 3000] in one graph, window b into cross-attention
        slot first_slot + b. The compute buffer is planned for n_cross windows (ensure_cross_slots: activations
        n_cross times a window's); each (first slot, B) keeps its graph."""
        mels = np.ascontiguousarray(mels, dtype=np.float32)
        if mels.ndim != 3 or mels.shape[1:] != (self.n_mels, N_FRAMES) or not mels.shape[0]:
            raise GGMLError(f"encode: log-mel of shape {mels.shape[1:] if mels.ndim == 3 else mels.shape}, "
                            f"expected ({self.n_mels}, {N_FRAMES}) per window")
        key = (first_slot, len(mels))
        if not 0 <= first_slot <= self.n_cross - len(mels):
            raise GGMLError(f"encode: slots {first_slot}..{first_slot + len(mels) - 1} are not all among the "
                            f"{self.n_cross} cross-attention slots")
        if key not in self._encoders:
            self._encoders[key] = self._build_encoder(*key)
        inp, graph = self._encoders[key]
        if self._placed_encoder != key:
            self.enc_runner.alloc_graph(graph)
            self._placed_encoder = key
        tensor_set(inp, mels)
        self.enc_runner.compute(graph)

    # ----- decoder ---------------------------------------------------------------------------------
    def _build_decoder(self, n_tokens: int, n_outputs: int, n_kv: int, scores_of: tuple = (), n_batch: int = 1,
                       slot: int = 0) -> Step:
        """A decoder step graph; the cross-attention scores q·kᵀ/√hd of the layers in `scores_of` are outputs
        too (step.cross_scores[il], [n_audio_ctx, n_tokens, H]), for word alignment. With n_batch B the
        tokens are B equal runs, run b attending to cells [0, n_kv) of sequence b's block alone and to
        cross-attention slot b; else all attend to cells [0, n_kv) under the mask and to `slot`."""
        step = Step.new(n_tokens, n_outputs, n_kv)
        step.cross_scores = {}
        step.runs_mask = None if n_batch == 1 else step.ctx.new_tensor_4d(
            GGMLType.F32, n_kv, n_tokens // n_batch, 1, n_batch, "kq_mask_runs").set_input()
        ctx = step.ctx
        d, H, n = self.n_state, self.n_head, n_tokens
        hd = d // H
        scale = 1.0 / math.sqrt(hd)
        x = ops.add(ctx, ops.get_rows(ctx, self.tok_emb, step.tokens), ops.get_rows(ctx, self.dec_pos, step.positions))
        for il, b in enumerate(self.dec_blocks):
            cur = b.attn_ln(ctx, x)
            q, k, v = (ops.reshape_3d(ctx, p(ctx, cur), hd, H, n) for p in (b.q, b.k, b.v))
            own = self._runs_attention(step, il, q, k, v, scale, n_batch) if n_batch > 1 else \
                attention(step, self.kv, il, q, k, v, scale)
            x = ops.add(ctx, b.o(ctx, own), x)
            cur = b.cross_ln(ctx, x)
            q = ops.permute(ctx, ops.reshape_4d(ctx, b.cq(ctx, cur), hd, H, n // n_batch, n_batch), 0, 2, 1, 3)
            k, v = (ops.view_4d(ctx, c, *c.ne[:3], n_batch, c.nb[1], c.nb[2], c.nb[3], slot * c.nb[3])
                    for c in (self.cross_k[il], self.cross_v[il]))
            x = ops.add(ctx, b.co(ctx, _heads_attention(ctx, q, k, v, scale, self.flash_attn, self.cross_sinks)), x)
            if il in scores_of:
                scores = step.cross_scores[il] = ops.scale(ctx, ops.mul_mat(ctx, k, q), scale).set_output()
                step.graph.build_forward_expand(scores)
            if il == len(self.dec_blocks) - 1:
                (x,) = step.select_outputs(x)
            x = b.mlp(ctx, x, self.gelu)
        logits = ops.mul_mat(ctx, self.tok_emb, self.dec_ln(ctx, x))
        logits.set_output()
        step.graph.build_forward_expand(logits)
        step.logits = logits
        return step

    def _runs_attention(self, step: Step, il: int, q: Tensor, k: Tensor, v: Tensor, scale: float,
                        n_batch: int) -> Tensor:
        """Self-attention of B equal runs of tokens ([hd, H, n] each), run b over the cells of sequence b
        alone: the products per (sequence, head) over its first n_kv cells, where the cache-wide attention
        would take every token against all B sequences' cells under a mask (B times the reads and products)."""
        ctx, kv, S = step.ctx, self.kv, self.n_text_ctx
        kv.store(step, il, k, v)
        hd, H, n_run = q.ne[0], q.ne[1], q.ne[2] // n_batch
        ck, cv = kv.k[il], kv.v[il]                                   # K [d, cells], Vᵀ [cells, d]
        keys = ops.view_4d(ctx, ck, hd, step.n_kv, H, n_batch, ck.nb[1], hd * ck.nb[0], S * ck.nb[1], 0)
        values = ops.view_4d(ctx, cv, step.n_kv, hd, H, n_batch, cv.nb[1], hd * cv.nb[1], S * cv.nb[0], 0)
        q = ops.permute(ctx, ops.reshape_4d(ctx, q, hd, H, n_run, n_batch), 0, 2, 1, 3)   # [hd, n_run, H, B]
        kq = ops.soft_max_ext(ctx, ops.mul_mat(ctx, keys, q), step.runs_mask, scale, 0.0)  # [n_kv, n_run, H, B]
        out = ops.permute(ctx, ops.mul_mat(ctx, values, kq), 0, 2, 1, 3)                  # [hd, H, n_run, B]
        return ops.cont_2d(ctx, out, hd * H, n_run * n_batch)

    def _step_for(self, n: int, n_outputs: int, n_kv: int, n_batch: int) -> Step:
        shape = (n, n_outputs, n_kv, n_batch)
        if not (self.reuse_graphs and self._last is not None and self._last[0] == shape):
            step = self._build_decoder(n, n_outputs, n_kv, n_batch=n_batch)
            self._last = None
            self.dec_runner.alloc_graph(step.graph)
            self._last = (shape, step)
        return self._last[1]

    def decode(self, tokens, positions, seqs=None, out_rows=None, n_batch: int = 1) -> np.ndarray:
        """One decoder step: token i at position positions[i] of sequence seqs[i] (default 0); returns the
        logits [len(out_rows), n_vocab] of the rows out_rows (default: the last row). With n_batch B > 1 the
        tokens are B runs of equal length, run b of sequence b, which attends to cross-attention slot b."""
        tokens, positions, seqs, out_rows, cells = self._check_step(tokens, positions, seqs, out_rows)
        if n_batch > 1:
            self._check_batch(seqs, n_batch)
            n_kv = min(self.n_text_ctx, -(-(int(positions.max()) + 1) // RUN_KV_PAD) * RUN_KV_PAD)
        else:
            n_kv = self.kv.n_kv(int(cells.max()) + 1)
        step = self._step_for(tokens.size, len(out_rows), n_kv, n_batch)
        self._run_step(step, tokens, positions, seqs, out_rows, cells)
        logits = np.asarray(tensor_get(step.logits), dtype=np.float32).reshape(-1, self.tok_emb.ne[1])
        logits = logits[:, :self.n_vocab] if self.weights.head_padding else logits
        return logits if step.out_ids is not None else logits[out_rows]

    def _check_batch(self, seqs: np.ndarray, n_batch: int) -> None:
        if n_batch > self.n_cross or seqs.size % n_batch or \
                np.any(seqs != np.repeat(np.arange(n_batch), seqs.size // n_batch)):
            raise GGMLError(f"decode: a batch of {n_batch} needs as many cross-attention slots ({self.n_cross}) "
                            f"and equal runs of tokens of sequences 0..{n_batch - 1} in order")

    def cross_attention_scores(self, tokens, layers, slot: int = 0) -> dict[int, np.ndarray]:
        """The cross-attention scores (q·kᵀ/√hd, before the softmax) of `layers` for a whole token sequence at
        positions 0.. of sequence 0 (its cache cells are overwritten) over the audio encoded into `slot`:
        layer -> [H, n_tokens, n_audio_ctx]."""
        n = len(tokens)
        tokens, positions, seqs, out_rows, cells = self._check_step(tokens, np.arange(n), None, None)
        if not 0 <= slot < self.n_cross:
            raise GGMLError(f"cross_attention_scores: slot {slot} is not one of the {self.n_cross} slots")
        step = self._build_decoder(n, 1, self.kv.n_kv(n), tuple(sorted(set(layers))), slot=slot)
        self._last = None
        self.dec_runner.alloc_graph(step.graph)
        self._run_step(step, tokens, positions, seqs, out_rows, cells)
        return {il: np.asarray(tensor_get(t), dtype=np.float32).reshape(self.n_head, n, self.n_audio_ctx)
                for il, t in step.cross_scores.items()}

    def _check_step(self, tokens, positions, seqs, out_rows):
        tokens = np.asarray(tokens, dtype=np.int32)
        positions = np.asarray(positions, dtype=np.int32)
        n = tokens.size
        seqs = np.zeros(n, dtype=np.int64) if seqs is None else np.asarray(seqs, dtype=np.int64)
        out_rows = [n - 1] if out_rows is None else list(out_rows)
        if n == 0 or positions.shape != (n,) or seqs.shape != (n,):
            raise GGMLError(f"decode: {n} tokens, {positions.size} positions, {seqs.size} sequences")
        if positions.max() >= self.n_text_ctx or seqs.max() >= self.n_seq or min(positions.min(), seqs.min()) < 0:
            raise GGMLError(f"decode: positions must be < {self.n_text_ctx} and sequences < {self.n_seq}")
        return tokens, positions, seqs, out_rows, seqs * self.n_text_ctx + positions

    def _run_step(self, step: Step, tokens, positions, seqs, out_rows, cells) -> None:
        """Fill a planned step's inputs (tokens, positions, cells, rows, the per-sequence causal mask) and run it."""
        tensor_set(step.tokens, tokens)
        tensor_set(step.positions, positions)
        self.kv.set_cells(step, cells)
        if step.out_ids is not None:
            tensor_set(step.out_ids, np.asarray(out_rows, dtype=np.int32))
        kv_cell = np.arange(step.n_kv)[None, :]
        if step.runs_mask is not None:        # a run's cells are its sequence's positions
            visible, mask = kv_cell <= positions[:, None], step.runs_mask
        else:
            visible = (kv_cell >= (seqs * self.n_text_ctx)[:, None]) & (kv_cell <= cells[:, None])
            mask = step.masks[None]
        tensor_set(mask, np.where(visible, np.float32(0), np.float32(-np.inf)).astype(np.float32))
        self.dec_runner.compute(step.graph)

    def copy_sequences(self, order: list[int], n_pos: int) -> None:
        """Beam search's reordering: sequence i's first n_pos cache cells become those of sequence order[i]."""
        if list(order) == list(range(len(order))) or n_pos == 0:
            return
        S, d = self.n_text_ctx, self.n_state
        src = np.asarray(order)
        for il in range(len(self.kv.k)):
            k = tensor_get(self.kv.k[il]).reshape(self.n_seq, S, d)
            k[:len(order), :n_pos] = k[src, :n_pos]
            tensor_set(self.kv.k[il], k)
            v = tensor_get(self.kv.v[il]).reshape(d, self.n_seq, S)
            v[:, :len(order), :n_pos] = v[:, src, :n_pos]
            tensor_set(self.kv.v[il], v)
