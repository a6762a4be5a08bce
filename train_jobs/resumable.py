"""A small real DDP job that survives restarts: it saves a checkpoint into DDPCTL_CHECKPOINT_DIR
every --every steps (rank 0, atomically), resumes from it, and can fail on purpose, so that
ddpctl's restarts (orchestrator/restarts/loop.py) are tested and measured on real hosts.

Each rank prints
    attempt A rank R on HOST resumes at step S; previous failure: <DDPCTL_PREV_FAILURE or ->
    attempt A rank R step N                 (one line per optimizer step)
with ` t=<time.time()>` appended to both with --stamp.

The run ends at step --steps (0: never); an attempt also ends --steps-per-attempt steps after
where it resumed (0: no such limit), except attempt --forever-on-attempt, which runs until it is
killed. With --busy-at, rank 0 works alone for --busy-s seconds at that step (no collective: its
peers wait), then saves. The fault: at step --fail-at, on the host named --fail-host, on the attempts listed in
--fail-attempts ("0", "0,1" or "all"), --fail-how says how: "raise" (the same ValueError every
time), "raise-per-attempt" (a message that differs per attempt) or an exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=0, help="the step the run ends at (0: never)")
    p.add_argument("--steps-per-attempt", type=int, default=0, help="an attempt ends this many steps after "
                   "where it resumed (0: no limit)")
    p.add_argument("--forever-on-attempt", type=int, default=-1, help="this attempt runs until it is killed")
    p.add_argument("--delay", type=float, default=0.1, help="seconds each step sleeps")
    p.add_argument("--every", type=int, default=5, help="a checkpoint every N steps")
    p.add_argument("--stamp", action="store_true", help="append t=<time.time()> to the lines")
    p.add_argument("--fail-at", type=int, default=-1)
    p.add_argument("--fail-host", default="")
    p.add_argument("--fail-how", default="raise")
    p.add_argument("--fail-attempts", default="all")
    p.add_argument("--busy-at", type=int, default=-1, help="at this step, rank 0 works alone (no collective: an "
                   "evaluation, a slow save) for --busy-s seconds, then saves, on the attempts in --fail-attempts")
    p.add_argument("--busy-s", type=float, default=0.0)
    return p.parse_args(argv)


def owns_checkpoints(directory: str) -> bool:
    """False when a newer attempt (or another run) owns `directory`: this rank is stale and must not
    write there (ddpctl marks the owner in .ddpctl-attempt before each attempt starts)."""
    try:
        with open(os.path.join(directory, ".ddpctl-attempt")) as f:
            mark = json.load(f)
    except (OSError, ValueError):
        return True
    return mark.get("run_id") == os.environ.get("DDPCTL_RUN_ID") and \
        int(mark.get("attempt", -1)) <= int(os.environ.get("DDPCTL_ATTEMPT", "0"))


def save(model: torch.nn.Module, step: int, path: str, attempt: int) -> None:
    """Rank 0's checkpoint, atomically, unless a newer attempt owns the directory."""
    folder = os.path.dirname(path)
    if not owns_checkpoints(folder):
        print(f"attempt {attempt}: a newer attempt owns {folder}: not saving step {step}", flush=True)
        return
    os.makedirs(folder, exist_ok=True)
    torch.save({"model": model.state_dict(), "step": step}, path + ".tmp")
    os.replace(path + ".tmp", path)


def fail(args: argparse.Namespace, step: int, attempt: int) -> None:
    if step != args.fail_at or socket.gethostname() != args.fail_host:
        return
    if args.fail_attempts != "all" and str(attempt) not in args.fail_attempts.split(","):
        return
    if args.fail_how == "raise":
        raise ValueError(f"bad batch at step {step}")
    if args.fail_how == "raise-per-attempt":
        raise ValueError(f"flaky read in attempt {attempt}")
    sys.exit(int(args.fail_how))


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    attempt = int(os.environ.get("DDPCTL_ATTEMPT", "0"))
    stamp = (lambda: f" t={time.time():.6f}") if args.stamp else (lambda: "")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    path = os.path.join(os.environ.get("DDPCTL_CHECKPOINT_DIR", "checkpoints"), "ckpt.pt")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.module.load_state_dict(state["model"])
        start = state["step"]
    print(f"attempt {attempt} rank {rank} on {socket.gethostname()} resumes at step {start}; previous failure: "
          f"{os.environ.get('DDPCTL_PREV_FAILURE', '-')}{stamp()}", flush=True)
    end = args.steps if args.steps > 0 else None
    if args.steps_per_attempt > 0 and attempt != args.forever_on_attempt:
        end = min(end, start + args.steps_per_attempt) if end is not None else start + args.steps_per_attempt
    step = start
    while end is None or step < end:
        fail(args, step, attempt)
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        print(f"attempt {attempt} rank {rank} step {step}{stamp()}", flush=True)
        if rank == 0 and step == args.busy_at and (args.fail_attempts == "all" or
                                                  str(attempt) in args.fail_attempts.split(",")):
            print(f"attempt {attempt} rank {rank} busy on its own for {args.busy_s:g}s{stamp()}", flush=True)
            time.sleep(args.busy_s)
            save(model.module, step + 1, path, attempt)
        if rank == 0 and (step + 1) % args.every == 0:
            save(model.module, step + 1, path, attempt)
        step += 1
        time.sleep(args.delay)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
