"""A few-second gloo all_reduce across every rank: separates network faults from NCCL faults.

Each rank prints `DDPCTL-SMOKE rank=R world=W ok=True sum=S seconds=T`; exit 3 on a wrong sum.
`ddpctl doctor --smoke` runs it through the real launch path; it also runs by hand:
  python -m torch.distributed.run --standalone --nproc-per-node 2 train_jobs/smoke.py
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    started = time.time()
    timeout = datetime.timedelta(seconds=float(os.environ.get("DDPCTL_SMOKE_TIMEOUT", "30")))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.full((1024,), float(rank + 1))
    dist.all_reduce(x)
    expected = world * (world + 1) / 2
    ok = bool(torch.all(x == expected))
    print(
        f"DDPCTL-SMOKE rank={rank} world={world} ok={ok} sum={float(x[0])} seconds={time.time() - started:.2f}",
        flush=True,
    )
    dist.destroy_process_group()
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
