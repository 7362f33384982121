"""Swap torch.nn.LSTM for rnnc.torch.RNN in a PyTorch training loop.

    python examples/torch_interop.py --steps 30

The two modules have the same parameter names and shapes, so the script starts both from
one state dict, trains each with Adam on the same data, and prints both losses.
"""

from __future__ import annotations

import argparse

import torch

import rnnc.torch


class Classifier(torch.nn.Module):
    """An LSTM over the sequence, then a linear layer on the last hidden state."""

    def __init__(self, rnn: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.rnn = rnn
        self.head = torch.nn.Linear(hidden_size, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.rnn(x)
        return self.head(h[-1])


def main() -> None:
    """Train the torch and the rnnc model side by side and print their losses."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--backend", default=None, help="numpy, llvm or cuda (default: fastest)")
    args = parser.parse_args()

    torch.manual_seed(0)
    input_size, hidden_size = 4, 16
    x = torch.randn(64, 12, input_size)
    y = (x[:, :, 0].sum(dim=1) > 0).long()  # is the first feature's sum positive?

    reference = Classifier(torch.nn.LSTM(input_size, hidden_size, batch_first=True),
                           hidden_size)
    ours = Classifier(rnnc.torch.RNN("lstm", input_size, hidden_size, batch_first=True,
                                     backend=args.backend), hidden_size)
    ours.load_state_dict(reference.state_dict())  # same names and shapes: loads as is

    opts = [torch.optim.Adam(m.parameters(), lr=0.02) for m in (reference, ours)]
    for step in range(args.steps):
        losses = []
        for model, opt in zip((reference, ours), opts, strict=True):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  torch.nn.LSTM {losses[0]:.4f}  rnnc.torch.RNN {losses[1]:.4f}")


if __name__ == "__main__":
    main()
