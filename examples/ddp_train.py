"""Train a model containing rnnc.torch.RNN with DistributedDataParallel on the CPU.

    python examples/ddp_train.py --procs 2 --steps 20

Each process trains on its own data shard; DDP averages the gradients with the gloo
backend, so every rank ends with the same parameters, which the script checks.
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rnnc.torch


class Model(torch.nn.Module):
    """Two GRU layers computed by rnnc, then a linear classifier on the last hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = rnnc.torch.RNN("gru", 3, 16, num_layers=2, dropout=0.1, batch_first=True)
        self.head = torch.nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, h = self.rnn(x)
        return self.head(h[-1])


def train(rank: int, world_size: int, port: int, steps: int) -> None:
    """One process: join the group, train, and compare parameters with rank 0."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Model())
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    torch.manual_seed(1 + rank)  # this rank's shard
    x = torch.randn(32, 10, 3)
    y = (x[:, :, 0].sum(dim=1) > 0).long()
    for step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if rank == 0 and (step % 5 == 0 or step == steps - 1):
            print(f"step {step:3d}  loss on rank 0 {loss.item():.4f}")
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        same = all(torch.equal(gathered[0], g) for g in gathered)
        print(f"parameters identical on all {world_size} ranks: {same}")
    # Tear down together: a rank that leaves while another still talks to it makes gloo abort.
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    """Spawn the processes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(args.procs, port, args.steps), nprocs=args.procs, join=True)


if __name__ == "__main__":
    main()
