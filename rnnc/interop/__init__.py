"""rnnc with other libraries: PyTorch modules and autograd, and the weight layouts of PyTorch,
cuDNN and Keras.

Nothing here is imported by ``import rnnc``: ``rnnc.torch`` (the public face of
``rnnc.interop.torch``) loads torch, and ``rnnc.RNN``'s weight methods import
``rnnc.interop.layer_weights`` when they are called.
"""
