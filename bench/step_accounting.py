"""What the rank wrapper's step accounting costs per optimizer step, against a 10 ms step (target:
under 1 %), measured in one process on this machine's CPU with torch and gloo (world size 1).

Two parts, each measured side by side with its baseline in alternating blocks (the medians of
--blocks blocks of --steps steps):
(a) the step hook itself (node_agent/rank/rankwrap.py `_stepped`: count, time, read DDP's timings of the
    iteration, and write the `step` record every STEP_EVERY seconds into a real rank directory),
    called after each real DDP step of a small model, against the same steps with no hook;
(b) DDP's runtime timings at every iteration (`_set_ddp_runtime_logging_sample_rate(1)`, which the
    wrapper sets) against torch's default of one iteration in 100.
Prints microseconds per step for each and their sum as a share of a 10 ms step. A missed target is a
figure, not a failure.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
from torch import nn

from node_agent.rank import rankwrap

STEP_S = 0.010


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed_steps(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int, hook: bool) -> float:
    """Seconds per step of `steps` DDP steps, the wrapper's hook called after each when `hook`."""
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        if hook:
            rankwrap._stepped()
    return (time.perf_counter() - start) / steps


def paired(measure_a: object, measure_b: object, blocks: int) -> tuple[float, float]:
    """Medians of alternating blocks of two measurements (callables returning seconds per step)."""
    a, b = [], []
    for _ in range(blocks):
        a.append(measure_a())  # type: ignore[operator]
        b.append(measure_b())  # type: ignore[operator]
    return statistics.median(a), statistics.median(b)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--blocks", type=int, default=9)
    args = p.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    with tempfile.TemporaryDirectory() as rank_dir:
        os.environ[rankwrap.RANK_DIR_ENV] = rank_dir
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(32, 256)
        model._set_ddp_runtime_logging_sample_rate(1)
        rankwrap._STEPS.ddp_models.append(weakref.ref(model))
        timed_steps(model, opt, x, args.steps, True)  # warm up
        with_hook, without = paired(lambda: timed_steps(model, opt, x, args.steps, True),
                                    lambda: timed_steps(model, opt, x, args.steps, False), args.blocks)
        records = (Path(rank_dir) / "0.step").exists()

        def at_rate(rate: int) -> float:
            model._set_ddp_runtime_logging_sample_rate(rate)
            return timed_steps(model, opt, x, args.steps, False)

        every, default = paired(lambda: at_rate(1), lambda: at_rate(100), args.blocks)
    dist.destroy_process_group()
    hook_us = (with_hook - without) * 1e6
    sample_us = (every - default) * 1e6
    total = max(0.0, hook_us) + max(0.0, sample_us)
    print(f"DDP step of this model: {without * 1e3:.3f} ms (median of {args.blocks} blocks of {args.steps} steps)")
    print(f"(a) step hook (count, time, DDP timings, a record every {rankwrap.STEP_EVERY:g} s; written: {records}): "
          f"{hook_us:.1f} us per step")
    print(f"(b) DDP timings at every iteration instead of 1 in 100: {sample_us:.1f} us per step")
    print(f"step accounting: {total:.1f} us per step = {total / (STEP_S * 1e6):.2%} of a {STEP_S * 1e3:.0f} ms step "
          f"(target < 1 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
