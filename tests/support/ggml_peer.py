"""The ggml peer: run a pyggml Graph on ggml 0.15.3's own CPU backend (ggml-python's libraries, through ctypes).

Every pyggml tensor gets a ggml twin whose struct fields (type, ne, nb, op, op_params, flags,
src, view_src, view_offs, name) are written directly, so any op pyggml can build runs in ggml
with no per-op mapping. Memory comes from ggml itself: `ggml_backend_alloc_ctx_tensors` for
the tensors the caller calls preallocated (weights, caches) and `ggml_gallocr` for the rest,
which also makes ggml's planning results (offsets, compute buffer size) visible.

Test support only: the pyggml package never imports this module. ggml-python's own ctypes
signatures are partly stale (pointer returns declared as int), so the functions used here are
declared again on private CDLL handles.
"""

from __future__ import annotations

import contextlib
import ctypes as C
import importlib.util
import json
import multiprocessing
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from pyggml.core import types as T
from pyggml.core.context import Context
from pyggml.core.graph import Graph, reachable_tensors
from pyggml.core.graph_json import graph_to_json, load_graph_json
from pyggml.core.tensor import MAX_DIMS, MAX_NAME, MAX_OP_PARAMS, MAX_SRC, Tensor, host_ndarray
from pyggml.errors import (AllocationError, BackendError, GGMLError, GraphError, LayoutError, NotAllocatedError,
                           UnsupportedOpError, UnsupportedTypeError)


class PeerUnavailable(ImportError):
    """ggml-python (and so the ggml shared libraries) is not installed."""


class PeerCrashed(BackendError):
    """ggml aborted (GGML_ASSERT, GGML_ABORT) or crashed while the isolated peer computed a graph."""


class GGMLTensorStruct(C.Structure):
    """struct ggml_tensor of ggml 0.15.3 (include/ggml.h), field for field."""

    _fields_ = [
        ("type", C.c_int),
        ("buffer", C.c_void_p),
        ("ne", C.c_int64 * MAX_DIMS),
        ("nb", C.c_size_t * MAX_DIMS),
        ("op", C.c_int),
        ("op_params", C.c_int32 * MAX_OP_PARAMS),
        ("flags", C.c_int32),
        ("src", C.c_void_p * MAX_SRC),
        ("view_src", C.c_void_p),
        ("view_offs", C.c_size_t),
        ("data", C.c_void_p),
        ("name", C.c_char * MAX_NAME),
        ("extra", C.c_void_p),
        ("padding", C.c_char * 8),
    ]


class GGMLGraphHead(C.Structure):
    """The leading fields of struct ggml_cgraph (src/ggml-impl.h): enough to read and reorder nodes and leafs."""

    _fields_ = [
        ("size", C.c_int),
        ("n_nodes", C.c_int),
        ("n_leafs", C.c_int),
        ("nodes", C.POINTER(C.c_void_p)),
        ("grads", C.POINTER(C.c_void_p)),
        ("grad_accs", C.POINTER(C.c_void_p)),
        ("leafs", C.POINTER(C.c_void_p)),
    ]


class InitParams(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]


_P = C.c_void_p
_SIGNATURES = {
    "ggml_version": (C.c_char_p, []),
    "ggml_init": (_P, [InitParams]),
    "ggml_free": (None, [_P]),
    "ggml_tensor_overhead": (C.c_size_t, []),
    "ggml_graph_overhead_custom": (C.c_size_t, [C.c_size_t, C.c_bool]),
    "ggml_new_tensor": (_P, [_P, C.c_int, C.c_int, C.POINTER(C.c_int64)]),
    "ggml_new_graph_custom": (_P, [_P, C.c_size_t, C.c_bool]),
    "ggml_build_forward_expand": (None, [_P, _P]),
    "ggml_nbytes": (C.c_size_t, [_P]),
    "ggml_type_size": (C.c_size_t, [C.c_int]),
    "ggml_blck_size": (C.c_int64, [C.c_int]),
    "ggml_backend_cpu_init": (_P, []),
    "ggml_backend_cpu_set_n_threads": (None, [_P, C.c_int]),
    "ggml_backend_free": (None, [_P]),
    "ggml_backend_get_default_buffer_type": (_P, [_P]),
    "ggml_backend_supports_op": (C.c_bool, [_P, _P]),
    "ggml_backend_alloc_ctx_tensors": (_P, [_P, _P]),
    "ggml_backend_buffer_free": (None, [_P]),
    "ggml_backend_buffer_get_base": (_P, [_P]),
    "ggml_gallocr_new": (_P, [_P]),
    "ggml_gallocr_free": (None, [_P]),
    "ggml_gallocr_alloc_graph": (C.c_bool, [_P, _P]),
    "ggml_gallocr_get_buffer_size": (C.c_size_t, [_P, C.c_int]),
    "ggml_backend_tensor_set": (None, [_P, _P, C.c_size_t, C.c_size_t]),
    "ggml_backend_tensor_get": (None, [_P, _P, C.c_size_t, C.c_size_t]),
    "ggml_backend_graph_compute": (C.c_int, [_P, _P]),
}

_LIB = None


def lib_dir() -> Path:
    """Where ggml-python keeps libggml-base.so and libggml-cpu.so (found without importing its module)."""
    spec = importlib.util.find_spec("ggml")
    if spec is None or not spec.submodule_search_locations:
        raise PeerUnavailable("ggml-python is not installed (pip install ggml-python==0.0.45)")
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def declare(handles, signatures: dict) -> dict:
    """name -> the function from the first handle that exports it, with restype and argtypes set."""
    funcs = {}
    for name, (restype, argtypes) in signatures.items():
        fn = next(getattr(h, name) for h in handles if hasattr(h, name))
        fn.restype, fn.argtypes = restype, argtypes
        funcs[name] = fn
    return funcs


def library():
    """The ggml functions this module uses, with correct ctypes signatures (loaded once per process)."""
    global _LIB
    if _LIB is None:
        d = lib_dir()
        handles = [C.CDLL(str(d / name), mode=C.RTLD_GLOBAL) for name in ("libggml-base.so", "libggml-cpu.so")]
        _LIB = SimpleNamespace(handles=handles, **declare(handles, _SIGNATURES))
    return _LIB


def ggml_version() -> str:
    return library().ggml_version().decode()


def _tensors_of(graph: Graph) -> list[Tensor]:
    """Leafs, nodes, and everything they reach through src or view_src, each once."""
    return reachable_tensors(list(graph.leafs) + list(graph.nodes))


class PreparedGraph:
    """One pyggml graph mirrored into ggml and allocated there: set inputs, run, read outputs, free.

    Created by `GGMLPeer.prepare`. Owns two ggml contexts (preallocated tensors; everything
    else plus the graph), the weights buffer and the gallocr.
    """

    def __init__(self, peer: GGMLPeer, graph: Graph, preallocated=()):
        self._lib = library()
        self._backend = peer._backend
        self._peer = peer
        self._ctx_pre = self._ctx = self._weights = self._galloc = None
        self._ptr: dict[int, int] = {}
        try:
            self._build(graph, [t for t in preallocated if t.view_src is None])
        except BaseException:
            self.close()
            raise

    def _build(self, graph: Graph, preallocated: list[Tensor]) -> None:
        lib = self._lib
        tensors = _tensors_of(graph)
        in_graph = {id(t) for t in tensors}
        pre = [t for t in preallocated if id(t) in in_graph]  # caller's order: alloc_ctx_tensors packs in it
        pre_ids = {id(t) for t in pre}
        rest = [t for t in tensors if id(t) not in pre_ids]
        size = max(len(graph.nodes) + len(graph.leafs), 1)
        overhead = lib.ggml_tensor_overhead()
        self._ctx_pre = lib.ggml_init(InitParams(overhead * (len(pre) + 1), None, True))
        self._ctx = lib.ggml_init(
            InitParams(overhead * (len(rest) + 1) + lib.ggml_graph_overhead_custom(size, False), None, True))
        if not self._ctx_pre or not self._ctx:
            raise AllocationError(f"ggml_init failed for a graph of {len(tensors)} tensors")
        for t in pre:
            self._ptr[id(t)] = self._new_twin(self._ctx_pre, t)
        for t in rest:
            self._ptr[id(t)] = self._new_twin(self._ctx, t)
        for t in tensors:
            self._copy_fields(t)
        self._graph = self._mirror_graph(graph, size)
        self._check_supported(graph)
        if pre:
            self._weights = lib.ggml_backend_alloc_ctx_tensors(self._ctx_pre, self._backend)
        self._galloc = lib.ggml_gallocr_new(lib.ggml_backend_get_default_buffer_type(self._backend))
        if not lib.ggml_gallocr_alloc_graph(self._galloc, self._graph):
            raise AllocationError(f"ggml_gallocr_alloc_graph failed for a graph of {len(graph.nodes)} nodes")
        self.tensors = tensors

    def _new_twin(self, ctx: int, t: Tensor) -> int:
        lib = self._lib
        sizes = (lib.ggml_type_size(int(t.type)), lib.ggml_blck_size(int(t.type)))
        if sizes != (T.type_size(t.type), T.blck_size(t.type)):
            raise UnsupportedTypeError(
                f"tensor {t.name!r}: {t.type.name} has (type size, block size) {sizes} in ggml {ggml_version()}, "
                f"pyggml expects {(T.type_size(t.type), T.blck_size(t.type))}")
        ptr = lib.ggml_new_tensor(ctx, int(t.type), MAX_DIMS, (C.c_int64 * MAX_DIMS)(*t.ne))
        if not ptr:
            raise AllocationError(f"ggml_new_tensor failed for {t!r}")
        return ptr

    def _struct(self, t: Tensor) -> GGMLTensorStruct:
        return GGMLTensorStruct.from_address(self._ptr[id(t)])

    def _copy_fields(self, t: Tensor) -> None:
        s = self._struct(t)
        s.type, s.op, s.flags = int(t.type), int(t.op), int(t.flags)
        s.ne[:] = t.ne
        s.nb[:] = t.nb
        s.op_params[:] = t.op_params
        s.src[:] = [None if x is None else self._ptr[id(x)] for x in t.src]
        s.view_src = None if t.view_src is None else self._ptr[id(t.view_src)]
        s.view_offs = t.view_offs
        s.name = t.name.encode("utf-8")[: MAX_NAME - 1]

    def _mirror_graph(self, graph: Graph, size: int) -> int:
        """A ggml graph with pyggml's exact node and leaf order.

        ggml's own DFS fills the hash set and use counts; the arrays are then rewritten in
        pyggml's order (same tensors, so the hash set stays valid). Leaf order matters: gallocr
        allocates leafs first, in that order.
        """
        lib = self._lib
        g = lib.ggml_new_graph_custom(self._ctx, size, False)
        for t in graph.nodes + graph.leafs:
            lib.ggml_build_forward_expand(g, self._ptr[id(t)])
        head = GGMLGraphHead.from_address(g)
        want_nodes = [self._ptr[id(t)] for t in graph.nodes]
        want_leafs = [self._ptr[id(t)] for t in graph.leafs]
        got_nodes = set(head.nodes[: head.n_nodes])
        got_leafs = set(head.leafs[: head.n_leafs])
        if got_nodes != set(want_nodes) or got_leafs != set(want_leafs):
            raise GraphError(
                f"ggml's DFS finds {head.n_nodes} nodes and {head.n_leafs} leafs, pyggml's graph has "
                f"{len(want_nodes)} and {len(want_leafs)} (or other tensors): the graph is not closed under src")
        for i, p in enumerate(want_nodes):
            head.nodes[i] = p
        for i, p in enumerate(want_leafs):
            head.leafs[i] = p
        return g

    def _check_supported(self, graph: Graph) -> None:
        """Refuse what ggml's CPU backend does not support, instead of letting ggml abort the process."""
        for t in graph.nodes:
            if not self._lib.ggml_backend_supports_op(self._backend, self._ptr[id(t)]):
                types = ", ".join(s.type.name for s in t.srcs)
                raise UnsupportedOpError(
                    f"ggml CPU does not support {t.op.name} for {t.name!r} ({t.type.name} from {types})")

    # ----- data in and out --------------------------------------------------------------------
    def _host_twin(self, t: Tensor) -> Tensor:
        """A host tensor with t's type, ne and nb: its arena holds exactly the bytes ggml copies."""
        return Context().add(Tensor(t.type, t.ne, t.nb, name=t.name))

    def _check_open(self) -> None:
        if self._galloc is None:
            raise NotAllocatedError("the prepared ggml graph is closed; its tensors have no memory any more")

    def _address(self, t: Tensor) -> tuple[int, int]:
        self._check_open()
        if id(t) not in self._ptr:
            raise GraphError(f"tensor {t.name!r} is not part of the mirrored graph")
        ptr = self._ptr[id(t)]
        if not GGMLTensorStruct.from_address(ptr).data:
            raise NotAllocatedError(f"tensor {t.name!r} has no memory in ggml (not reached by the graph?)")
        return ptr, self._lib.ggml_nbytes(ptr)

    def set_inputs(self, inputs: dict) -> None:
        """Write values into ggml tensors. Values already in stored form (the dtype and shape of
        `host_ndarray`: raw uint8 rows for block types, uint16 bits for BF16) are copied as they are;
        others are encoded (cast, or quantized from floats). All are checked before any is written."""
        staged = []
        for t, values in inputs.items():
            if not t.is_contiguous:
                raise LayoutError(f"input {t.name!r} is not contiguous (nb={t.nb}); set its root instead")
            ptr, nbytes = self._address(t)
            host = self._host_twin(t)
            dst = host_ndarray(host)
            values = np.asarray(values)
            raw = values.dtype == dst.dtype and values.size == dst.size
            if not raw and values.size != t.nelements:
                raise LayoutError(f"input {t.name!r}: {values.size} values for {t.nelements} elements (ne={t.ne})")
            dst[...] = (values if raw else T.encode(t.type, values)).reshape(dst.shape)
            staged.append((ptr, host, nbytes))  # the host twin owns the bytes: keep it alive until written
        for ptr, host, nbytes in staged:
            self._lib.ggml_backend_tensor_set(ptr, host.data, 0, nbytes)

    def run(self) -> None:
        """ggml_backend_graph_compute once (the inputs stay as they are; in-place ops may have changed them)."""
        self._check_open()
        status = self._lib.ggml_backend_graph_compute(self._backend, self._graph)
        if status != 0:
            raise BackendError(f"ggml_backend_graph_compute returned status {status}")

    def get(self, t: Tensor) -> np.ndarray:
        """A copy of t's values as ggml holds them, shaped like `host_ndarray(t)` (block types: uint8 rows)."""
        ptr, nbytes = self._address(t)
        host = self._host_twin(t)
        self._lib.ggml_backend_tensor_get(ptr, host.data, 0, nbytes)
        return np.array(host_ndarray(host))

    # ----- ggml's plan ------------------------------------------------------------------------
    def offsets(self) -> dict[Tensor, int]:
        """Where gallocr put every tensor it placed: byte offset from its compute buffer's base."""
        out = {}
        for t in self.tensors:
            s = self._struct(t)
            if t.view_src is None and s.data and s.buffer and s.buffer != self._weights:
                out[t] = s.data - self._lib.ggml_backend_buffer_get_base(s.buffer)
        return out

    @property
    def compute_buffer_size(self) -> int:
        return self._lib.ggml_gallocr_get_buffer_size(self._galloc, 0)

    # ----- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Free the gallocr, the weights buffer and both contexts (idempotent)."""
        lib = self._lib
        if self._galloc:
            lib.ggml_gallocr_free(self._galloc)
        if self._weights:
            lib.ggml_backend_buffer_free(self._weights)
        for ctx in (self._ctx, self._ctx_pre):
            if ctx:
                lib.ggml_free(ctx)
        self._galloc = self._weights = self._ctx = self._ctx_pre = None
        self._ptr.clear()
        self._peer._forget(self)

    def __enter__(self) -> PreparedGraph:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class GGMLPeer:
    """A ggml CPU backend with n_threads, and the graphs mirrored onto it.

    Use as a context manager; closing frees every prepared graph and then the backend.
    """

    def __init__(self, n_threads: int = 2):
        self._lib = library()
        self._backend = self._lib.ggml_backend_cpu_init()
        if not self._backend:
            raise BackendError("ggml_backend_cpu_init failed")
        self._lib.ggml_backend_cpu_set_n_threads(self._backend, n_threads)
        self.n_threads = n_threads
        self._prepared: list[PreparedGraph] = []

    def prepare(self, graph: Graph, inputs: dict | None = None, preallocated=()) -> PreparedGraph:
        """Mirror and allocate graph (tensors in `preallocated` get a weights buffer, the rest gallocr),
        then set inputs. Keep it to run the same allocated graph many times."""
        if self._backend is None:
            raise BackendError("the ggml peer is closed")
        p = PreparedGraph(self, graph, preallocated)
        self._prepared.append(p)
        try:
            p.set_inputs(inputs or {})
        except BaseException:
            p.close()
            raise
        return p

    def compute(self, graph: Graph, inputs: dict, outputs: list[Tensor], preallocated=()) -> list[np.ndarray]:
        """Compute graph once in ggml and return copies of the outputs (shaped like `host_ndarray`)."""
        with self.prepare(graph, inputs, preallocated) as p:
            p.run()
            return [p.get(t) for t in outputs]

    def plan(self, graph: Graph, preallocated=()) -> tuple[dict[Tensor, int], int]:
        """ggml's gallocr plan for graph on a fresh CPU gallocr: (offset per placed tensor, buffer size)."""
        with self.prepare(graph, preallocated=preallocated) as p:
            return p.offsets(), p.compute_buffer_size

    def _forget(self, p: PreparedGraph) -> None:
        if p in self._prepared:
            self._prepared.remove(p)

    def close(self) -> None:
        for p in list(self._prepared):
            p.close()
        if self._backend:
            self._lib.ggml_backend_free(self._backend)
        self._backend = None

    def __enter__(self) -> GGMLPeer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _serve(conn, n_threads: int, stderr_path: str) -> None:
    """The isolated peer's child: compute graphs sent as graph-json files until told to stop."""
    os.environ["GGML_NO_BACKTRACE"] = "1"  # ggml would fork gdb on abort
    os.dup2(os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    with GGMLPeer(n_threads) as peer:
        while (request := conn.recv()) is not None:
            path, inputs, outputs, preallocated = request
            lg = load_graph_json(path)
            try:
                result = peer.compute(lg.graph, {lg.tensors[k]: v for k, v in inputs.items()},
                                      [lg.tensors[k] for k in outputs], [lg.tensors[k] for k in preallocated])
                conn.send(("ok", result))
            except GGMLError as e:
                conn.send(("error", e))


class IsolatedPeer:
    """`GGMLPeer.compute` in a child process, so that a ggml abort fails one call (PeerCrashed, with ggml's
    message) instead of killing the caller, e.g. a whole pytest run. The child restarts on the next call.

    The graph travels as a ggml-graph-json file, so it must be closed under src and view_src.
    """

    def __init__(self, n_threads: int = 2):
        self.n_threads = n_threads
        self._dir = tempfile.TemporaryDirectory(prefix="ggml-peer-")
        self._stderr = os.path.join(self._dir.name, "stderr.txt")
        self._proc = self._conn = None

    def _start(self) -> None:
        mp = multiprocessing.get_context("spawn")  # fork would inherit OpenMP state and hang
        self._conn, child_end = mp.Pipe()
        self._proc = mp.Process(target=_serve, args=(child_end, self.n_threads, self._stderr), daemon=True)
        self._proc.start()
        child_end.close()

    def compute(self, graph: Graph, inputs: dict, outputs: list[Tensor], preallocated=()) -> list[np.ndarray]:
        if self._proc is None:
            self._start()
        ids = {id(t): f"L{i}" for i, t in enumerate(graph.leafs)}
        ids.update({id(t): f"N{i}" for i, t in enumerate(graph.nodes)})
        path = os.path.join(self._dir.name, "graph.json")
        Path(path).write_text(json.dumps(graph_to_json(graph)))
        try:
            self._conn.send((path, {ids[id(t)]: np.asarray(v) for t, v in inputs.items()},
                             [ids[id(t)] for t in outputs], [ids[id(t)] for t in preallocated]))
            status, payload = self._conn.recv()
        except KeyError as e:
            raise GraphError("inputs, outputs and preallocated tensors must be leafs or nodes of the graph") from e
        except (EOFError, BrokenPipeError):
            self._proc.join()
            code, self._proc = self._proc.exitcode, None
            tail = Path(self._stderr).read_text(errors="replace")[-2000:].strip()
            raise PeerCrashed(f"ggml exited with code {code} on a graph of {graph.n_nodes} nodes "
                              f"(last: {graph.nodes[-1]!r}): {tail}") from None
        if status == "error":
            raise payload
        return payload

    def close(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(BrokenPipeError):  # the child is already gone
                self._conn.send(None)
            self._proc.join(timeout=10)
            self._proc = None
        self._dir.cleanup()

    def __enter__(self) -> IsolatedPeer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
