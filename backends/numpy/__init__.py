"""The NumPy reference interpreter: the oracle for every pass and every other backend."""


def backend_class() -> type:
    """The backend's class (the registry's loader, :data:`rnnc.backends.REGISTRY`)."""
    from rnnc.backends.numpy.runtime import NumpyBackend

    return NumpyBackend
