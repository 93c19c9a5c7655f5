"""Offset planners: where each buffer of a known lifetime lives inside a chunked arena.

The module is pure algorithms over integers, usable without tensors. Read top to bottom:

1. `DynAllocator`, ggml's `ggml_dyn_tallocr` reproduced exactly (the graph allocator drives it
   node by node to get ggml's own offsets and buffer sizes);
2. `Interval`, `load_csv` and `lower_bound` (LOAD, the peak of simultaneously live bytes);
3. `PlanResult` and `verify_offsets`;
4. offline greedy placement (`_Placer`: each interval, in a given order, into the smallest
   free gap that fits);
5. the planners behind `plan_offsets`: ``"ggml"`` (online best fit in time order), ``"size"``
   (greedy by size, for reference), ``"best"`` (greedy over two orders plus culprit promotion,
   never worse than ``"ggml"``) and ``"search"`` (ruin and recreate under a time budget).

Lifetimes are half-open steps ``[start, end)``: a buffer is live at every step ``t`` with
``start <= t < end``. A graph's inclusive lifetime ``[birth, last_use]`` is
``Interval(id, birth, last_use + 1, size)``. The planners have no in-place concept: the graph
allocator merges a chain of in-place tensors (a tensor that takes over its parent's bytes) into
one interval before calling them.
"""

from __future__ import annotations

import bisect
import csv
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Hashable, Sequence

import numpy as np

from pyggml.alloc import canonical
from pyggml.core.jit import jit
from pyggml.errors import AllocationError

__all__ = ["DynAllocator", "Interval", "PLANNERS", "PlanResult", "load_csv", "lower_bound", "plan_offsets",
           "verify_offsets"]

SIZE_MAX = 2**64 - 1
MAX_CHUNKS = 16  # GGML_VBUFFER_MAX_CHUNKS
MAX_FREE_BLOCKS = 256  # per chunk
_UNBOUNDED = SIZE_MAX // 2  # ggml's "infinite" block size, chosen so sums cannot overflow
PLANNERS = ("ggml", "size", "best", "search")


def _align(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment


# ----------------------------------------------------------------------------------------------
# 1. ggml's dynamic allocator
# ----------------------------------------------------------------------------------------------


class _Chunk:
    """One future backend buffer: free blocks sorted by offset, and its high-water mark."""

    __slots__ = ("offsets", "sizes", "max_size")

    def __init__(self, size: int):
        self.offsets = [0]
        self.sizes = [size]
        self.max_size = 0


class DynAllocator:
    """ggml's `ggml_dyn_tallocr`: best fit over free blocks in up to 16 chunks, no memory behind it.

    Every quirk is kept on purpose because the graph allocator must reproduce ggml's offsets:
    a chunk's last block is only used when no hole fits, holes tie to the later block, a later
    chunk with any fitting hole overrides an earlier one, and tails are ranked by the signed
    reuse factor of llama.cpp PR #16788.
    """

    def __init__(self, alignment: int, max_size: int | None = None):
        if alignment < 1:
            raise ValueError(f"alignment must be >= 1, got {alignment}")
        if max_size is not None and max_size < 1:
            raise ValueError(f"max_size must be >= 1 or None, got {max_size}")
        self.alignment = alignment
        self.max_chunk_size = _UNBOUNDED if max_size is None else min(max_size, _UNBOUNDED)
        self._chunks: list[_Chunk] = []

    def reset(self) -> None:
        """Forget every chunk, as ggml does before each reserve."""
        self._chunks = []

    @property
    def chunk_sizes(self) -> list[int]:
        """Per-chunk high-water marks: the sizes of the backend buffers ggml would allocate."""
        return [chunk.max_size for chunk in self._chunks]

    @property
    def total_size(self) -> int:
        """What ggml's `get_buffer_size` reports for this plan: the sum of the chunk sizes."""
        return sum(chunk.max_size for chunk in self._chunks)

    def free_blocks(self, chunk: int) -> list[tuple[int, int]]:
        """(offset, size) of every free block of a chunk, sorted by offset; the last is the tail."""
        return list(zip(self._chunks[chunk].offsets, self._chunks[chunk].sizes, strict=True))

    def alloc(self, size: int) -> tuple[int, int]:
        """Plan `size` bytes (rounded up to the alignment) and return (chunk, offset)."""
        size = _align(size, self.alignment)
        chunk_index, block_index = self._best_hole(size)
        if block_index < 0:
            chunk_index, block_index = self._best_tail(size)
        if block_index < 0:
            chunk_index, block_index = self._new_chunk(size), 0
        chunk = self._chunks[chunk_index]
        offset = chunk.offsets[block_index]
        chunk.offsets[block_index] += size
        chunk.sizes[block_index] -= size
        if chunk.sizes[block_index] == 0:
            del chunk.offsets[block_index], chunk.sizes[block_index]
        chunk.max_size = max(chunk.max_size, offset + size)
        return chunk_index, offset

    def _best_hole(self, size: int) -> tuple[int, int]:
        """Smallest fitting block other than each chunk's last; ties and later chunks win."""
        best_chunk = best_block = -1
        for c, chunk in enumerate(self._chunks):
            best_size = SIZE_MAX  # reset per chunk: the "later chunk overrides" quirk
            sizes = chunk.sizes
            for i in range(len(sizes) - 1):
                block_size = sizes[i]
                if size <= block_size <= best_size:
                    best_chunk, best_block, best_size = c, i, block_size
        return best_chunk, best_block

    def _best_tail(self, size: int) -> tuple[int, int]:
        """Last block that needs no growth and fits tightest, else the one needing least growth."""
        best_chunk = best_block = -1
        best_reuse = None  # INT64_MIN
        for c, chunk in enumerate(self._chunks):
            if not chunk.sizes or chunk.sizes[-1] < size:
                continue
            reuse = chunk.max_size - chunk.offsets[-1] - size
            better_reuse = best_reuse is None or (best_reuse < 0 and reuse > best_reuse)
            better_fit = best_reuse is not None and 0 <= reuse < best_reuse
            if better_reuse or better_fit:
                best_chunk, best_block, best_reuse = c, len(chunk.sizes) - 1, reuse
        return best_chunk, best_block

    def _new_chunk(self, size: int) -> int:
        """Open a chunk of at least `size` bytes; the 16th is unbounded so that planning never fails."""
        if len(self._chunks) >= MAX_CHUNKS:
            raise AllocationError(f"graph allocation: no chunk left for {size} bytes "
                                  f"({MAX_CHUNKS} chunks in use)")
        block = max(size, self.max_chunk_size)
        if len(self._chunks) == MAX_CHUNKS - 1:
            block = _UNBOUNDED
        if block < size:
            raise AllocationError(f"graph allocation: {size} bytes exceed the largest possible chunk ({block})")
        self._chunks.append(_Chunk(block))
        return len(self._chunks) - 1

    def free(self, chunk: int, offset: int, size: int) -> None:
        """Give bytes back: extend the free block that ends at `offset` (then merge it with the next
        one if they touch), else the one that starts right after, else insert a new block.

        A chunk holds at most 256 free blocks; ggml asserts there, pyggml raises AllocationError, as
        it does for a free that overlaps free memory. Freeing 0 bytes does nothing (ggml would insert
        an empty block, which can leave its free list unsorted).
        """
        if not 0 <= chunk < len(self._chunks):
            raise AllocationError(f"free of {size} bytes at offset {offset} names chunk {chunk}, "
                                  f"but only {len(self._chunks)} chunks exist")
        size = _align(size, self.alignment)
        if size == 0:
            return
        offsets, sizes = self._chunks[chunk].offsets, self._chunks[chunk].sizes
        after = bisect.bisect_right(offsets, offset)  # blocks [0, after) start at or before `offset`
        before = after - 1
        if (before >= 0 and offsets[before] + sizes[before] > offset) or \
                (after < len(offsets) and offsets[after] < offset + size):
            raise AllocationError(f"free of {size} bytes at offset {offset} in chunk {chunk} overlaps a free "
                                  f"block (double free?)")
        if before >= 0 and offsets[before] + sizes[before] == offset:
            sizes[before] += size
            if after < len(offsets) and offset + size == offsets[after]:
                sizes[before] += sizes[after]
                del offsets[after], sizes[after]
        elif after < len(offsets) and offset + size == offsets[after]:
            offsets[after] = offset
            sizes[after] += size
        elif len(offsets) >= MAX_FREE_BLOCKS:
            raise AllocationError(f"chunk {chunk} is out of free blocks ({MAX_FREE_BLOCKS}) while freeing "
                                  f"{size} bytes at offset {offset}")
        else:
            offsets.insert(after, offset)
            sizes.insert(after, size)


# ----------------------------------------------------------------------------------------------
# 2. Intervals and the lower bound
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interval:
    """A buffer of `size` bytes live over the half-open steps [start, end)."""

    id: Hashable
    start: int
    end: int
    size: int

    def __post_init__(self):
        if self.end <= self.start:
            raise ValueError(f"interval {self.id!r}: end {self.end} must be greater than start {self.start}")
        if self.size < 0:
            raise ValueError(f"interval {self.id!r}: size {self.size} is negative")


def load_csv(path: str | Path) -> list[Interval]:
    """Read a planning CSV (`id,lower,upper,size`, tests/data/planning/README.md); decimal ids become ints."""
    path = Path(path)
    intervals = []
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header] != ["id", "lower", "upper", "size"]:
            raise ValueError(f"{path}:1: expected the header 'id,lower,upper,size', got {header!r}")
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != 4:
                raise ValueError(f"{path}:{line}: expected 4 fields (id,lower,upper,size), got {len(row)}: {row!r}")
            ident = row[0].strip()
            try:
                start, end, size = (int(v) for v in row[1:])
                intervals.append(Interval(int(ident) if ident.isdecimal() else ident, start, end, size))
            except ValueError as exc:
                raise ValueError(f"{path}:{line}: bad row {row!r}: {exc}") from None
    return intervals


class _Problem:
    """Intervals as NumPy arrays: time compressed to event ranks, sizes padded to the alignment."""

    def __init__(self, intervals: Sequence[Interval], alignment: int):
        if alignment < 1:
            raise ValueError(f"alignment must be >= 1, got {alignment}")
        self.ids = [iv.id for iv in intervals]
        if len(set(self.ids)) != len(self.ids):
            raise ValueError(f"interval ids must be unique; {len(self.ids) - len(set(self.ids))} duplicates")
        self.alignment = alignment
        self.n = len(intervals)
        starts = np.fromiter((iv.start for iv in intervals), np.int64, self.n)
        ends = np.fromiter((iv.end for iv in intervals), np.int64, self.n)
        self.times = np.unique(np.concatenate([starts, ends]))
        self.start = np.searchsorted(self.times, starts)
        self.end = np.searchsorted(self.times, ends)
        self.size = np.fromiter((_align(iv.size, alignment) for iv in intervals), np.int64, self.n)
        self.steps = len(self.times)

    def load_profile(self) -> np.ndarray:
        """Live bytes at every compressed step."""
        delta = np.zeros(self.steps + 1, np.int64)
        np.add.at(delta, self.start, self.size)
        np.add.at(delta, self.end, -self.size)
        return np.cumsum(delta)[:-1]

    def lower_bound(self) -> int:
        return int(self.load_profile().max()) if self.n else 0

    def peak_load_over_lifetime(self) -> np.ndarray:
        """For each interval, the largest live total during its lifetime (a sparse-table range max)."""
        levels = [self.load_profile()]
        while 2 ** len(levels) <= self.steps:
            prev, half = levels[-1], 2 ** (len(levels) - 1)
            levels.append(np.maximum(prev[:-half], prev[half:]))
        length = self.end - self.start
        level = np.frexp(length)[1].astype(np.int64) - 1  # floor(log2(length)), exactly
        result = np.empty(self.n, np.int64)
        for k in np.unique(level):
            sel = np.flatnonzero(level == k)
            table = levels[k]
            result[sel] = np.maximum(table[self.start[sel]], table[self.end[sel] - 2 ** k])
        return result


def lower_bound(intervals: Sequence[Interval], alignment: int = 1) -> int:
    """LOAD: the peak over steps of the summed (padded) sizes of live intervals."""
    return _Problem(intervals, alignment).lower_bound()


# ----------------------------------------------------------------------------------------------
# 3. Results and their verification
# ----------------------------------------------------------------------------------------------


@dataclass
class PlanResult:
    """Where every interval lives: `offsets[id]` inside chunk `chunks[id]`; `height` = sum of chunk sizes."""

    offsets: dict[Hashable, int]
    chunks: dict[Hashable, int]
    chunk_sizes: list[int]
    lower_bound: int
    planner: str
    alignment: int = 1
    max_size: int | None = None
    time_s: float = 0.0
    height: int = field(init=False)

    def __post_init__(self):
        self.height = sum(self.chunk_sizes)


def verify_offsets(intervals: Sequence[Interval], result: PlanResult) -> None:
    """Raise AllocationError naming the culprits if two live intervals share bytes or one leaves its chunk."""
    problem = _Problem(intervals, result.alignment)
    missing = [i for i in problem.ids if i not in result.offsets or i not in result.chunks]
    if missing:
        raise AllocationError(f"{len(missing)} intervals have no placement, e.g. {missing[0]!r}")
    offset = np.fromiter((result.offsets[i] for i in problem.ids), np.int64, problem.n)
    chunk = np.fromiter((result.chunks[i] for i in problem.ids), np.int64, problem.n)
    top = offset + problem.size
    chunk_sizes = np.asarray(result.chunk_sizes + [0], np.int64)
    outside = (offset < 0) | (chunk < 0) | (chunk >= len(result.chunk_sizes)) | (offset % result.alignment != 0)
    outside |= top > chunk_sizes[np.clip(chunk, 0, len(result.chunk_sizes))]
    if result.max_size is not None:
        # A chunk may exceed max_size only to hold one bigger interval, or by being the unbounded 16th.
        largest = np.zeros(len(result.chunk_sizes) + 1, np.int64)
        np.maximum.at(largest, np.clip(chunk, 0, len(result.chunk_sizes)), problem.size)
        capacity = np.maximum(largest[:-1], result.max_size)
        capacity[MAX_CHUNKS - 1:] = _UNBOUNDED
        over = np.flatnonzero(np.asarray(result.chunk_sizes, np.int64) > capacity)
        if over.size:
            c = int(over[0])
            raise AllocationError(f"chunk {c} holds {result.chunk_sizes[c]} bytes, more than max_size "
                                  f"{result.max_size} and more than its largest interval ({largest[c]})")
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise AllocationError(f"interval {problem.ids[i]!r} at chunk {chunk[i]} offset {offset[i]} size "
                              f"{problem.size[i]} does not fit its chunk (chunk sizes {result.chunk_sizes}, "
                              f"alignment {result.alignment})")
    # Every time-overlapping pair has one member starting inside the other's lifetime: walk the
    # intervals by start and compare each with those that start before it ends, in batches.
    order = np.argsort(problem.start, kind="stable")
    starts = problem.start[order]
    last = np.searchsorted(starts, problem.end[order])  # exclusive bound of the later starters
    count = last - np.arange(problem.n) - 1
    batch_start = 0
    while batch_start < problem.n:
        batch_end = batch_start + max(1, int(np.searchsorted(np.cumsum(count[batch_start:]), 1 << 21)))
        first = np.arange(batch_start, batch_end)
        per_first = count[batch_start:batch_end]
        group_start = np.cumsum(per_first) - per_first
        a = order[np.repeat(first, per_first)]
        b = order[np.arange(per_first.sum()) + np.repeat(first + 1 - group_start, per_first)]
        clash = (chunk[a] == chunk[b]) & (offset[a] < top[b]) & (offset[b] < top[a])
        clash &= (problem.size[a] > 0) & (problem.size[b] > 0)
        if clash.any():
            k = int(np.flatnonzero(clash)[0])
            x, y = int(a[k]), int(b[k])
            raise AllocationError(
                f"intervals {problem.ids[x]!r} and {problem.ids[y]!r} are live together and share bytes in chunk "
                f"{chunk[x]}: [{offset[x]}, {top[x]}) and [{offset[y]}, {top[y]})")
        batch_start = batch_end


# ----------------------------------------------------------------------------------------------
# 4. Offline greedy placement
# ----------------------------------------------------------------------------------------------


@dataclass
class _Placement:
    offset: np.ndarray
    chunk: np.ndarray
    chunk_sizes: list[int]
    capacities: list[int]  # how many bytes each chunk may grow to

    @property
    def height(self) -> int:
        return sum(self.chunk_sizes)

    def culprits(self, size: np.ndarray) -> np.ndarray:
        """The intervals whose tops define their chunk's size: moving them earlier may lower it."""
        tops = self.offset + size
        return np.flatnonzero(tops == np.asarray(self.chunk_sizes, np.int64)[self.chunk])


class _Placer:
    """Places intervals one by one, in a given order, into the smallest free gap that fits.

    This is greedy by size of Pisarchyk & Lee 2020 when the order is by size. The placed intervals
    are kept sorted by offset, so that the gaps left by those live with a query are found in one
    pass without sorting (compiled: `_place_in_order`).
    """

    def __init__(self, problem: _Problem):
        self.problem = problem

    def place(self, order: Sequence[int], max_size: int | None,
              keep: tuple[_Placement, np.ndarray] | None = None) -> _Placement:
        """Place the intervals of `order`; with `keep`, the given intervals of a plan stay where they are."""
        p = self.problem
        offset = np.zeros(p.n, np.int64)
        chunk = np.zeros(p.n, np.int64)
        capacities = np.zeros(MAX_CHUNKS + 1, np.int64)
        heights = np.zeros(MAX_CHUNKS + 1, np.int64)
        kept = np.zeros(0, np.int64)
        n_chunks = 0
        if keep is not None:
            plan, kept = keep
            offset[kept], chunk[kept] = plan.offset[kept], plan.chunk[kept]
            n_chunks = len(plan.capacities)
            capacities[:n_chunks] = plan.capacities
            np.maximum.at(heights, chunk[kept], offset[kept] + p.size[kept])
        kept = kept[np.argsort(offset[kept], kind="stable")].astype(np.int64)
        n_chunks = _place_in_order(np.asarray(order, np.int64), kept, p.start, p.end, p.size, offset, chunk,
                                   capacities, heights, n_chunks, -1 if max_size is None else max_size, MAX_CHUNKS,
                                   _UNBOUNDED)
        return _Placement(offset, chunk, heights[:n_chunks].tolist(), capacities[:n_chunks].tolist())


@jit
def _place_in_order(order, kept, start, end, size, offset, chunk, capacities, heights, n_chunks, max_size,
                    max_chunks, unbounded):
    """Each interval of `order` into the smallest hole below the placed intervals live with it (the lowest
    such hole on ties), else on top of them, else into a new chunk; `kept` are placed already (by offset)."""
    n = start.shape[0]
    by_offset = np.empty(n, np.int64)  # placed intervals, sorted by offset
    placed = kept.shape[0]
    for at in range(placed):  # not a slice assignment: its shape check compiles Numba's string formatting (2 s)
        by_offset[at] = kept[at]
    for i in order:
        z = size[i]
        c, o = 0, -1
        for c in range(n_chunks):
            o = _best_gap(by_offset, placed, i, c, start, end, size, offset, chunk, z, capacities[c], unbounded)
            if o >= 0:
                break
        if o < 0:
            c, o = n_chunks, 0
            n_chunks += 1
            capacities[c] = unbounded if max_size < 0 or c == max_chunks - 1 else max(max_size, z)
            heights[c] = 0
        heights[c] = max(heights[c], o + z)
        offset[i], chunk[i] = o, c
        at = placed
        while at > 0 and offset[by_offset[at - 1]] > o:
            by_offset[at] = by_offset[at - 1]
            at -= 1
        by_offset[at] = i
        placed += 1
    return n_chunks


@jit
def _best_gap(by_offset, placed, i, c, start, end, size, offset, chunk, z, capacity, unbounded):
    """Lowest offset of the smallest hole below the intervals of chunk c live with i that fits z bytes,
    else the top of them (-1: the chunk's capacity is exceeded)."""
    best_hole, best_at = unbounded, -1
    busy_to = 0
    for k in range(placed):
        j = by_offset[k]
        if chunk[j] != c or start[j] >= end[i] or end[j] <= start[i]:
            continue
        hole = offset[j] - busy_to
        if z <= hole < best_hole:
            best_hole, best_at = hole, busy_to
        busy_to = max(busy_to, offset[j] + size[j])
    if best_at >= 0:
        return best_at
    return busy_to if busy_to + z <= capacity else -1


# ----------------------------------------------------------------------------------------------
# 5. The planners
# ----------------------------------------------------------------------------------------------


def _plan_ggml(problem: _Problem, max_size: int | None) -> _Placement:
    """ggml's online best fit in time order.

    At each step the intervals that end there are freed first, then those that start there are
    allocated; ties go by input order. This is gallocr's order: node i is allocated, then the
    srcs whose last consumer is i are freed, and they end at i + 1.
    """
    allocator = DynAllocator(problem.alignment, max_size)
    address = [(0, 0)] * problem.n
    # Event keys: 2 * step for a free, 2 * step + 1 for an allocation; the stable sort keeps input order.
    events = np.argsort(np.concatenate((2 * problem.end, 2 * problem.start + 1)), kind="stable")
    size = problem.size.tolist()
    for i, allocating in zip((events % problem.n).tolist(), (events >= problem.n).tolist(), strict=True):
        if allocating:
            address[i] = allocator.alloc(size[i])
        else:
            allocator.free(*address[i], size[i])
    chunk, offset = np.array(address, np.int64).reshape(problem.n, 2).T
    capacities = [max(allocator.max_chunk_size, size) for size in allocator.chunk_sizes]
    capacities[MAX_CHUNKS - 1:] = [_UNBOUNDED] * len(capacities[MAX_CHUNKS - 1:])
    return _Placement(offset, chunk, allocator.chunk_sizes, capacities)


def _orderings(problem: _Problem) -> list[list[int]]:
    """Placement orders worth trying: busiest lifetime first (breadth), then largest first (size)."""
    peak = problem.peak_load_over_lifetime()
    by_breadth = np.lexsort((problem.start, -problem.size, -peak))
    return [by_breadth.tolist(), _by_size(problem)]


def _by_size(problem: _Problem) -> list[int]:
    """Greedy by size's order: largest first, earlier start first among equals."""
    return np.lexsort((problem.start, -problem.size)).tolist()


def _promoted(order: list[int], culprits: np.ndarray) -> list[int]:
    """The same order with the culprits moved to the front."""
    front = culprits.tolist()
    moved = set(front)
    return front + [i for i in order if i not in moved]


@dataclass(frozen=True)
class _Effort:
    """How hard the greedy stage tries: promotion rounds per order, and how close to the lower
    bound (as a fraction of it) a plan must be to stop promoting, or to skip the remaining orders."""

    rounds: int
    stop_promoting: float
    skip_orders: float


QUICK = _Effort(rounds=3, stop_promoting=1 / 256, skip_orders=1 / 100)  # "best": big graphs plan fast
THOROUGH = _Effort(rounds=8, stop_promoting=0.0, skip_orders=0.0)  # "search", before its local search


def _plan_best(problem: _Problem, placer: _Placer, max_size: int | None, target: int,
               effort: _Effort, deadline: float = float("inf")) -> _Placement:
    """Greedy placement over the orders of `_orderings`, each followed by culprit promotion.

    A promotion round moves the intervals that define the height to the front of the order and
    places everything again; rounds go on while they lower the height. Past `deadline` no further
    placement starts (the first one always runs).
    """
    stop_promoting = target + int(target * effort.stop_promoting)
    skip_orders = target + int(target * effort.skip_orders)
    best = None
    for order in _orderings(problem):
        previous = None
        for _ in range(effort.rounds + 1):
            placement = placer.place(order, max_size)
            if best is None or placement.height < best.height:
                best = placement
            if best.height <= stop_promoting or (previous is not None and placement.height >= previous) \
                    or time.perf_counter() > deadline:
                break
            previous = placement.height
            order = _promoted(order, placement.culprits(problem.size))
        if best.height <= skip_orders or time.perf_counter() > deadline:
            break
    return best


def _plan_search(problem: _Problem, placer: _Placer, max_size: int | None, target: int,
                 start: _Placement, deadline: float, seed: int, max_iterations: int | None) -> _Placement:
    """Ruin and recreate: lift a culprit and intervals live with it, place them again.

    The lifted intervals go back in a perturbed largest-first order while everything else stays.
    A change is kept when it does not raise (height, sum of tops); the sum rewards pushing bytes
    down, which lets the search walk across plateaus of equal height. The sequence of tries
    depends only on `seed`; the deadline decides how many run.
    """
    rng = np.random.default_rng(seed)
    size = problem.size
    best = current = start
    current_score = (current.height, int((current.offset + size).sum()))
    iteration = 0
    while best.height > target and iteration != max_iterations and time.perf_counter() < deadline:
        iteration += 1
        lifted = _ruin(problem, current, rng)
        kept = np.ones(problem.n, bool)
        kept[lifted] = False
        noisy_size = size[lifted] * rng.uniform(0.6, 1.4, lifted.size)
        order = lifted[np.argsort(-noisy_size, kind="stable")].tolist()
        candidate = placer.place(order, max_size, keep=(current, np.flatnonzero(kept)))
        score = (candidate.height, int((candidate.offset + size).sum()))
        if score <= current_score:
            current, current_score = candidate, score
            if candidate.height < best.height:
                best = candidate
    return best


def _plan_canonical(problem: _Problem, max_size: int | None, target: int, start: _Placement, deadline: float,
                    seed: int, max_iterations: int | None) -> _Placement:
    """Binary search on the capacity between LOAD and the best height with `canonical`'s exact search.

    Each capacity gets a short share of the time (or `max_iterations` placements): tight capacities
    that the search cannot settle in their share are skipped, and tried again with twice the share
    when the others are settled. Plans stay in one chunk, so the search only runs when the starting
    plan fits one chunk.
    """
    nonzero = np.flatnonzero(problem.size > 0)
    if not 0 < nonzero.size <= canonical.MAX_BUFFERS or (max_size is not None and start.height > max_size):
        return start
    begin, end, size = problem.start[nonzero], problem.end[nonzero], problem.size[nonzero]
    ranks = canonical.static_orders(begin, end, size, problem.peak_load_over_lifetime()[nonzero])
    ranks = ranks[seed % len(ranks):] + ranks[:seed % len(ranks)]
    best, proven, hi = start, target, start.height  # a plan of height < proven is impossible; one of hi exists
    lo, share = proven, max(deadline - time.perf_counter(), 0.0) / 16
    while proven < hi and time.perf_counter() < deadline:
        if lo >= hi:  # every capacity below hi was left unsettled: go over them again with more time
            lo, share = proven, 2 * share
        capacity = lo if lo == proven else (lo + hi) // 2
        until = min(deadline, time.perf_counter() + share * (2 if capacity == target else 1))
        status, offsets = canonical.solve_capacity(begin, end, size, capacity, ranks,
                                                   lambda until=until: time.perf_counter() > until,
                                                   max_iterations)
        if status == canonical.FOUND:
            offset = np.zeros(problem.n, np.int64)
            offset[nonzero] = offsets
            height = int((offset + problem.size).max())
            capacities = [_UNBOUNDED if max_size is None else max(max_size, height)]
            best, hi = _Placement(offset, np.zeros(problem.n, np.int64), [height], capacities), height
        elif status == canonical.EXHAUSTED:
            proven = lo = capacity + 1
        else:
            lo = capacity + 1
            if max_iterations is not None:
                break  # a run bounded by placements gives up where a timed one would retry
    return best


def _ruin(problem: _Problem, plan: _Placement, rng: np.random.Generator) -> np.ndarray:
    """A random culprit and, of the intervals live with it in its chunk, either all those reaching
    above a random level (a band to repack) or a random share, higher ones likelier."""
    culprits = plan.culprits(problem.size)
    victim = culprits[rng.integers(culprits.size)]
    live = np.flatnonzero((problem.start < problem.end[victim]) & (problem.end > problem.start[victim])
                          & (plan.chunk == plan.chunk[victim]))
    height = max(plan.chunk_sizes[plan.chunk[victim]], 1)
    tops = plan.offset[live] + problem.size[live]
    if rng.random() < 0.5:
        lifted = live[tops > rng.uniform(0.0, 0.9) * height]
    else:
        lifted = live[rng.random(live.size) < rng.uniform(0.05, 0.6) * (0.25 + tops / height)]
    return np.union1d(lifted, [victim])


def plan_offsets(intervals: Sequence[Interval], alignment: int = 1, planner: str = "best",
                 budget_s: float | None = None, max_size: int | None = None, seed: int = 0,
                 max_iterations: int | None = None) -> PlanResult:
    """Give every interval a chunk and an offset so that no two live intervals share bytes.

    Planners: ``"ggml"`` (ggml's online best fit, see `_plan_ggml`), ``"size"`` (plain greedy by
    size, for reference), ``"best"`` (several greedy orders with culprit promotion) and
    ``"search"`` (a more thorough ``"best"``, then ruin and recreate until `budget_s` seconds,
    default 3, have passed since the call, or after `max_iterations` tries). ``"best"`` and
    ``"search"`` fall back to ggml's plan when it is smaller.
    Sizes are padded to `alignment`; chunks hold at most `max_size` bytes, except that an interval
    bigger than that gets a chunk of its own size and the 16th chunk is unbounded, as in ggml.
    """
    if planner not in PLANNERS:
        raise ValueError(f"unknown planner {planner!r}; choose one of {', '.join(map(repr, PLANNERS))}")
    if max_size is not None and max_size < 1:
        raise ValueError(f"max_size must be >= 1 or None, got {max_size}")
    began = time.perf_counter()
    problem = _Problem(intervals, alignment)
    target = problem.lower_bound()
    if planner == "ggml":
        placement = _plan_ggml(problem, max_size)
    elif planner == "size":
        placement = _Placer(problem).place(_by_size(problem), max_size)
    else:
        placer = _Placer(problem)
        deadline = began + (3.0 if budget_s is None else budget_s) if planner == "search" else float("inf")
        placement = _plan_best(problem, placer, max_size, target, THOROUGH if planner == "search" else QUICK, deadline)
        if planner == "search":  # ggml's plan is only a fallback here: the search gets the time first
            placement = _plan_canonical(problem, max_size, target, placement, deadline, seed, max_iterations)
            placement = _plan_search(problem, placer, max_size, target, placement, deadline, seed, max_iterations)
        if placement.height > target:
            online = _plan_ggml(problem, max_size)
            if online.height < placement.height:
                placement = online
    return PlanResult(offsets=dict(zip(problem.ids, placement.offset.tolist(), strict=True)),
                      chunks=dict(zip(problem.ids, placement.chunk.tolist(), strict=True)),
                      chunk_sizes=placement.chunk_sizes, lower_bound=target, planner=planner,
                      alignment=alignment, max_size=max_size, time_s=time.perf_counter() - began)
