"""A tour of the IR: an LSTM after every pass, inference, training forward and backward, and DOT.

    python examples/ir_tour.py [--out ir_tour/] [--hidden 8]

Writes one text file per mode (the program after every pass) and one Graphviz file per mode
(render with `dot -Tsvg lstm_backward.dot -o lstm_backward.svg`), and prints the inference run.
"""

from __future__ import annotations

import argparse
import pathlib

import rnnc
from rnnc import passes
from rnnc.dot import to_dot
from rnnc.ir import retype


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="ir_tour")
    ap.add_argument("--hidden", type=int, default=8)
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cell = rnnc.cells.lstm(args.hidden, args.hidden)
    for mode in ("inference", "forward", "backward"):
        text = rnnc.dump(cell, after="all", mode=mode)
        (out / f"lstm_{mode}.txt").write_text(text + "\n")
        final = passes.run(retype(cell.program(), "f32"), passes.pipeline(mode))
        (out / f"lstm_{mode}.dot").write_text(to_dot(final, f"lstm {mode}"))
        if mode == "inference":
            print(text)
    fn = rnnc.compile(cell)
    for mode in ("inference", "forward", "backward"):
        print(f"{mode:10s} {fn.op_counts(mode)}")
    print(f"wrote {sorted(p.name for p in out.iterdir())} to {out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
