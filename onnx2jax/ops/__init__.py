"""One module per op family. Importing this package fills the registry."""

from onnx2jax.ops import elementwise as elementwise
from onnx2jax.ops import activations as activations
from onnx2jax.ops import cast as cast
from onnx2jax.ops import reductions as reductions
from onnx2jax.ops import softmax as softmax
from onnx2jax.ops import shapes as shapes
from onnx2jax.ops import indexing as indexing
from onnx2jax.ops import generators as generators
from onnx2jax.ops import linalg as linalg
from onnx2jax.ops import conv as conv
from onnx2jax.ops import pooling as pooling
from onnx2jax.ops import normalization as normalization
from onnx2jax.ops import resize as resize
from onnx2jax.ops import attention as attention
from onnx2jax.ops import control_flow as control_flow
from onnx2jax.ops import sequences as sequences
from onnx2jax.ops import quantization as quantization
from onnx2jax.ops import rnn as rnn
from onnx2jax.ops import signal as signal
from onnx2jax.ops import dropout as dropout
from onnx2jax.ops import losses as losses
from onnx2jax.ops import strings as strings
from onnx2jax.ops import training as training
from onnx2jax.ops import detection as detection
