"""The LLVM backend: one native function per program, JIT-compiled through llvmlite.

``codegen`` lowers a program to LLVM IR with the per-op ``rules`` and the loop ``kernels``;
``cache`` compiles it for the host CPU and keeps the object code in memory and on disk;
``runtime`` is the backend object and the runner that calls the native code; ``mathlib`` and
``blas`` supply vectorizable transcendental functions and the GEMM.
"""
