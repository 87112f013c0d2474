"""A small, real DDP training loop over gloo on CPU: what `mcprun -n 4` launches in the README.

It needs nothing but the environment mcprun gives every worker (init_method="env://").
"""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.is_torchelastic_launched(), "expected to run under a torchrun-compatible launcher"
    torch.manual_seed(0)  # Same initial weights everywhere; DDP also broadcasts rank 0's.

    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    true_weights = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
    data = torch.Generator().manual_seed(1000 + rank)  # Each rank sees its own shard.
    for step in range(1, 41):
        inputs = torch.randn(64, 8, generator=data)
        loss = torch.nn.functional.mse_loss(model(inputs), inputs @ true_weights)
        optimizer.zero_grad()
        loss.backward()  # All-reduces gradients across every rank.
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step:3d}  loss {loss.item():.5f}", flush=True)

    # Every replica must hold identical weights after synchronised steps.
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    assert all(torch.equal(weights, other) for other in gathered), "replicas diverged"
    print(f"rank {rank}/{world} local_rank {os.environ['LOCAL_RANK']}: done, replicas in sync",
          flush=True)
    # Leave together: torch 2.x can abort a rank ("terminate called without an active exception")
    # whose destroy_process_group races a peer that has already exited.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
