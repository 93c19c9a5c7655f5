"""Silero VAD v6 weights (MIT): shipped with pyggml as `silero_vad_v6.npz` (converted once from faster-whisper's
bundled ONNX by tests/models/vad/make_silero_weights.py, so `--vad` needs neither faster-whisper nor onnx), or read
from an ONNX file (with `onnx`, no onnxruntime) or whisper.cpp's ggml VAD file, and written as that ggml file so
whisper.cpp runs pyggml's conversion.

In memory the weights are NumPy float32 arrays in PyTorch's layout and gate order (what whisper.cpp's
converter writes from silero-vad's state dict):

| field | shape | what |
| --- | --- | --- |
| `stft_basis` | (258, 256) | STFT as a convolution: 129 real rows then 129 imaginary, window 256, hop 128 |
| `conv_w[i]`, `conv_b[i]` | (out, in, 3), (out,) | the four encoder convolutions, 129->128->64->64->128 |
| `w_ih`, `w_hh`, `b_ih`, `b_hh` | (512, 128), (512,) | LSTM cell, gates in the order i, f, g, o |
| `dec_w`, `dec_b` | (128,), () | the 1x1 output convolution (after ReLU, before the sigmoid) |

ONNX's LSTM orders its gates i, o, f, c; they are reordered on reading.
"""

from __future__ import annotations

import importlib.util
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pyggml.errors import WhisperFileError

GGML_MAGIC = 0x67676D6C
MODEL_TYPE = b"silero-16k"
WINDOW, CONTEXT, HIDDEN = 512, 64, 128
CONV_CHANNELS = ((129, 128), (128, 64), (64, 64), (64, 128))
CONV_STRIDES = (1, 2, 2, 1)
_PREFIX = "_model."
SHIPPED = Path(__file__).with_name("silero_vad_v6.npz")


@dataclass
class SileroWeights:
    stft_basis: np.ndarray
    conv_w: list[np.ndarray]
    conv_b: list[np.ndarray]
    w_ih: np.ndarray
    w_hh: np.ndarray
    b_ih: np.ndarray
    b_hh: np.ndarray
    dec_w: np.ndarray
    dec_b: np.ndarray
    version: tuple[int, int, int] = (6, 0, 0)
    source: str = field(default="", compare=False)

    def check(self) -> SileroWeights:
        """The shapes above, or WhisperFileError naming the first tensor that does not fit."""
        expected = [("stft_basis", self.stft_basis, (258, 256)), ("w_ih", self.w_ih, (4 * HIDDEN, HIDDEN)),
                    ("w_hh", self.w_hh, (4 * HIDDEN, HIDDEN)), ("b_ih", self.b_ih, (4 * HIDDEN,)),
                    ("b_hh", self.b_hh, (4 * HIDDEN,)), ("dec_w", self.dec_w, (HIDDEN,)), ("dec_b", self.dec_b, ())]
        for i, (cin, cout) in enumerate(CONV_CHANNELS):
            expected += [(f"conv_w[{i}]", self.conv_w[i], (cout, cin, 3)), (f"conv_b[{i}]", self.conv_b[i], (cout,))]
        for name, value, shape in expected:
            if tuple(np.shape(value)) != shape:
                raise WhisperFileError(f"Silero VAD weights {self.source}: {name} has shape "
                                       f"{tuple(np.shape(value))}, expected {shape}")
        return self


def faster_whisper_onnx() -> Path | None:
    """faster-whisper's bundled silero_vad_v6.onnx, found without importing faster-whisper (or None)."""
    spec = importlib.util.find_spec("faster_whisper")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "assets" / "silero_vad_v6.onnx"
    return path if path.is_file() else None


def load_silero(source=None) -> SileroWeights:
    """Silero VAD weights from `source`: a SileroWeights, a .npz as shipped, a .onnx file, a whisper.cpp ggml VAD
    .bin, or None for the weights shipped with pyggml."""
    if isinstance(source, SileroWeights):
        return source
    path = Path(SHIPPED if source is None else source)
    if not path.is_file():
        raise WhisperFileError(f"Silero VAD weights {path}: no such file")
    head = path.read_bytes()[:4]
    if len(head) == 4 and struct.unpack("<I", head)[0] == GGML_MAGIC:
        return read_ggml_vad(path)
    if head == b"PK\x03\x04":  # a zip: NumPy's .npz
        return read_npz(path)
    return read_silero_onnx(path)


# ----- the shipped .npz ----------------------------------------------------------------------------------

def _arrays(w: SileroWeights) -> dict[str, np.ndarray]:
    arrays = {name: getattr(w, name) for name in ("stft_basis", "w_ih", "w_hh", "b_ih", "b_hh", "dec_w", "dec_b")}
    for i in range(len(CONV_CHANNELS)):
        arrays[f"conv_w{i}"], arrays[f"conv_b{i}"] = w.conv_w[i], w.conv_b[i]
    return {**arrays, "version": np.array(w.version, np.int32)}


def write_npz(w: SileroWeights, path) -> None:
    """The weights as float32 arrays in one compressed .npz (what pyggml ships)."""
    np.savez_compressed(path, **_arrays(w))


def read_npz(path) -> SileroWeights:
    try:
        with np.load(path, allow_pickle=False) as z:
            a = {name: z[name].astype(np.float32) for name in z.files if name != "version"}
            version = tuple(int(v) for v in z["version"])
        n = len(CONV_CHANNELS)
        return SileroWeights(stft_basis=a["stft_basis"], conv_w=[a[f"conv_w{i}"] for i in range(n)],
                             conv_b=[a[f"conv_b{i}"] for i in range(n)], w_ih=a["w_ih"], w_hh=a["w_hh"],
                             b_ih=a["b_ih"], b_hh=a["b_hh"], dec_w=a["dec_w"], dec_b=a["dec_b"], version=version,
                             source=str(path)).check()
    except (KeyError, ValueError, OSError) as e:
        raise WhisperFileError(f"Silero VAD weights {path}: not a Silero VAD .npz ({e})") from None


# ----- ONNX ----------------------------------------------------------------------------------------------

def _onnx_to_torch_gates(a: np.ndarray) -> np.ndarray:
    """Rows in ONNX's gate order i, o, f, c -> PyTorch's i, f, g, o."""
    i, o, f, c = np.split(a, 4, axis=0)
    return np.concatenate([i, f, c, o], axis=0)


def read_silero_onnx(path) -> SileroWeights:
    """faster-whisper's silero_vad_v6.onnx: the initializers by the names its export gives them; the LSTM's
    three inputs found on the LSTM node."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as e:
        raise WhisperFileError("reading Silero VAD's ONNX file needs the onnx package (pip install onnx)") from e
    try:
        graph = onnx.load(str(path)).graph
    except Exception as e:  # noqa: BLE001 - onnx raises DecodeError and others for a bad file
        raise WhisperFileError(f"Silero VAD weights {path}: not an ONNX model ({e})") from e
    init = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in graph.initializer
            if t.data_type == onnx.TensorProto.FLOAT}
    lstm = [n for n in graph.node if n.op_type == "LSTM"]
    names = ["encoder.feature_extractor.forward_basis_buffer", "decoder.conv1d.weight", "decoder.conv1d.bias"]
    names += [f"encoder.conv_layers.{i}.{p}" for i in range(4) for p in ("weight", "bias")]
    missing = [n for n in names if n not in init] + ([] if len(lstm) == 1 else ["one LSTM node"])
    if missing:
        raise WhisperFileError(f"Silero VAD weights {path}: not Silero VAD v6 (missing {', '.join(missing)})")
    w_name, r_name, b_name = lstm[0].input[1:4]
    bias = init[b_name].reshape(2, 4 * HIDDEN)
    return SileroWeights(
        stft_basis=init[names[0]].reshape(258, 256),
        conv_w=[init[f"encoder.conv_layers.{i}.weight"] for i in range(4)],
        conv_b=[init[f"encoder.conv_layers.{i}.bias"] for i in range(4)],
        w_ih=_onnx_to_torch_gates(init[w_name].reshape(4 * HIDDEN, HIDDEN)),
        w_hh=_onnx_to_torch_gates(init[r_name].reshape(4 * HIDDEN, HIDDEN)),
        b_ih=_onnx_to_torch_gates(bias[0]), b_hh=_onnx_to_torch_gates(bias[1]),
        dec_w=init[names[1]].reshape(HIDDEN), dec_b=init[names[2]].reshape(()),
        source=str(path)).check()


# ----- whisper.cpp's ggml VAD file -----------------------------------------------------------------------
# i32 magic, i32 len + "silero-16k", i32 major/minor/patch, i32 window 512, i32 context 64, i32 n_layers 4,
# 4 x (in, out, kernel), i32 lstm in/hidden, i32 final conv in/out; then until EOF per tensor
# {i32 n_dims, i32 name_len, i32 ftype (0 F32, 1 F16), i32 ne[n_dims] (ggml order), name, data}.
# Conv kernels (and the STFT basis) are F16, the rest F32, as whisper.cpp's converter writes them.

TENSOR_NAMES = ([f"encoder.{i}.reparam_conv.{p}" for i in range(4) for p in ("weight", "bias")]
                + [f"decoder.rnn.{p}" for p in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
                + ["decoder.decoder.2.weight", "decoder.decoder.2.bias", "stft.forward_basis_buffer"])


def _ggml_tensors(w: SileroWeights) -> list[tuple[str, np.ndarray, bool]]:
    """(name, array in PyTorch's squeezed shape, stored as F16) in the converter's order (TENSOR_NAMES)."""
    arrays = [a for i in range(4) for a in (w.conv_w[i], w.conv_b[i])]
    arrays += [w.w_ih, w.w_hh, w.b_ih, w.b_hh, w.dec_w, w.dec_b, w.stft_basis.reshape(258, 1, 256)]
    return [(name, a, name.endswith("weight") and "rnn" not in name or name.startswith("stft"))
            for name, a in zip(TENSOR_NAMES, arrays, strict=True)]


def write_ggml_vad(w: SileroWeights, path) -> int:
    """Write whisper.cpp's ggml VAD file (what models/convert-silero-vad-to-ggml.py writes); returns its size."""
    parts = [struct.pack("<Ii", GGML_MAGIC, len(MODEL_TYPE)), MODEL_TYPE, struct.pack("<3i", *w.version),
             struct.pack("<3i", WINDOW, CONTEXT, len(CONV_CHANNELS))]
    parts += [struct.pack("<3i", cin, cout, 3) for cin, cout in CONV_CHANNELS]
    parts.append(struct.pack("<4i", HIDDEN, HIDDEN, HIDDEN, 1))
    for name, a, f16 in _ggml_tensors(w):
        name_b = (_PREFIX + name).encode()
        parts += [struct.pack("<3i", a.ndim, len(name_b), int(f16)), struct.pack(f"<{a.ndim}i", *a.shape[::-1]),
                  name_b, np.ascontiguousarray(a, np.float16 if f16 else np.float32).tobytes()]
    data = b"".join(parts)
    Path(path).write_bytes(data)
    return len(data)


def read_ggml_vad(path) -> SileroWeights:
    """whisper.cpp's ggml VAD file (F16 kernels widened to float32)."""
    data = Path(path).read_bytes()
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise WhisperFileError(f"Silero VAD file {path}: truncated at byte {pos} (needs {n} more)")
        pos += n
        return data[pos - n:pos]

    def ints(n: int) -> tuple[int, ...]:
        return struct.unpack(f"<{n}i", take(4 * n))

    magic, n = struct.unpack("<Ii", take(8))
    model_type = take(n)
    if magic != GGML_MAGIC or model_type != MODEL_TYPE:
        raise WhisperFileError(f"Silero VAD file {path}: not a whisper.cpp silero-16k VAD model ({model_type!r})")
    version = ints(3)
    window, context, n_layers = ints(3)
    dims = [ints(3) for _ in range(n_layers)]
    lstm_and_final = ints(4)
    if ((window, context) != (WINDOW, CONTEXT) or [d[:2] for d in dims] != list(CONV_CHANNELS)
            or lstm_and_final != (HIDDEN, HIDDEN, HIDDEN, 1)):
        raise WhisperFileError(f"Silero VAD file {path}: unexpected hyperparameters (window {window}, context "
                               f"{context}, layers {dims}, lstm/final {lstm_and_final})")
    tensors = {}
    while pos < len(data):
        n_dims, name_len, ftype = ints(3)
        if ftype not in (0, 1) or not 0 <= n_dims <= 4:
            raise WhisperFileError(f"Silero VAD file {path}: bad tensor header at byte {pos - 12}")
        ne = ints(n_dims)
        name = take(name_len).decode(errors="replace")
        count = int(np.prod(ne)) if ne else 1
        dtype = np.float16 if ftype else np.float32
        raw = np.frombuffer(take(count * np.dtype(dtype).itemsize), dtype)
        tensors[name.removeprefix(_PREFIX)] = raw.astype(np.float32).reshape(ne[::-1])
    missing = [name for name in TENSOR_NAMES if name not in tensors]
    if missing:
        raise WhisperFileError(f"Silero VAD file {path}: missing tensors {', '.join(missing)}")
    t = tensors
    return SileroWeights(stft_basis=t["stft.forward_basis_buffer"].reshape(-1, 256),
                         conv_w=[t[f"encoder.{i}.reparam_conv.weight"] for i in range(4)],
                         conv_b=[t[f"encoder.{i}.reparam_conv.bias"] for i in range(4)],
                         w_ih=t["decoder.rnn.weight_ih"], w_hh=t["decoder.rnn.weight_hh"],
                         b_ih=t["decoder.rnn.bias_ih"], b_hh=t["decoder.rnn.bias_hh"],
                         dec_w=t["decoder.decoder.2.weight"].reshape(-1), dec_b=t["decoder.decoder.2.bias"].reshape(()),
                         version=tuple(version), source=str(path)).check()

