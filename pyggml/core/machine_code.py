"""Numba's code libraries optimized and made into machine code only where that code is asked for.

Numba compiles every function it reaches into a code library of its own (a kernel's callees; for a prange
loop the loop's body and two wrappers around it), optimizes each one (LLVM's O3) and generates its machine code
as soon as it is finalized, and then links it, as IR, into the library that calls it, where it is optimized
and generated again. A prange kernel's body went through O3 four times and through the code generator three
times, though only the kernel's own library runs: 1.2 of mul_mat_float_columns' 2.4 s of compiling.

Here a library is finalized as linkable IR only; it is optimized and made into machine code when its code is
asked for (a function's address, its object code for the disk cache, its assembly). A function compiled by
Numba's dispatcher is asked right away, as before; a prange loop's body and wrappers never are: linked into
their kernel, they are optimized and generated once, with it. The loop body's own compile skips the Python
entry point nothing calls (Numba made one for every loop body, and asked for its address).

Cached kernels load from their object code, as in Numba, but without parsing the IR the cache keeps beside it (for
linking the library into others): the names the library defines, which Numba's engine must know, are read from the
object's ELF symbol table instead (0.05 ms against 1-5 ms of IR parsed per kernel, 27 ms of a small model's 90 ms of
kernel loading), and the IR is parsed if another library links it in.
"""

from __future__ import annotations

import struct

import llvmlite.binding as ll
from numba.core import codegen
from numba.core.compiler_lock import global_compiler_lock, require_global_compiler_lock
from numba.parfors import parfor_lowering

_Library = codegen.JITCodeLibrary
_get_pointer_to_function = _Library.get_pointer_to_function
_get_compiled_object = _Library._get_compiled_object
_get_asm_str = _Library.get_asm_str
_get_llvm_str = _Library.get_llvm_str
_get_module_for_linking = _Library._get_module_for_linking
_unserialize = _Library._unserialize
_create_gufunc_for_parfor_body = parfor_lowering._create_gufunc_for_parfor_body


def finalize_as_ir(self) -> None:
    """CPUCodeLibrary.finalize without its optimization and code generation: the libraries it uses linked in,
    the module checked and closed to additions."""
    require_global_compiler_lock()
    self._codegen._check_llvm_bugs()
    self._raise_if_finalized()
    seen = set()
    for library in self._linking_libraries:
        if library not in seen:
            seen.add(library)
            self._reload_init.update(library._reload_init)
            self._final_module.link_in(library._get_module_for_linking(), preserve=True)
    self._final_module.verify()
    self._finalized = True
    self._awaits_machine_code = True


def make_machine_code(library) -> None:
    """Optimize the library's module and generate its machine code, once, if finalize_as_ir left it as IR (under
    Numba's compiler lock, as every use of LLVM)."""
    with global_compiler_lock:
        if library.__dict__.pop("_awaits_machine_code", False):
            library._optimize_final_module()
            library._final_module.verify()
            library._finalize_final_module()


def _asking_code(method, finalizing: bool = True):
    """method, with the library's machine code made first (finalizing it first where the method would)."""
    def ask(self, *args):
        if finalizing:
            self._ensure_finalized()
        if self._finalized:
            make_machine_code(self)
        return method(self, *args)
    ask.__name__, ask.__doc__ = method.__name__, method.__doc__
    return ask


def _loop_body_without_entry(lowerer, parfor, typemap, typingctx, targetctx, flags, *rest):
    """A prange loop's body compiled without a Python entry point or a C callback, and without asking for its
    address: it is only ever linked into its kernel."""
    flags = flags.copy()
    flags.no_cpython_wrapper = flags.no_cfunc_wrapper = flags.no_compile = True
    return _create_gufunc_for_parfor_body(lowerer, parfor, typemap, typingctx, targetctx, flags, *rest)


def elf_defined_symbols(obj: bytes) -> set[str]:
    """The names an ELF64 little-endian relocatable object defines (its symbol table's functions, data and untyped
    symbols with a section): what Numba's engine collects from the IR of the same library (the functions and
    globals that are not declarations)."""
    (section_headers,) = struct.unpack_from("<Q", obj, 0x28)
    header_size, n_sections = struct.unpack_from("<HH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, section_headers + i * header_size) for i in range(n_sections)]
    names = set()
    for _, kind, _, _, offset, size, link, _, _, entry_size in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, entry_size):
            name, info, _, section = struct.unpack_from("<IBBH", obj, at)
            if name and section and info & 0xF in (0, 1, 2):  # defined NOTYPE, OBJECT, FUNC
                names.add(obj[strings + name: obj.index(b"\0", strings + name)].decode())
    return names


def _unserialize_without_ir(cls, codegen_, state):
    """CPUCodeLibrary._unserialize of a library cached as object code, its IR for linking kept unparsed."""
    name, kind, data = state
    engine = codegen_._engine
    if kind != "object" or not data[0].startswith(b"\x7fELF\x02\x01") or not hasattr(engine, "_defined_symbols"):
        return _unserialize.__func__(cls, codegen_, state)
    object_code, bitcode = data
    library = codegen_.create_library(name)
    library.enable_object_caching()
    library._set_compiled_object(object_code)
    library._bitcode_for_linking = bitcode
    library._finalize_final_module()
    engine._defined_symbols |= elf_defined_symbols(object_code)
    return library


def _module_for_linking(self):
    """CPUCodeLibrary._get_module_for_linking, parsing the IR of a library loaded by _unserialize_without_ir first."""
    bitcode = self.__dict__.pop("_bitcode_for_linking", None)
    if bitcode is not None:
        self._shared_module = ll.parse_bitcode(bitcode)
    return _get_module_for_linking(self)


_METHODS_USED = ("_optimize_final_module", "_finalize_final_module", "_get_module_for_linking", "_raise_if_finalized",
                 "_ensure_finalized", "_get_compiled_object", "_unserialize", "enable_object_caching",
                 "_set_compiled_object")


def install() -> None:
    """Make Numba's CPU code libraries lazy (once per process; compiles after this use it). A Numba whose code
    library lacks what finalize_as_ir uses is left as it is: it compiles the usual way, only slower."""
    if _Library.finalize is finalize_as_ir:
        return
    if not all(hasattr(_Library, name) for name in _METHODS_USED):
        return
    _Library.finalize = finalize_as_ir
    _Library.get_pointer_to_function = _asking_code(_get_pointer_to_function)
    _Library._get_compiled_object = _asking_code(_get_compiled_object)
    _Library.get_asm_str = _asking_code(_get_asm_str, finalizing=False)
    _Library.get_llvm_str = _asking_code(_get_llvm_str, finalizing=False)
    _Library._get_module_for_linking = _module_for_linking
    _Library._unserialize = classmethod(_unserialize_without_ir)
    parfor_lowering._create_gufunc_for_parfor_body = _loop_body_without_entry
