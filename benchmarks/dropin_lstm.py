"""Time a training step of ``rnnc.torch.RNN`` against ``torch.nn.LSTM`` as a drop-in user runs it.

The step is ``zero_grad``, forward, ``loss = y.sum()``, backward, on the same weights, shapes and
threads for both modules; the timed blocks alternate between the two so that a shared machine's
load falls on both alike. It prints each side's median and the ratio rnnc / nn.LSTM (lower is
better). The default shapes are a small stacked bidirectional encoder:
``python benchmarks/dropin_lstm.py --threads 1`` (T=40, B=32, I=H=64, 2 layers, both directions).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=40, help="steps (default 40)")
    parser.add_argument("--B", type=int, default=32, help="batch (default 32)")
    parser.add_argument("--I", type=int, default=64, help="input size (default 64)")
    parser.add_argument("--H", type=int, default=64, help="hidden size (default 64)")
    parser.add_argument("--layers", type=int, default=2, help="layers (default 2)")
    parser.add_argument("--unidirectional", action="store_true", help="one direction only")
    parser.add_argument("--threads", type=int, default=1, help="threads of both sides (1)")
    parser.add_argument("--inference", action="store_true",
                        help="time a forward under torch.no_grad instead of a training step")
    parser.add_argument("--reps", type=int, default=15, help="timed rounds (default 15)")
    parser.add_argument("--block", type=int, default=10, help="steps per timed block (10)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Time both modules and print their medians per step and the ratio."""
    args = _parse(argv)
    os.environ["RNNC_THREADS"] = str(args.threads)  # read when rnnc's backend first runs
    import torch

    import rnnc.torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    kwargs = {"num_layers": args.layers, "bidirectional": not args.unidirectional}
    reference = torch.nn.LSTM(args.I, args.H, **kwargs)
    module = rnnc.torch.RNN("lstm", args.I, args.H, **kwargs)
    module.load_state_dict(reference.state_dict())
    x = torch.randn(args.T, args.B, args.I)

    def step(m: torch.nn.Module) -> None:
        m.zero_grad(set_to_none=True)
        if args.inference:
            with torch.no_grad():
                m(x)
            return
        y, _ = m(x)
        y.sum().backward()

    for m in (reference, module):  # compile, create oneDNN primitives, settle
        for _ in range(5):
            step(m)
    times: dict[str, list[float]] = {"nn.LSTM": [], "rnnc.torch.RNN": []}
    for _ in range(args.reps):
        for name, m in (("nn.LSTM", reference), ("rnnc.torch.RNN", module)):
            start = time.perf_counter()
            for _ in range(args.block):
                step(m)
            times[name].append((time.perf_counter() - start) / args.block)
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    what = "inference" if args.inference else "training step"
    print(f"T={args.T} B={args.B} I={args.I} H={args.H} layers={args.layers} "
          f"directions={1 if args.unidirectional else 2} threads={args.threads} "
          f"torch {torch.__version__}: {what}, median of {args.reps} blocks of {args.block}")
    for name, value in ms.items():
        print(f"  {name:15s} {value:8.3f} ms")
    print(f"  rnnc / nn.LSTM  {ms['rnnc.torch.RNN'] / ms['nn.LSTM']:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
