"""Memory-aware execution orders: topological orders of a graph's nodes that keep fewer bytes alive.

ggml runs nodes in the order the graph was built, and its lower bound (LOAD) follows from that order.
Any other order that respects the same constraints computes the same values, so a planner may choose one:

* data dependencies: a node runs after every node among its sources;
* side effects: a node that writes memory it did not allocate (an in-place op, `cpy`/`set_rows` into a
  view, anything whose result is a view but whose op is not a view op) writes its root tensor's bytes,
  so every node touching that root (reading it or a view of it, writing it, being a view of it) keeps
  its position relative to the others: they are chained in the original order.

Candidate orders come from a greedy list scheduler: among the ready nodes, run the one that adds the
fewest live bytes (its own bytes, minus the sources it is the last user of), ties broken either by
position in the original order or by readiness (most recently ready first, which finishes a branch
before starting the next one). The graph allocator evaluates each candidate by its LOAD and keeps the
best, the original order included, so reordering never raises the lower bound.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from pyggml.core.tensor import VIEW_OPS, Op, Tensor, TensorFlag

_PINNED = int(TensorFlag.OUTPUT) | int(TensorFlag.INPUT)


def writes_foreign_memory(t: Tensor) -> bool:
    """Whether computing t writes bytes of another tensor (t is a view produced by a computing op)."""
    return t.view_src is not None and t.op != Op.NONE and t.op not in VIEW_OPS


def dependencies(nodes: list[Tensor]) -> list[set[int]]:
    """For each node position, the positions of the nodes that must run before it."""
    position = {id(t): i for i, t in enumerate(nodes)}
    before = [set() for _ in nodes]
    touching: dict[int, list[int]] = {}  # root id -> positions of nodes touching it, in order
    written = set()
    for i, t in enumerate(nodes):
        roots = {id(t.view_src if t.view_src is not None else t)}
        for s in t.src:
            if s is None:
                continue
            j = position.get(id(s))
            if j is not None:
                before[i].add(j)
            roots.add(id(s.view_src if s.view_src is not None else s))
        for r in roots:
            touching.setdefault(r, []).append(i)
        if writes_foreign_memory(t):
            written.add(id(t.view_src))
    for r in written:
        chain = touching[r]
        for a, b in pairwise(chain):
            before[b].add(a)
    return before


class _Costs:
    """Live-byte bookkeeping of the greedy scheduler: bytes each node allocates, and how many nodes
    still read each allocated root (forward), or whether a placed node read it already (backward)."""

    def __init__(self, nodes: list[Tensor], size_of, backward: bool):
        self.backward = backward
        self.size = [0] * len(nodes)
        self.roots: list[list[int]] = []  # per node: ids of the allocated roots it reads
        self.users: dict[int, int] = {}
        self.root_size: dict[int, int] = {}
        for i, t in enumerate(nodes):
            if t.view_src is None and t.data is None and t.buffer is None:
                self.size[i] = size_of(t)
                if not int(t.flags) & _PINNED:
                    self.root_size[id(t)] = self.size[i]
        for t in nodes:
            roots = {id(s.view_src if s.view_src is not None else s) for s in t.src if s is not None}
            if t.view_src is not None:
                roots.add(id(t.view_src))  # a view keeps its root alive until the view is used
            roots = [r for r in roots if r in self.root_size]
            self.roots.append(roots)
            for r in roots:
                self.users[r] = self.users.get(r, 0) + 1

    def delta(self, i: int) -> int:
        if self.backward:  # placing i: the sources nobody placed read yet become live, i's bytes end
            return sum(self.root_size[r] for r in self.roots[i] if self.users[r] > 0) - self.size[i]
        return self.size[i] - sum(self.root_size[r] for r in self.roots[i] if self.users[r] == 1)

    def run(self, i: int) -> None:
        for r in self.roots[i]:
            self.users[r] = 0 if self.backward else self.users[r] - 1


def greedy_order(nodes: list[Tensor], before: list[set[int]], size_of, lifo: bool, backward: bool = False) -> list[int]:
    """A topological order that runs, at each step, the ready node adding the fewest live bytes.

    `backward` builds the order from the end instead: a node is ready once all its users are placed,
    and placing it ends its own lifetime (it is born there) and starts those of its sources that no
    placed node read yet, so the scheduler delays producers until just before their first use.
    """
    n = len(nodes)
    after: list[list[int]] = [[] for _ in nodes]
    for i, b in enumerate(before):
        for j in b:
            after[j].append(i)
    if backward:
        before, after = [set(a) for a in after], [sorted(b) for b in before]
    costs = _Costs(nodes, size_of, backward)
    waiting = [len(b) for b in before]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    stamp = dict.fromkeys(ready, 0)
    order = []
    while ready:
        best_key, best_at = None, -1
        for at, i in enumerate(ready):
            key = (costs.delta(i), -stamp[i] if lifo else 0, -i if backward else i)
            if best_key is None or key < best_key:
                best_key, best_at = key, at
        i = ready[best_at]
        ready[best_at] = ready[-1]
        ready.pop()
        order.append(i)
        costs.run(i)
        for k in after[i]:
            waiting[k] -= 1
            if waiting[k] == 0:
                ready.append(k)
                stamp[k] = len(order)
    if len(order) != n:
        raise AssertionError("the dependencies of the graph's nodes have a cycle")
    return order[::-1] if backward else order


def subtree_order(nodes: list[Tensor], before: list[set[int]], size_of) -> list[int]:
    """A depth-first post-order that visits, below each node, the dependencies needing the most memory
    for themselves first (decreasing peak minus result size: Liu's optimal order for trees, applied to
    the DAG as if it were one); the sinks go in the same way, so each branch is finished before the next."""
    size = [size_of(t) if _allocates(t) else 0 for t in nodes]
    peak = [0] * len(nodes)
    children: list[list[int]] = []
    for i in range(len(nodes)):  # the original order is topological
        kids = sorted(before[i], key=lambda k: (size[k] - peak[k], k))
        held = top = 0
        for k in kids:
            top = max(top, held + peak[k])
            held += size[k]
        peak[i] = max(top, held + size[i])
        children.append(kids)
    used = set().union(*before) if before else set()
    sinks = sorted((i for i in range(len(nodes)) if i not in used), key=lambda k: (size[k] - peak[k], k))
    order, done = [], [False] * len(nodes)
    for root in sinks:
        stack = [(root, 0)]
        while stack:
            i, at = stack.pop()
            if done[i]:
                continue
            kids = children[i]
            while at < len(kids) and done[kids[at]]:
                at += 1
            if at < len(kids):
                stack.append((i, at + 1))
                stack.append((kids[at], 0))
            else:
                done[i] = True
                order.append(i)
    return order


def is_topological(order: list[int], before: list[set[int]]) -> bool:
    """Whether every node comes after all the nodes it depends on."""
    seen = set()
    for i in order:
        if not before[i] <= seen:
            return False
        seen.add(i)
    return len(seen) == len(before)


class LiveModel:
    """Live bytes of the graph's tensors under any node order, in NumPy: a tensor lives from its node's
    step (step 0 for the leafs the allocator places) to its last reader's step, outputs to the end; a
    source of the same layout that dies at an in-place capable reader hands its bytes over a step early
    (the allocator's in-place rule). Cheap enough to score thousands of moves."""

    def __init__(self, nodes: list[Tensor], size_of, inplace_ops: frozenset):
        self.n = n = len(nodes)
        index = {id(t): i for i, t in enumerate(nodes)}
        sizes = [size_of(t) if _allocates(t) else 0 for t in nodes]
        pinned = [bool(int(t.flags) & int(TensorFlag.OUTPUT)) for t in nodes]
        readers_r, readers_c, handover_r, handover_c = [], [], [], []
        viewed = {id(t.view_src) for t in nodes if t.view_src is not None}
        for c, t in enumerate(nodes):
            roots = [s.view_src if s.view_src is not None else s for s in t.src if s is not None]
            if t.view_src is not None:
                roots.append(t.view_src)
            for r in roots:
                k = index.get(id(r))
                if k is None:
                    if not _allocates(r):
                        continue
                    k = index[id(r)] = len(sizes)
                    sizes.append(size_of(r))
                    pinned.append(bool(int(r.flags) & int(TensorFlag.OUTPUT)))
                readers_r.append(k)
                readers_c.append(c)
            if t.op in inplace_ops and sizes[c]:
                for s in t.src:
                    k = None if s is None else index.get(id(s))
                    if k is not None and k < n and sizes[k] and not pinned[k] and id(s) not in viewed and \
                            s.type == t.type and s.ne == t.ne and s.nb == t.nb:
                        handover_r.append(k)
                        handover_c.append(c)
        self.size = np.array(sizes, np.int64)
        self.view = [t.op in VIEW_OPS for t in nodes]  # view nodes move with their source
        self.pinned = np.array(pinned, bool)
        self.readers_r, self.readers_c = np.array(readers_r, np.int64), np.array(readers_c, np.int64)
        self.handover_r, self.handover_c = np.array(handover_r, np.int64), np.array(handover_c, np.int64)

    def lifetimes(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(birth, death) steps of every tensor for node positions `pos`, both inclusive."""
        birth = np.zeros(len(self.size), np.int64)
        birth[:self.n] = pos
        death = birth.copy()
        np.maximum.at(death, self.readers_r, pos[self.readers_c])
        death[self.pinned] = self.n - 1
        handed = death[self.handover_r] == pos[self.handover_c]
        death[self.handover_r[handed]] -= 1
        return birth, death

    def score(self, pos: np.ndarray) -> tuple[int, int, np.ndarray]:
        """(peak live bytes, byte-steps, live bytes per step)."""
        birth, death = self.lifetimes(pos)
        keep = death >= birth
        delta = np.zeros(self.n + 1, np.int64)
        np.add.at(delta, birth[keep], self.size[keep])
        np.add.at(delta, death[keep] + 1, -self.size[keep])
        live = np.cumsum(delta)[:-1]
        return int(live.max()) if self.n else 0, int((self.size * np.maximum(death - birth + 1, 0)).sum()), live


def _allocates(t: Tensor) -> bool:
    return t.view_src is None and t.data is None and t.buffer is None


def improve(order: list[int], before: list[set[int]], model: LiveModel, max_moves: int) -> list[int]:  # noqa: C901
    """Local search on the peak: move a node live across the peak step (with the views of it) to just
    before its first other dependent (so it is born after the peak), or the last reader of such a node
    to just after its last dependency (so the node dies before it), while that lowers (peak, byte-steps)."""
    after: list[list[int]] = [[] for _ in before]
    for i, b in enumerate(before):
        for j in b:
            after[j].append(i)
    order = list(order)
    if not order:
        return order
    pos = np.empty(len(order), np.int64)
    pos[order] = np.arange(len(order))
    peak, area, live = model.score(pos)
    for _ in range(max_moves):
        p = int(live.argmax())
        birth, death = model.lifetimes(pos)
        across = np.flatnonzero((birth <= p) & (death >= p) & (model.size > 0))
        moves = []
        for t in across.tolist():
            if t < model.n and birth[t] < p:
                group = _with_views(t, before, after, model.view)
                users = [k for g in group for k in after[g] if k not in group]
                first_user = min(users, key=lambda k: pos[k], default=None)
                if first_user is None or pos[first_user] > p + 1:
                    moves.append((group, first_user, True))  # born just before its first user, after the peak
            if death[t] > p:
                for c in model.readers_c[model.readers_r == t].tolist():
                    if pos[c] == death[t]:
                        last_need = max(before[c], key=lambda k: pos[k], default=None)
                        if last_need is None or pos[last_need] + 1 < p:
                            moves.append(([c], last_need, False))  # right after what it needs, before the peak
        best = None
        for group, anchor, ahead in moves:
            trial = _moved(order, group, anchor, ahead)
            trial_pos = np.empty(len(trial), np.int64)
            trial_pos[trial] = np.arange(len(trial))
            score = model.score(trial_pos)
            if score[:2] < (peak, area) and (best is None or score[:2] < best[0][:2]):
                best = (score, trial, trial_pos)
        if best is None:
            break
        (peak, area, live), order, pos = best
    return order


def _with_views(t: int, before: list[set[int]], after: list[list[int]], view: list[bool]) -> list[int]:
    """t and the view nodes that depend on nothing but t and each other (they can move together)."""
    group, members = [t], {t}
    for g in group:
        for k in after[g]:
            if view[k] and k not in members and before[k] <= members:
                group.append(k)
                members.add(k)
    return group


def _moved(order: list[int], group: list[int], anchor: int | None, ahead: bool) -> list[int]:
    """The order with `group` (kept in its order) moved just before `anchor` (ahead) or just after it
    (None: to the end, or to the front)."""
    members = set(group)
    moving = [i for i in order if i in members]
    rest = [i for i in order if i not in members]
    at = (len(rest) if ahead else 0) if anchor is None else rest.index(anchor) + (0 if ahead else 1)
    return rest[:at] + moving + rest[at:]


def candidate_orders(nodes: list[Tensor], size_of, inplace_ops: frozenset = frozenset(),
                     max_moves: int = 200) -> list[list[int]]:
    """The original order, the greedy ones (forward and backward, position and readiness tie-breaks)
    and each of them improved by `improve`, without duplicates."""
    before = dependencies(nodes)
    model = LiveModel(nodes, size_of, inplace_ops)
    starts = [list(range(len(nodes)))]
    for backward in (False, True):
        for lifo in (False, True):
            starts.append(greedy_order(nodes, before, size_of, lifo, backward))
    starts.append(subtree_order(nodes, before, size_of))
    orders = []
    for order in starts + [improve(o, before, model, max_moves) for o in starts]:
        if order not in orders:
            orders.append(order)
    return orders
