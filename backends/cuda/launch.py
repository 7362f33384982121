"""Emulated kernels as the emulator calls them: parameters, launchers and argument checks.

``parse_kernels(source)`` reads every ``extern "C" __global__`` kernel's parameter list from the
source. ``launcher_source`` writes, for one kernel, a C++ function that loops over blocks and
threads and calls the kernel with its arguments unpacked from a ``void**`` array, the way
``cuLaunchKernel`` receives them::

    extern "C" void launch_axpy(unsigned gx, unsigned bx, void** args) {
        gridDim = {gx, 1, 1}; blockDim = {bx, 1, 1};
        for (...) for (...) axpy(*static_cast<int*>(args[0]), ...);
    }

:class:`EmulatedKernel` is called with CuPy's ``RawKernel`` signature, ``kernel(grid, block,
args)``, taking NumPy arrays where CuPy takes device arrays. Arguments are checked against the
parameter list before any native code runs, at least as strictly as CuPy needs to pass a value
intact, so an argument accepted here also reaches a GPU kernel as the kernel expects. Bounds
are not checked: the kernel's own size arguments decide what it touches.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# Base C types a kernel parameter may have, with the NumPy dtype a buffer or a scalar
# argument must carry for that type.
C_TYPES: dict[str, np.dtype] = {
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
    "int": np.dtype(np.int32),
    "int32_t": np.dtype(np.int32),
    "unsigned int": np.dtype(np.uint32),
    "unsigned": np.dtype(np.uint32),
    "long long": np.dtype(np.int64),
    "long long int": np.dtype(np.int64),
    "int64_t": np.dtype(np.int64),
    "unsigned short": np.dtype(np.uint16),  # bfloat16 bits (.bf16), buffers only
}

CTYPES_SCALARS: dict[np.dtype, type] = {
    np.dtype(np.float32): ctypes.c_float,
    np.dtype(np.float64): ctypes.c_double,
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.uint32): ctypes.c_uint32,
    np.dtype(np.int64): ctypes.c_int64,
}

# CUDA's launch limits; a launch beyond them fails on a GPU, so it fails here too.
MAX_BLOCK_THREADS = 1024
MAX_GRID_X = 2**31 - 1

KERNEL_PATTERN = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?'
    r"void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)"
)
COMMENT_PATTERN = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict"}


@dataclass(frozen=True)
class Parameter:
    """One kernel parameter: its name, base C type, and how a pointer is qualified."""

    name: str
    base: str
    pointer: bool
    const: bool = False
    restrict: bool = False

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype an argument for this parameter must have."""
        return C_TYPES[self.base]

    @property
    def spelling(self) -> str:
        """The parameter as C source, for error messages."""
        const = "const " if self.const else ""
        return f"{const}{self.base}{'*' if self.pointer else ''} {self.name}"


def parse_parameter(kernel: str, text: str) -> Parameter:
    """Parse one parameter declaration such as ``const float* __restrict__ x``."""
    pointers = text.count("*")
    if pointers > 1:
        raise ValueError(
            f"kernel {kernel!r}: parameter {text.strip()!r}: "
            "only plain pointers (one '*') are supported"
        )
    words = text.replace("*", " ").split()
    const = "const" in words
    restrict = any(w in ("__restrict__", "__restrict", "restrict") for w in words)
    words = [w for w in words if w not in QUALIFIERS]
    if len(words) < 2 or not IDENTIFIER.fullmatch(words[-1]):
        raise ValueError(
            f"kernel {kernel!r}: cannot parse parameter {text.strip()!r}; "
            "expected a type and a name"
        )
    base = " ".join(words[:-1])
    if base not in C_TYPES:
        raise ValueError(
            f"kernel {kernel!r}: parameter {text.strip()!r} has type {base!r}; "
            f"supported base types: {', '.join(sorted(C_TYPES))}"
        )
    return Parameter(
        name=words[-1], base=base, pointer=pointers == 1, const=const, restrict=restrict
    )


def parse_kernels(source: str) -> dict[str, list[Parameter]]:
    """Find every ``extern "C" __global__ void name(...)`` in source and parse its parameters."""
    # Comments are blanked first so that a commented-out kernel is not picked up.
    code = COMMENT_PATTERN.sub(" ", source)
    kernels: dict[str, list[Parameter]] = {}
    for match in KERNEL_PATTERN.finditer(code):
        name, params = match.group(1), match.group(2).strip()
        if params in ("", "void"):
            kernels[name] = []
        else:
            kernels[name] = [parse_parameter(name, p) for p in params.split(",")]
    return kernels


def launcher_source(name: str, params: list[Parameter]) -> str:
    """C++ for ``launch_<name>``: set the launch shape, then run every thread in turn."""
    # Prefixed locals and ::name keep a kernel called e.g. "b" or "args" from being shadowed.
    unpacked = []
    for i, p in enumerate(params):
        if p.pointer:
            # args[i] points at the device pointer itself, as in cuLaunchKernel.
            unpacked.append(f"static_cast<{p.base}*>(*static_cast<void**>(rnnc_args[{i}]))")
        else:
            unpacked.append(f"*static_cast<{p.base}*>(rnnc_args[{i}])")
    call_args = ", ".join(unpacked)
    return (
        f'extern "C" void launch_{name}(unsigned rnnc_grid_x, unsigned rnnc_block_x, '
        f"void** rnnc_args) {{\n"
        f"    (void)rnnc_args;\n"
        f"    gridDim = {{rnnc_grid_x, 1, 1}};\n"
        f"    blockDim = {{rnnc_block_x, 1, 1}};\n"
        f"    for (unsigned rnnc_b = 0; rnnc_b < rnnc_grid_x; ++rnnc_b) {{\n"
        f"        blockIdx = {{rnnc_b, 0, 0}};\n"
        f"        for (unsigned rnnc_t = 0; rnnc_t < rnnc_block_x; ++rnnc_t) {{\n"
        f"            threadIdx = {{rnnc_t, 0, 0}};\n"
        f"            ::{name}({call_args});\n"
        f"        }}\n"
        f"    }}\n"
        f"}}\n"
    )


class EmulatedKernel:
    """One kernel of an EmulatedModule, called like ``cupy.RawKernel``."""

    def __init__(self, name: str, params: list[Parameter], launch: Callable[..., None]) -> None:
        self.name = name
        self.params = params
        self._launch = launch

    def __call__(
        self,
        grid: tuple[int, ...] | int,
        block: tuple[int, ...] | int,
        args: tuple,
        *,
        shared_mem: int = 0,
    ) -> None:
        """Run the kernel on the CPU over grid x block threads with args (arrays and scalars)."""
        if shared_mem:
            raise ValueError(f"kernel {self.name!r}: emulation does not support shared memory")
        gx = self._extent("grid", grid, MAX_GRID_X)
        bx = self._extent("block", block, MAX_BLOCK_THREADS)
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"kernel {self.name!r}: args must be a tuple, got {type(args)}")
        if len(args) != len(self.params):
            raise TypeError(
                f"kernel {self.name!r} takes {len(self.params)} arguments "
                f"({', '.join(p.spelling for p in self.params)}), got {len(args)}"
            )
        # The ctypes values must outlive the call, so they are collected here.
        values = [self._convert(p, a) for p, a in zip(self.params, args, strict=True)]
        self._check_restrict(args)
        pointers = (ctypes.c_void_p * max(len(values), 1))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values]
        )
        self._launch(gx, bx, pointers)

    def _check_restrict(self, args: tuple | list) -> None:
        """Reject overlapping buffers that break the kernel's __restrict__ promise."""
        # Aliasing restrict pointers is undefined behaviour that g++ -O2 and nvcc both
        # exploit, differently, so emulation could not predict the GPU's result.
        restricted = [
            (p, a)
            for p, a in zip(self.params, args, strict=True)
            if p.pointer and p.restrict and a.size
        ]
        for i, (first, a) in enumerate(restricted):
            for second, b in restricted[i + 1 :]:
                if (not first.const or not second.const) and np.may_share_memory(a, b):
                    raise ValueError(
                        f"kernel {self.name!r}: __restrict__ parameters "
                        f"{first.name!r} and {second.name!r} get overlapping "
                        "arrays while one is written"
                    )

    def _extent(self, what: str, value: tuple[int, ...] | int, limit: int) -> int:
        """The x extent of a 1-D launch shape, rejecting what a GPU or this emulator cannot run."""
        dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
        if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) for d in dims):
            raise TypeError(f"kernel {self.name!r}: {what} must be 1 to 3 ints, got {value!r}")
        if any(int(d) != 1 for d in dims[1:]):
            raise ValueError(
                f"kernel {self.name!r}: emulation runs 1-D launches only; {what} was {value!r}"
            )
        if not 1 <= int(dims[0]) <= limit:
            raise ValueError(f"kernel {self.name!r}: {what} x must be in 1..{limit}, got {dims[0]}")
        return int(dims[0])

    def _convert(self, param: Parameter, arg: object) -> ctypes._SimpleCData:
        """Check one argument against its parameter and box it for the launcher."""
        where = f"kernel {self.name!r}, parameter {param.spelling!r}"
        if param.pointer:
            if not isinstance(arg, np.ndarray):
                raise TypeError(
                    f"{where}: expected a numpy array of {param.dtype}, got {type(arg).__name__}"
                )
            if arg.dtype != param.dtype:
                raise TypeError(f"{where}: expected dtype {param.dtype}, got {arg.dtype}")
            if not arg.flags.c_contiguous:
                raise ValueError(f"{where}: array must be C-contiguous")
            if not arg.flags.aligned:
                raise ValueError(f"{where}: array must be aligned to {param.dtype.itemsize} bytes")
            if not param.const and not arg.flags.writeable:
                raise ValueError(f"{where}: array is read-only but the kernel may write it")
            return ctypes.c_void_p(arg.ctypes.data)
        return CTYPES_SCALARS[param.dtype](self._scalar(where, param, arg))

    @staticmethod
    def _scalar(where: str, param: Parameter, arg: object) -> int | float:
        """The Python value of a scalar argument, accepted only where CuPy would pass it intact."""
        # CuPy passes a NumPy scalar as its own type, a Python int as int64 and a Python
        # float as double, with no conversion to the parameter's type. So a mismatched
        # NumPy scalar or a Python float for a float parameter is garbage on the GPU,
        # while a Python int for an int parameter works (little-endian, value in range).
        if isinstance(arg, np.generic):
            if arg.dtype != param.dtype:
                raise TypeError(f"{where}: expected a {param.dtype} scalar, got {arg.dtype}")
            return arg.item()
        if isinstance(arg, bool):
            raise TypeError(f"{where}: bool is not a valid kernel argument")
        if isinstance(arg, int) and param.dtype.kind in "iu":
            info = np.iinfo(param.dtype)
            if not info.min <= arg <= info.max:
                raise ValueError(f"{where}: {arg} does not fit in {param.dtype}")
            return arg
        if isinstance(arg, float) and param.dtype == np.float64:
            return arg
        if isinstance(arg, (int, float)):
            raise TypeError(
                f"{where}: a Python {type(arg).__name__} reaches the GPU as "
                f"{'int64' if isinstance(arg, int) else 'float64'}; "
                f"pass np.{param.dtype}(...)"
            )
        raise TypeError(f"{where}: expected a scalar of {param.dtype}, got {type(arg).__name__}")
