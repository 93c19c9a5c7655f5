"""One exception hierarchy for everything pyggml refuses to do.

Where ggml aborts the process, pyggml raises one of these, with a message
that names the tensor, buffer, sizes and what was expected.
"""


class GGMLError(Exception):
    """Base of every pyggml error."""


class ParameterError(GGMLError, ValueError):
    """A parameter of a public call (a count, a threshold, a choice) is out of range or of the wrong kind; the
    message names the parameter, what it accepts and what it got."""


class ShapeError(GGMLError, ValueError):
    """An op got tensors whose shapes do not fit together."""


class GGMLTypeError(GGMLError, TypeError):
    """An op or a conversion got a tensor type it does not accept (a TypeError too)."""


class UnsupportedTypeError(GGMLTypeError):
    """A ggml type is unknown, or this operation has no implementation for it."""


class GraphError(GGMLError):
    """A graph is malformed or used in a way its contract forbids."""


class GraphSizeError(GraphError):
    """A graph grew beyond the size it was created with."""


class AllocationError(GGMLError):
    """Memory could not be planned, allocated or bound."""


class OutOfBufferSpace(AllocationError):
    """A tensor does not fit in the space left in a buffer."""


class BufferIdError(AllocationError, ValueError):
    """A graph allocator got a buffer id outside its buffers, or a list of ids that does not match the graph."""


class BufferUseError(GGMLError):
    """A buffer was used wrongly: freed, out of bounds, read-only, or the wrong kind."""


class BufferFreedError(BufferUseError):
    """A buffer was used after free() (or freed twice)."""


class OutOfBoundsError(BufferUseError, IndexError):
    """A read, write or placement falls outside a tensor or a buffer."""


class NotAllocatedError(BufferUseError):
    """A tensor has no buffer or no data yet."""


class LayoutError(BufferUseError):
    """Two tensors that must share a layout (type, ne, nb) do not."""


class BackendError(GGMLError):
    """A backend, device or registry call failed."""


class UnsupportedOpError(BackendError):
    """A backend was asked to compute an op (or op/type combination) it has no kernel for."""


class ComputeAborted(BackendError):
    """A model's graph compute was stopped by the backend's abort callback (Status.ABORTED from graph_compute)."""


class SchedulerError(GGMLError):
    """The scheduler cannot place or split a graph."""


class GGUFError(GGMLError, ValueError):
    """A GGUF file is truncated, corrupt, or uses something pyggml does not support."""


class TokenizerError(GGMLError, ValueError):
    """A token id or vocabulary entry is out of range or malformed."""


class WhisperError(GGMLError, ValueError):
    """A Whisper model, its tokens or a transcription request is wrong (unknown language, bad option)."""


class WhisperFileError(WhisperError):
    """A Whisper model file or directory is missing, truncated, corrupt or in an unknown format."""


class AudioError(WhisperError):
    """Audio is empty, corrupt, in a format no installed decoder reads, or cannot be resampled."""


class RPCError(BackendError):
    """A remote backend answered wrongly, too late, or not at all."""


class ImageError(GGMLError, ValueError):
    """An image could not be used: not a decodable image, larger than the limit, sent to a model without a vision
    projector, or a projector that does not fit the language model."""
