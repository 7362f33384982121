"""The LLVM backend: one native function per program, JIT-compiled through llvmlite.

``codegen`` lowers a program's schedule to LLVM IR in a ``context``, with the per-op ``rules``,
the per-element evaluation of ``region``, the loop nests of ``kernels``, the GEMMs of ``gemm``
and the vectorizable transcendental functions of ``mathlib``; ``cache`` compiles it for the
host CPU and keeps the object code in memory and on disk; ``runtime`` is the backend object and
the runner that calls the native code. ``blas`` finds and loads the BLAS libraries, and
``autotune`` picks one per GEMM shape.
"""


def backend_class() -> type:
    """The backend's class (the registry's loader, :data:`rnnc.backends.REGISTRY`);
    BackendUnavailable without llvmlite."""
    from rnnc.errors import BackendUnavailable

    try:
        from rnnc.backends.llvm.runtime import LlvmBackend
    except ImportError as err:
        raise BackendUnavailable(f"backend 'llvm' needs llvmlite: {err}") from None
    return LlvmBackend
