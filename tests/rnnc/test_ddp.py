"""rnnc.torch.RNN trains under DistributedDataParallel (gloo, two processes)."""

from __future__ import annotations

import os
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, results: dict) -> None:
    """Train a tiny classifier on this rank's shard; report losses and final parameters."""
    import rnnc.torch as rt

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts it)

        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.rnn = rt.RNN("gru", 1, 6, num_layers=2, dropout=0.1, batch_first=True,
                                  backend="numpy")
                self.head = torch.nn.Linear(6, 2)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                _, h = self.rnn(x)
                return self.head(h[-1])

        model = torch.nn.parallel.DistributedDataParallel(Model())
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        torch.manual_seed(100 + rank)  # a different data shard and dropout stream per rank
        x = torch.randn(16, 5, 1)
        y = (x.sum(dim=(1, 2)) > 0).long()
        losses = []
        for _ in range(15):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        results[rank] = (losses, [p.detach().clone() for p in model.module.parameters()])
    finally:
        dist.destroy_process_group()


def test_ddp_two_processes():
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(2, _free_port(), results), nprocs=2, join=True)
    (loss0, params0), (loss1, params1) = results[0], results[1]
    for a, b in zip(params0, params1, strict=True):
        assert torch.equal(a, b)
    assert loss0[-1] < loss0[0] and loss1[-1] < loss1[0]
