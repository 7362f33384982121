"""The CUDA backend: generated kernels through CuPy, or the same host code emulated on the CPU."""


def backend_class() -> type:
    """The backend's class (the registry's loader, :data:`rnnc.backends.REGISTRY`);
    BackendUnavailable where its modules cannot be imported (CuPy itself loads later)."""
    from rnnc.errors import BackendUnavailable

    try:
        from rnnc.backends.cuda.runtime import CudaBackend
    except ImportError as err:
        raise BackendUnavailable(f"backend 'cuda' cannot be loaded: {err}") from None
    return CudaBackend
