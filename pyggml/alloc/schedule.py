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
        for a, b in zip(chain, chain[1:]):
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


def is_topological(order: list[int], before: list[set[int]]) -> bool:
    """Whether every node comes after all the nodes it depends on."""
    seen = set()
    for i in order:
        if not before[i] <= seen:
            return False
        seen.add(i)
    return len(seen) == len(before)


def candidate_orders(nodes: list[Tensor], size_of) -> list[list[int]]:
    """The original order and the greedy ones (position and readiness tie-breaks), without duplicates."""
    before = dependencies(nodes)
    orders = [list(range(len(nodes)))]
    for backward in (False, True):
        for lifo in (False, True):
            order = greedy_order(nodes, before, size_of, lifo, backward)
            if order not in orders:
                orders.append(order)
    return orders

