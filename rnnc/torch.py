"""PyTorch interop: ``rnnc.torch.RNN``, an ``nn.Module`` that runs rnnc inside autograd.

A drop-in for ``torch.nn.RNN/LSTM/GRU`` with the same parameter names and shapes, results,
``PackedSequence`` support, pickling, ``torch.compile`` and ``DistributedDataParallel``.
The public face of ``rnnc.interop.torch``, which documents and implements it.
"""

from rnnc.interop.torch import RNN, from_numpy, to_numpy

__all__ = ["RNN", "from_numpy", "to_numpy"]
