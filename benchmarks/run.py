"""Time rnnc against PyTorch (and JAX when installed): ``python benchmarks/run.py --help``.

The same as ``rnnc bench``; for example
``python benchmarks/run.py --configs C1,C2 --cells lstm,mgu --markdown results.md``.
"""

import sys

from rnnc.tools import bench

if __name__ == "__main__":
    sys.exit(bench.main(sys.argv[1:]))
