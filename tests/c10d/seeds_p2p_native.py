"""The torch.distributed snippets of the source documents, on unison's own API.

    unison run -np 2 python tests/c10d/seeds_p2p_native.py

The three ``run(rank, size)`` functions below are copied literally from the
Chinese survey in shared/seeds/ (blocking send/recv, isend/irecv, all_reduce on
``new_group([0, 1])``; the Markdown escapes removed). The only changed lines are
the import (``import unison as dist`` instead of ``import torch.distributed as
dist``) and the init (``dist.init()``).
"""

import torch

import unison as dist


def run_blocking(rank, size):
    """Blocking point-to-point communication."""

    def run(rank, size):
        tensor = torch.zeros(1)
        if rank == 0:
            tensor += 1
            # Send the tensor to process 1
            dist.send(tensor=tensor, dst=1)
        else:
            # Receive tensor from process 0
            dist.recv(tensor=tensor, src=0)
        print("Rank ", rank, " has data ", tensor[0])
        return tensor

    return run(rank, size)


def run_nonblocking(rank, size):
    """Non-blocking point-to-point communication."""

    def run(rank, size):
        tensor = torch.zeros(1)
        req = None
        if rank == 0:
            tensor += 1
            # Send the tensor to process 1
            req = dist.isend(tensor=tensor, dst=1)
            print("Rank 0 started sending")
        else:
            # Receive tensor from process 0
            req = dist.irecv(tensor=tensor, src=0)
            print("Rank 1 started receiving")

        req.wait()
        print("Rank ", rank, " has data ", tensor[0])
        return tensor

    return run(rank, size)


def run_all_reduce(rank, size):
    """All-Reduce example."""

    def run(rank, size):
        """Simple collective communication."""
        group = dist.new_group([0, 1])
        tensor = torch.ones(1)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        print("Rank ", rank, " has data ", tensor[0])
        return tensor

    return run(rank, size)


def main():
    dist.init()
    rank, size = dist.get_rank(), dist.get_world_size()
    results = [f(rank, size).item() for f in (run_blocking, run_nonblocking, run_all_reduce)]
    dist.shutdown()
    assert results == [1.0, 1.0, 2.0], results


if __name__ == "__main__":
    main()
