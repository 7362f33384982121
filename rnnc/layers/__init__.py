"""Multi-layer, bidirectional recurrent layers over compiled cells, with PyTorch's shapes.

``rnnc.RNN`` stacks ``num_layers`` layers of one cell, each run forward and (when
``bidirectional``) reversed, with dropout between layers. Shapes follow ``torch.nn.LSTM``:
``x`` is ``(T, B, input_size)`` (``(B, T, input_size)`` with ``batch_first``), ``y`` is
``(T, B, D*H)`` with the forward direction in ``y[..., :H]`` and the reverse one in
``y[..., H:]``, and every state is ``(L*D, B, H)`` indexed ``layer*D + direction``
(``(L*D, B, *shape)`` for a cell state of feature shape ``shape``, such as sLSTM's
``(heads, d)``).

A cell factory's cell may be more general: its first input is the layer input and its
further inputs are extra inputs the caller passes by name (``extra={"u": u}``), read by every
layer or by layer 0 alone (``extra_inputs="first"``); its output may have any width ``K``
(then ``y`` is ``(T, B, D*K)``, as with an LSTM's ``proj_size``) and its states any sizes and
feature shapes, the same in every layer.

One compiled ``Function`` per direction serves every layer with the same input width: layer 0
reads ``input_size`` features, layers above read ``D*H`` (``D*K``). The reverse direction is
the same cell compiled with ``reverse=True``, a scan from the last step to the first on the
input as it is; each sequence starts at its own last step (as cuDNN and PyTorch do with
packed sequences), because the masked steps past its length come first and hold the initial
state. Outputs are zero past each sequence's length.

The parts: ``rnn`` (the ``RNN`` object), ``checks`` (the caller's arguments), ``run`` (the
forward run), ``backward`` (gradients and their derivative) and ``arrays`` (the glue's array
operations: NumPy for host arrays, the device's array module for a device call, in which
everything stays on the device; ``docs/device-calls.md``).
"""

from rnnc.layers.backward import LayerGrads
from rnnc.layers.checks import MODES, CellFactory, Grid, check_dropout, check_picklable
from rnnc.layers.rnn import RNN, fastest_backend
from rnnc.layers.run import LayerTape

__all__ = ["MODES", "RNN", "CellFactory", "Grid", "LayerGrads", "LayerTape", "check_dropout",
           "check_picklable", "fastest_backend"]
