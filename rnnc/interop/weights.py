"""Weight layouts of the standard cells: rnnc names <-> PyTorch, cuDNN flat buffer, Keras.

rnnc's standard cells (``rnn_tanh``, ``rnn_relu``, ``lstm``, ``gru``) keep one array per
gate and store matrices for ``x @ W``: an input matrix has shape ``(in, H)``, a recurrent
matrix ``(H, H)``, a bias ``(H,)``. Names are ``W_i{g}``, ``W_h{g}``, ``b_i{g}``,
``b_h{g}`` for each gate ``g`` of ``GATES[mode]``; the plain RNN has the single "gate"
``h``, which gives PyTorch's ``W_ih, W_hh, b_ih, b_hh``.

This module gathers the conversions, each documented with its layout where it is written:
PyTorch's fused per-pseudo-layer blocks and state dicts in ``rnnc.interop.torch_layout``,
cuDNN's canonical flat buffer in ``rnnc.interop.cudnn``, Keras's arrays in
``rnnc.interop.keras``; the names, shapes and shared checks in ``rnnc.interop.cell_params``.

Every function returns fresh C-contiguous NumPy arrays with the input dtype; none keeps
a reference to its inputs. Torch tensors are accepted wherever arrays are and converted
through ``.detach().cpu().numpy()``, so this module never imports torch.
"""

from rnnc.interop.cell_params import (
    GATES,
    MODES,
    Layers,
    Params,
    WeightError,
    gates,
    hidden_bias_names,
    hidden_weight_names,
    input_bias_names,
    input_weight_names,
    layer_input_size,
    num_gates,
    param_names,
    param_shapes,
)
from rnnc.interop.cudnn import flat_size, from_flat, to_flat
from rnnc.interop.keras import KERAS_GATES, from_keras, to_keras
from rnnc.interop.torch_layout import (
    from_torch_layer,
    layers_to_torch_state_dict,
    to_torch_layer,
    torch_names,
    torch_state_dict_to_layers,
)

__all__ = [
    "GATES",
    "KERAS_GATES",
    "MODES",
    "Layers",
    "Params",
    "WeightError",
    "flat_size",
    "from_flat",
    "from_keras",
    "from_torch_layer",
    "gates",
    "hidden_bias_names",
    "hidden_weight_names",
    "input_bias_names",
    "input_weight_names",
    "layer_input_size",
    "layers_to_torch_state_dict",
    "num_gates",
    "param_names",
    "param_shapes",
    "to_flat",
    "to_keras",
    "to_torch_layer",
    "torch_names",
    "torch_state_dict_to_layers",
]
