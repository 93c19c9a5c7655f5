"""Graph-building functions, one per ggml op, context first (ggml_add(ctx, a, b) is ops.add(ctx, a, b)).

Each computes the result's shape with ggml's rules and raises ShapeError / TypeError
naming the op and the tensors when the inputs do not fit. Nothing is computed here.
"""

from pyggml.core.ops.elementwise import *  # noqa: F401,F403
from pyggml.core.ops.unary import *  # noqa: F401,F403
from pyggml.core.ops.reduce import *  # noqa: F401,F403
from pyggml.core.ops.norm import *  # noqa: F401,F403
from pyggml.core.ops.layout import *  # noqa: F401,F403
from pyggml.core.ops.matmul import *  # noqa: F401,F403
from pyggml.core.ops.attention import *  # noqa: F401,F403
from pyggml.core.ops.conv import *  # noqa: F401,F403
from pyggml.core.ops.recurrent import *  # noqa: F401,F403
