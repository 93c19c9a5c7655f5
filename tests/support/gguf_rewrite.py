"""Rewriting a small F32 GGUF file with some tensors changed, added or left out (files no writer makes)."""

import numpy as np


def rewrite(src, dst, change):
    """dst: src's keys, and its F32 tensors passed through change({name: NumPy array}) (llama.cpp's layout)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(str(src))
    w = GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for name, f in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            w.add_key_value(name, f.contents(), f.types[0], f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None)
    for name, values in change({t.name: np.array(t.data) for t in reader.tensors}).items():
        w.add_tensor(name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
