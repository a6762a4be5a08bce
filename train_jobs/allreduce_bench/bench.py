"""all_reduce bandwidth benchmark over message sizes, printed like nccl-tests.

Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 bench.py --json
Rank 0 prints a header, one row per size, then `# avg busbw: X GB/s`:
      size_bytes      count   dtype    time_us  algbw_GBps  busbw_GBps
Sizes double from --min-bytes to --max-bytes (suffixes K/M/G = KiB/MiB/GiB). time_us is the
mean time of one all_reduce (the slowest rank's), algbw = size / time, busbw = algbw *
2(n-1)/n (the per-link traffic of a ring all_reduce, comparable across world sizes).

With --json rank 0 also prints one line `BANDWIDTH <json>`; schema (version 1):
  {"schema": 1, "op": "all_reduce", "backend": "gloo"|"nccl", "device": "cpu"|"cuda",
   "world_size": int, "nnodes": int, "dtype": str, "iters": int, "warmup": int,
   "results": [{"size_bytes": int, "count": int, "time_us": float,
                "algbw_gbps": float, "busbw_gbps": float}, ...],   # ascending size_bytes
   "avg_busbw_gbps": float, "peak_busbw_gbps": float}
GB/s means 1e9 bytes per second.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

try:
    from train_jobs import common
except ImportError:  # run as a plain script from its own directory: add the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from train_jobs import common

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class BenchArgs:
    min_bytes: int
    max_bytes: int
    iters: int
    warmup: int
    dtype: str
    json: bool


@dataclass(frozen=True)
class SizeResult:
    size_bytes: int
    count: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


def parse_size(text: str) -> int:
    """'1K' -> 1024, '256M' -> 268435456, '4096' -> 4096 (K/M/G are binary; B optional)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    num, suffix = (t[:-1], t[-1]) if t and t[-1] in "KMG" else (t, "")
    try:
        value = int(num) * _SUFFIX[suffix]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size, e.g. 4096, 1K, 256M") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: size must be positive")
    return value


def size_series(min_bytes: int, max_bytes: int, elem_size: int) -> list[int]:
    """Doubling sizes from min to max (inclusive), each rounded down to whole elements."""
    sizes: list[int] = []
    size = max(min_bytes, elem_size)
    while size <= max_bytes:
        rounded = size - size % elem_size
        if not sizes or rounded > sizes[-1]:
            sizes.append(rounded)
        size *= 2
    return sizes


def bus_factor(world_size: int) -> float:
    """nccl-tests' all_reduce correction 2(n-1)/n: 0 for 1 rank, 1 for 2, 1.5 for 4."""
    return 2.0 * (world_size - 1) / world_size


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 B/s): bytes reduced per second."""
    return size_bytes / seconds / 1e9


def busbw_gbps(algbw: float, world_size: int) -> float:
    """Bus bandwidth: algbw * 2(n-1)/n, comparable across world sizes (nccl-tests)."""
    return algbw * bus_factor(world_size)


def make_result(size_bytes: int, count: int, seconds: float, world_size: int) -> SizeResult:
    algbw = algbw_gbps(size_bytes, seconds)
    return SizeResult(size_bytes, count, seconds * 1e6, algbw, busbw_gbps(algbw, world_size))


def parse_args(argv: list[str]) -> BenchArgs:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-bytes", type=parse_size, default=parse_size("1K"))
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("256M"))
    p.add_argument("--iters", type=int, default=20, help="timed all_reduces per size")
    p.add_argument("--warmup", type=int, default=5, help="untimed all_reduces per size")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--json", action="store_true", help="also print `BANDWIDTH <json>`")
    ns = p.parse_args(argv)
    if ns.min_bytes > ns.max_bytes:
        p.error(f"--min-bytes {ns.min_bytes} is larger than --max-bytes {ns.max_bytes}")
    if ns.iters < 1 or ns.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    return BenchArgs(ns.min_bytes, ns.max_bytes, ns.iters, ns.warmup, ns.dtype, ns.json)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_correct(ctx: common.DistContext, buf: torch.Tensor) -> None:
    """One all_reduce of (rank+1) must give n(n+1)/2 everywhere."""
    n = ctx.env.world_size
    buf.fill_(ctx.env.rank + 1)
    dist.all_reduce(buf)
    if not bool((buf == n * (n + 1) // 2).all()):
        raise RuntimeError(f"all_reduce returned a wrong sum on rank {ctx.env.rank}")


def time_size(ctx: common.DistContext, args: BenchArgs, size_bytes: int) -> SizeResult:
    dtype = DTYPES[args.dtype]
    count = size_bytes // torch.empty((), dtype=dtype).element_size()
    buf = torch.empty(count, dtype=dtype, device=ctx.device)
    check_correct(ctx, buf)
    buf.zero_()  # keep values finite however many iterations run
    for _ in range(args.warmup):
        dist.all_reduce(buf)
    _sync(ctx.device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(buf)
    _sync(ctx.device)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time
    return make_result(size_bytes, count, float(elapsed.item()) / args.iters, ctx.env.world_size)


def table_header() -> str:
    names = ("size_bytes", "count", "dtype", "time_us", "algbw_GBps", "busbw_GBps")
    widths = (14, 12, 9, 12, 11, 11)
    return " ".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))


def table_row(r: SizeResult, dtype: str) -> str:
    return f"{r.size_bytes:>14} {r.count:>12} {dtype:>9} {r.time_us:>12.1f} {r.algbw_gbps:>11.3f} {r.busbw_gbps:>11.3f}"


def summary(ctx: common.DistContext, args: BenchArgs, results: list[SizeResult]) -> dict[str, object]:
    busbws = [r.busbw_gbps for r in results]
    return {
        "schema": 1,
        "op": "all_reduce",
        "backend": ctx.backend,
        "device": ctx.device.type,
        "world_size": ctx.env.world_size,
        "nnodes": ctx.env.world_size // max(1, ctx.env.local_world_size),
        "dtype": args.dtype,
        "iters": args.iters,
        "warmup": args.warmup,
        "results": [asdict(r) for r in results],
        "avg_busbw_gbps": sum(busbws) / len(busbws),
        "peak_busbw_gbps": max(busbws),
    }


def run(ctx: common.DistContext, args: BenchArgs) -> None:
    elem = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
    common.print0(ctx, f"# all_reduce {ctx.backend} {ctx.device.type} world_size={ctx.env.world_size}")
    common.print0(ctx, table_header())
    results: list[SizeResult] = []
    for size in size_series(args.min_bytes, args.max_bytes, elem):
        results.append(time_size(ctx, args, size))
        common.print0(ctx, table_row(results[-1], args.dtype))
    info = summary(ctx, args, results)
    common.print0(ctx, f"# avg busbw: {info['avg_busbw_gbps']:.3f} GB/s")
    if args.json:
        common.print0(ctx, f"BANDWIDTH {json.dumps(info)}")


@record
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ctx = common.init_distributed()
    ok = False
    try:
        run(ctx, args)
        ok = True
        return 0
    finally:
        common.cleanup(barrier=ok)


if __name__ == "__main__":
    sys.exit(main())
