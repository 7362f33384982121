"""The CUDA backend: generated kernels through CuPy, or the same host code emulated on the CPU."""
