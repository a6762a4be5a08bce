"""A chatty job for the output benchmarks (bench/chatty_output.py, bench/failfast_backlog.py).

Every rank prints --lines lines as fast as it can (print(), no sleep), each
  rank R line NNNNNN <filler>
padded to --width bytes, then exits. With --fail-rank R, that rank flushes its lines, writes
time.time() to --stamp (the benchmark's clock: every host shares this machine's) and raises;
the other ranks then sleep --hold seconds (as if blocked in a collective) instead of exiting.
Needs no torch: the rank comes from torchrun's RANK environment variable.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def layout(rank: int, lines: int, width: int) -> tuple[int, str]:
    """The digits of a line number and the filler after it, for lines of `width` bytes."""
    digits = max(6, len(str(max(lines - 1, 0))))
    head = len(f"rank {rank} line {0:0{digits}d} ")
    return digits, ("chatty-output-filler-" * (width // 21 + 2))[: max(0, width - head)]


def line_text(rank: int, i: int, lines: int, width: int) -> str:
    """Line `i` of `rank`, as printed (without its newline)."""
    digits, filler = layout(rank, lines, width)
    return f"rank {rank} line {i:0{digits}d} {filler}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=100_000, help="lines each rank prints")
    p.add_argument("--width", type=int, default=72, help="bytes per line, newline excluded")
    p.add_argument("--fail-rank", type=int, default=None, help="this rank raises after its lines")
    p.add_argument("--stamp", default=None, help="where the failing rank writes the unix time of its raise")
    p.add_argument("--hold", type=float, default=300.0, help="with --fail-rank: the others sleep this long")
    args = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    digits, filler = layout(rank, args.lines, args.width)
    for i in range(args.lines):
        print(f"rank {rank} line {i:0{digits}d} {filler}")
    sys.stdout.flush()
    if args.fail_rank is None:
        return 0
    if rank == args.fail_rank:
        now = time.time()
        if args.stamp:
            tmp = f"{args.stamp}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(f"{now:.6f}\n")
            os.replace(tmp, args.stamp)  # whole or absent: the benchmark polls for it
        print(f"rank {rank} raising after its {args.lines} lines at unix time {now:.6f}", flush=True)
        raise RuntimeError(f"chatty: injected failure on rank {rank} (--fail-rank)")
    time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
