"""Exact offset search over canonical solutions (the ideas of MiniMalloc, Moffitt 2023), compiled with Numba.

The decision question: can every interval be placed below a capacity `C`? Any plan can be pushed down
until each buffer rests on another one (or on 0) without growing, and such a plan, read in order of
(offset, index), is produced by placing buffers one at a time, each at the lowest offset consistent with
those already placed. The depth-first search below enumerates exactly these canonical sequences:

* the next buffer must not go below the previous one (offsets rise monotonically; equal offsets in index
  order), so a buffer is placeable only where it rests: at the top of the placed buffers it overlaps in
  time, never lower than the previous offset;
* time is cut into sections (between consecutive start/end events); each section keeps its floor (the top
  of the placed buffers crossing it) and the bytes of the unplaced buffers crossing it; a partial plan is
  dropped when some section's floor, raised to the lowest offset any unplaced buffer crossing it can still
  take, plus those bytes exceeds `C` (spatial inference);
* of two buffers with the same lifetime and size, the earlier index goes first (they are interchangeable);
* children are tried lowest offset first, then by a static order (largest section total, longest
  lifetime, largest area), which makes the first descent a good greedy plan.

The search state lives in arrays so that a call can stop after a number of nodes and a later call can go
on where it stopped: the caller decides the time budget, the search itself is deterministic.
"""

from __future__ import annotations

import numpy as np

from pyggml.core.jit import jit

FOUND, EXHAUSTED, PAUSED = 1, 0, -1


class CanonicalSearch:
    """A resumable depth-first search for a plan of height at most `capacity` (sizes > 0 only)."""

    def __init__(self, start: np.ndarray, end: np.ndarray, size: np.ndarray, capacity: int, rank: np.ndarray):
        n = len(size)
        times = np.unique(np.concatenate([start, end]))
        self.first = np.searchsorted(times, start).astype(np.int64)  # first section crossed
        self.stop = np.searchsorted(times, end).astype(np.int64)  # first section not crossed
        sections = max(len(times) - 1, 1)
        self.size = size.astype(np.int64)
        self.capacity = int(capacity)
        self.rank = rank.astype(np.int64)
        self.overlap_ptr, self.overlap_idx = _overlaps(self.first, self.stop)
        self.twin = _twins(self.first, self.stop, self.size)
        self.placed = np.zeros(n, np.bool_)
        self.offset = np.zeros(n, np.int64)
        self.cand = np.zeros(n, np.int64)
        self.floor = np.zeros(sections, np.int64)
        self.rem = np.zeros(sections + 1, np.int64)
        np.add.at(self.rem, self.first, self.size)
        np.add.at(self.rem, self.stop, -self.size)
        self.rem = np.cumsum(self.rem)[:sections]
        self.children = np.zeros((n + 1, n), np.int32)
        self.n_children = np.zeros(n + 1, np.int64)
        self.next_child = np.zeros(n + 1, np.int64)
        self.chosen = np.zeros(n + 1, np.int64)
        self.saved_cand = np.zeros((n + 1, n), np.int64)
        self.saved_floor = np.zeros((n + 1, sections), np.int64)
        self.by_first = np.argsort(self.first, kind="stable").astype(np.int64)
        self.label = np.zeros(n, np.int64)  # component of each unplaced buffer: (depth it appeared << 12) | index
        _split(self.by_first, self.first, self.stop, self.placed, self.label, -1, 0)
        self.saved_label = np.zeros((n + 1, n), np.int64)
        self.active = np.zeros(n + 1, np.int64)  # the component placed at each depth
        self.opens = np.zeros(n + 1, np.bool_)  # whether that depth places the component's first buffer
        self.depth = np.zeros(2, np.int64)  # [depth, expanded flag of that depth]
        self.status = PAUSED
        self.nodes = 0

    def run(self, max_nodes: int) -> int:
        """Go on for at most `max_nodes` placements; FOUND (offsets in `self.offset`), EXHAUSTED or PAUSED."""
        if self.status != PAUSED:
            return self.status
        self.status, used = _search(self.first, self.stop, self.size, self.capacity, self.rank, self.overlap_ptr,
                                    self.overlap_idx, self.twin, self.by_first, self.placed, self.offset, self.cand,
                                    self.floor, self.rem, self.label, self.children, self.n_children, self.next_child,
                                    self.chosen, self.active, self.opens, self.saved_cand, self.saved_floor,
                                    self.saved_label, self.depth, max_nodes)
        self.nodes += used
        return self.status


def _overlaps(first: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each buffer, the others live in a common section (CSR arrays)."""
    n = len(first)
    order = np.argsort(first, kind="stable")
    pairs_a, pairs_b = [], []
    sorted_first = first[order]
    for rank_a, a in enumerate(order):
        hi = np.searchsorted(sorted_first, stop[a])  # later starters that begin before a stops
        b = order[rank_a + 1:hi]
        pairs_a.append(np.full(len(b), a))
        pairs_b.append(b)
    a = np.concatenate(pairs_a + [np.zeros(0, np.int64)]).astype(np.int64)
    b = np.concatenate(pairs_b + [np.zeros(0, np.int64)]).astype(np.int64)
    src, dst = np.concatenate([a, b]), np.concatenate([b, a])
    by_src = np.argsort(src, kind="stable")
    ptr = np.zeros(n + 1, np.int64)
    np.add.at(ptr, src + 1, 1)
    return np.cumsum(ptr), dst[by_src]


def _twins(first: np.ndarray, stop: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The previous buffer with the same lifetime and size (-1 when none): it must be placed first."""
    twin = np.full(len(size), -1, np.int64)
    seen: dict[tuple[int, int, int], int] = {}
    for i, key in enumerate(zip(first.tolist(), stop.tolist(), size.tolist(), strict=True)):
        twin[i] = seen.get(key, -1)
        seen[key] = i
    return twin


@jit
def _split(by_first, first, stop, placed, label, component, depth):
    """Give the unplaced buffers of `component` (-1: all) new labels, one per group linked by shared
    sections: groups meet in no section, so each can be solved on its own. Returns the number of groups."""
    groups, reach = 0, -1
    for j in by_first:
        if placed[j] or (component >= 0 and label[j] != component):
            continue
        if first[j] >= reach:
            groups += 1
        reach = max(reach, stop[j])
        label[j] = (depth << 12) | (groups - 1)
    return groups


@jit
def _place(b, depth, first, stop, size, capacity, overlap_ptr, overlap_idx, by_first, placed, offset, cand, floor,  # noqa: C901
           rem, label):
    """Place buffer b at its canonical offset, split its component when the remaining buffers fall apart,
    and return whether the sections still fit the capacity."""
    o = cand[b]
    top = o + size[b]
    placed[b] = True
    offset[b] = o
    for k in range(first[b], stop[b]):
        floor[k] = top
        rem[k] -= size[b]
    for p in range(overlap_ptr[b], overlap_ptr[b + 1]):
        j = overlap_idx[p]
        if not placed[j] and cand[j] < top:
            cand[j] = top
    if top > capacity:
        return False
    component = label[b]
    if _split(by_first, first, stop, placed, label, component, depth + 1) == 1:
        for j in range(placed.shape[0]):  # one group: keep the label, so the offsets go on rising
            if not placed[j] and label[j] == ((depth + 1) << 12):
                label[j] = component
    else:
        component = -1  # new groups start again from offset 0
    # spatial inference: each section's lowest usable floor plus the unplaced bytes crossing it
    sections = floor.shape[0]
    lowest = np.full(sections, capacity + 1, np.int64)
    for j in range(placed.shape[0]):
        if not placed[j]:
            c = max(cand[j], o) if label[j] == component else cand[j]
            for k in range(first[j], stop[j]):
                if c < lowest[k]:
                    lowest[k] = c
    for k in range(sections):  # noqa: SIM110 - numba compiles this function: no generator expressions
        if rem[k] > 0 and max(floor[k], lowest[k]) + rem[k] > capacity:
            return False
    return True


@jit
def _expand(d, size, rank, twin, placed, cand, label, chosen, offset, active, children, n_children):  # noqa: C901
    """The buffers that may come next, all from one component (the previous one while it has buffers
    left, else the first remaining): resting at or above the previous offset of that component (ties in
    static order), twins in index order, and below the lowest top any unplaced buffer of the component
    could reach (placing one there would leave a gap that buffer fits in: the plan with that buffer in
    the gap is found elsewhere). Returns whether d starts a component."""
    n = placed.shape[0]
    component = -1
    if d > 0:
        for j in range(n):
            if not placed[j] and label[j] == active[d - 1]:
                component = active[d - 1]
                break
    starts = component < 0
    if starts:
        for j in range(n):
            if not placed[j] and (component < 0 or label[j] < component):
                component = label[j]
    active[d] = component
    last = chosen[d - 1] if d > 0 else -1
    low = 0 if starts else offset[last]
    low_rank = -1 if starts else rank[last]
    keys = np.empty(n, np.int64)
    lowest_top = np.int64(2**62)
    for j in range(n):
        if not placed[j] and label[j] == component and cand[j] + size[j] < lowest_top:
            lowest_top = cand[j] + size[j]
    m = 0
    for j in range(n):
        if placed[j] or label[j] != component or (twin[j] >= 0 and not placed[twin[j]]):
            continue
        if cand[j] < low or (cand[j] == low and rank[j] < low_rank) or cand[j] >= lowest_top:
            continue
        children[d, m] = j
        keys[m] = cand[j] * n + rank[j]
        m += 1
    order = np.argsort(keys[:m])
    picked = children[d, :m].copy()
    for i in range(m):
        children[d, i] = picked[order[i]]
    n_children[d] = m
    return starts


@jit
def _undo(d, first, stop, size, placed, cand, floor, rem, label, chosen, saved_cand, saved_floor, saved_label):
    """Take back the placement made at depth d, restoring the state saved before it."""
    b = chosen[d]
    placed[b] = False
    for k in range(first[b], stop[b]):
        rem[k] += size[b]
    cand[:] = saved_cand[d]
    floor[:] = saved_floor[d]
    label[:] = saved_label[d]


@jit
def _search(first, stop, size, capacity, rank, overlap_ptr, overlap_idx, twin, by_first, placed, offset, cand, floor,
            rem, label, children, n_children, next_child, chosen, active, opens, saved_cand, saved_floor, saved_label,
            depth, max_nodes):
    n = placed.shape[0]
    d = depth[0]
    expanded = depth[1] != 0
    nodes = 0
    while True:
        if d == n:
            depth[0], depth[1] = d, 1
            return 1, nodes
        if not expanded:
            opens[d] = _expand(d, size, rank, twin, placed, cand, label, chosen, offset, active, children, n_children)
            next_child[d] = 0
            expanded = True
        if next_child[d] >= n_children[d]:
            # A component that cannot even start dooms the state it appeared in: go back to the choice
            # made just before it appeared (for a component of the root: there is no plan at all).
            appeared = active[d] >> 12 if opens[d] else d
            if d == 0 or appeared == 0:
                depth[0], depth[1] = d, 1
                return 0, nodes
            target = appeared - 1
            while d > target:
                d -= 1
                _undo(d, first, stop, size, placed, cand, floor, rem, label, chosen, saved_cand, saved_floor,
                      saved_label)
            continue
        if nodes >= max_nodes:
            depth[0], depth[1] = d, 1
            return -1, nodes
        b = children[d, next_child[d]]
        next_child[d] += 1
        nodes += 1
        saved_cand[d] = cand
        saved_floor[d] = floor
        saved_label[d] = label
        chosen[d] = b
        if _place(b, d, first, stop, size, capacity, overlap_ptr, overlap_idx, by_first, placed, offset, cand, floor,
                  rem, label):
            d += 1
            expanded = False
        else:
            _undo(d, first, stop, size, placed, cand, floor, rem, label, chosen, saved_cand, saved_floor, saved_label)

MAX_BUFFERS = 1500  # the search keeps two n-by-n tables; beyond this the planner's local search is used


def static_orders(start: np.ndarray, end: np.ndarray, size: np.ndarray, peak: np.ndarray) -> list[np.ndarray]:
    """Ranks for the tie-break among equal offsets: largest section total then area, area then total,
    longest lifetime then size (MiniMalloc's preorders, tried in turn)."""
    width = end - start
    area = width * size
    ranks = []
    for keys in ((-area, -peak), (-peak, -area), (-size, -width)):  # np.lexsort: last key first
        rank = np.empty(len(size), np.int64)
        rank[np.lexsort(keys)] = np.arange(len(size))
        ranks.append(rank)
    return ranks


def solve_capacity(start: np.ndarray, end: np.ndarray, size: np.ndarray, capacity: int,
                   ranks: list[np.ndarray], out_of_time, max_nodes: int | None) -> tuple[int, np.ndarray | None]:
    """Round robin over the static orders with a node limit that doubles each round (a short run that
    finishes beats a long one that is stuck), until one finds a plan, one proves there is none, time
    runs out or `max_nodes` placements were tried in all. Returns (status, offsets or None)."""
    limit, used = max(len(size), 16), 0
    while True:
        limit *= 2
        for rank in ranks:
            if out_of_time() or (max_nodes is not None and used >= max_nodes):
                return PAUSED, None
            search = CanonicalSearch(start, end, size, capacity, rank)
            cap = limit if max_nodes is None else min(limit, max_nodes - used)
            while search.nodes < cap and search.run(min(cap - search.nodes, 20_000)) == PAUSED:
                if out_of_time():
                    break
            used += search.nodes
            if search.status != PAUSED:
                return search.status, search.offset if search.status == FOUND else None
