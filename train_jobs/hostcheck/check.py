"""The active half of `ddpctl doctor --deep`: on every host, a process on its own (torchrun
--standalone: no host waits in a rendezvous for another) that joins a store on the master host,
then does what the coordinator (coordinate.py, a thread of node 0's process) asks: time a matrix
multiply on each of its GPUs (on the CPU where it has none), or exchange a few MiB with one
partner. A host that is late, starved or stuck is named at its deadline; the others go on.

Compute is timed in turn among hosts that share a kernel (the same boot id: containers or
namespaces on one machine share its cores, and one host's load would hide another's); hosts on
different kernels are timed at once. A figure is throughput over a window of at least
--compute-seconds, so a host whose CPU time is rationed (a cgroup quota, a throttled GPU) shows
its real pace; each device's best of coordinate.WINDOWS windows, taken in turns.

Links: a pair forms its own two-rank group over the store (gloo; NCCL where the hosts have GPUs),
sends and receives --bytes at once, --iters times (once where that took SLOW_EXCHANGE_S) and more
while that takes under MIN_EXCHANGE_S (MAX_EXCHANGES at most); where the warm-up says the bytes
might not fit the cap the coordinator gave, in CHUNKS pieces, and it stops itself at the cap (what
moved by then is its figure). A pair's figure is its best exchange, MB/s one way.

Node 0 prints `DDPCTL-DEEP <json>` at the end (the figures, declared once: figures.DeepFigures, which
coordinate.Coordinator builds), and `DDPCTL-DEEP-ROUND <i> <pairs>` as each link round ends (progress,
so a long run never looks hung). Every host prints when its check starts and when it has joined, and
node 0 when its store serves (figures.STARTED, JOINED, SERVING): where node 0 never serves, there is
no coordinator to name anyone, and doctor's side bounds the start from these lines.
Where the job runs: DDPCTL_NODE_RANK, DDPCTL_NNODES and DDPCTL_COORDINATOR (host:port) from the plan.
Nothing here looks a host's name up: the store is dialled at the coordinator's address, and a pair's
gloo device is GLOO_SOCKET_IFNAME's interface (which ddpctl sets where the name resolves nowhere) or
else this host's own address on its route to node 0, never what its hostname resolves to.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from train_jobs.hostcheck.coordinate import Coordinator, Settings
from train_jobs.hostcheck.figures import JOINED, LATE, RESULT, SERVING, STARTED

CPU_N = 512  # CPU: 512 x 512 float32 multiplies
GPU_N = 8192  # GPU: 8192 x 8192 bf16 multiplies
WARMUP_BYTES = 64 << 10
CHUNKS = 32  # an exchange moves its bytes in this many pieces, so a pair past its cap stops
MIN_EXCHANGE_S = 0.1  # a pair keeps exchanging until this long has passed (--iters at least) ...
MAX_EXCHANGES = 10  # ... or this many timed exchanges
NEWS = "news"  # the store's counter of joins and replies (coordinate.Board.news)
SLOW_EXCHANGE_S = 0.5  # past this, one whole exchange is figure enough (a slow link is not timed twice)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=2 << 20, help="bytes each way per exchange")
    p.add_argument("--iters", type=int, default=2, help="timed exchanges per pair")
    p.add_argument("--links-budget", type=float, default=20.0, help="seconds of tournament rounds")
    p.add_argument("--compute-seconds", type=float, default=0.15, help="one timing window per device")
    p.add_argument("--timeout", type=float, default=120.0, help="how long a host waits for its next command")
    return p.parse_args(argv)


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return f"{os.uname().nodename}-{os.getpid()}"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_matmul(device: torch.device, window: float) -> tuple[float, float]:
    """(TFLOP/s, seconds timed): multiplies back to back for at least `window` seconds."""
    n, dtype = (GPU_N, torch.bfloat16) if device.type == "cuda" else (CPU_N, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b)
    _sync(device)
    done, start = 0, time.perf_counter()
    while True:
        for _ in range(4):
            torch.mm(a, b)
        _sync(device)
        done += 4
        elapsed = time.perf_counter() - start
        if elapsed >= window:
            return 2.0 * n ** 3 * done / elapsed / 1e12, elapsed


def devices() -> list[torch.device]:
    return [torch.device("cuda", i) for i in range(torch.cuda.device_count())] or [torch.device("cpu")]


def compute_window(window: float) -> dict[str, Any]:
    rows = []
    for device in devices():
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        tflops, seconds = time_matmul(device, window)
        rows.append({"device": str(device), "gpu": gpu,
                     "model": gpu or f"{cpu_model()} ({torch.get_num_threads()} threads)",
                     "tflops": tflops, "seconds": seconds})
    return {"devices": rows}


def route_address(addr: str, port: int) -> str:
    """This host's own address on its route to `addr` (a UDP socket's connect sends nothing)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((addr, port))
        return str(probe.getsockname()[0])


def gloo_devices(env: Mapping[str, str]) -> list[dict[str, str]]:
    """What a pair's gloo devices bind to (ProcessGroupGloo.create_device's arguments): each interface
    of GLOO_SOCKET_IFNAME where it is set (the job's, or ddpctl's where this host's name resolves
    nowhere: doctor's addressing), else this host's address on its route to node 0
    (DDPCTL_COORDINATOR). Never gloo's default, which looks this host's name up and falls back to
    loopback where it resolves nowhere: a pair across hosts would then never connect."""
    ifname = env.get("GLOO_SOCKET_IFNAME", "")
    if ifname:
        return [{"interface": name} for name in ifname.split(",")]
    addr, _, port = env["DDPCTL_COORDINATOR"].rpartition(":")
    return [{"hostname": route_address(addr.strip("[]"), int(port))}]


def gloo_options(timeout: float, env: Mapping[str, str]) -> Any:
    pg = dist.ProcessGroupGloo
    options = pg._Options()
    options._devices = [pg.create_device(**device) for device in gloo_devices(env)]
    options._timeout = timedelta(seconds=timeout)
    return options


class PairGroup:
    """A two-rank group over the store, for one exchange."""

    def __init__(self, store: Any, tag: str, role: int, timeout: float, device: torch.device) -> None:
        self.device = device
        self.group: Any = None
        if device.type == "cuda":
            try:
                self.group = dist.ProcessGroupNCCL(dist.PrefixStore(f"pair/{tag}/nccl", store), role, 2)
            except Exception:  # an NCCL this torch cannot build a group with: gloo, on the CPU
                self.device = torch.device("cpu")
        if self.group is None:
            self.group = dist.ProcessGroupGloo(dist.PrefixStore(f"pair/{tag}", store), role, 2,
                                               gloo_options(timeout, os.environ))
        self.peer = 1 - role
        self.role = role

    def swap(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        works = [self.group.send([send], self.peer, 0), self.group.recv([recv], self.peer, 0)]
        for w in works:
            w.wait()

    def agree(self, flag: torch.Tensor) -> bool:
        """Role 0 decides (its value), role 1 learns it."""
        if self.role == 0:
            self.group.send([flag], self.peer, 1).wait()
        else:
            self.group.recv([flag], self.peer, 1).wait()
        return bool(int(flag.item()))


def exchange(pair: PairGroup, nbytes: int, iters: int, cap: float) -> dict[str, Any]:
    """Simultaneous send+receive of `nbytes` with the partner (in CHUNKS pieces where the warm-up
    says it may not fit `cap`): `iters` times, more while they take under MIN_EXCHANGE_S (at most
    MAX_EXCHANGES), no exchange or piece begun past `cap` seconds: the figure is the best whole
    exchange (its pieces' time, not the round trips that agree on going on), else what moved in
    the time it ran."""
    device = pair.device
    send = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    recv = torch.empty_like(send)
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    size = min(WARMUP_BYTES, nbytes) // 4
    pair.swap(send[:size], recv[:size])  # sets the connection up; not timed
    _sync(device)
    warm = time.perf_counter()
    pair.swap(send[:size], recv[:size])  # its pace says whether the whole may not fit the cap
    _sync(device)
    # pieces only where the whole might not fit the cap: a healthy pair's exchange is one piece
    flag.fill_(int((time.perf_counter() - warm) * nbytes / max(size * 4, 1) > cap / 2))
    piece = max(1, (nbytes // 4 + CHUNKS - 1) // CHUNKS) if pair.agree(flag) else nbytes // 4
    best, done, moved = float("inf"), 0, 0
    started = time.perf_counter()
    while True:
        took, sent, whole = 0.0, 0, True  # took: the pieces' own time, not the round trips between them
        while sent < nbytes // 4:
            n = min(piece, nbytes // 4 - sent)
            start = time.perf_counter()
            pair.swap(send[sent:sent + n], recv[sent:sent + n])
            _sync(device)
            took += time.perf_counter() - start
            sent += n
            moved += n * 4
            if sent < nbytes // 4:
                flag.fill_(int(time.perf_counter() - started < cap))
                if not pair.agree(flag):
                    whole = False
                    break
        if whole:
            best = min(best, took)
            done += 1
        spent = time.perf_counter() - started
        flag.fill_(int(whole and spent < cap and done < MAX_EXCHANGES
                       and (spent < MIN_EXCHANGE_S or (done < iters and spent < SLOW_EXCHANGE_S))))
        if not pair.agree(flag):
            break
    elapsed = time.perf_counter() - started
    if done:
        return {"mbps": nbytes / best / 1e6, "seconds": best, "complete": True, "exchanges": done,
                "elapsed": elapsed}
    return {"mbps": moved / max(elapsed, 1e-9) / 1e6, "seconds": elapsed, "complete": False, "exchanges": 0,
            "elapsed": elapsed, "moved": moved}


def pair_test(store: Any, command: dict[str, Any], device: torch.device) -> dict[str, Any]:
    cap = float(command["cap_s"])
    try:
        pair = PairGroup(store, command["tag"], int(command["role"]), cap + 2.0, device)
        return exchange(pair, int(command["bytes"]), int(command["iters"]), cap)
    except Exception as exc:  # the partner never connected, or the link broke: a figure-less reply
        text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        return {"mbps": None, "error": f"rank {command['partner']}: {text}"}


def worker(rank: int, store: Any, timeout: float) -> None:
    """Join, then answer each command in turn until `done`."""
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    store.set(f"join/{rank}", json.dumps({"boot": boot_id(), "pid": os.getpid(), "host": os.uname().nodename}))
    store.add(NEWS, 1)
    print(f"{JOINED} rank={rank}", flush=True)
    seq = 0
    while True:
        key = f"cmd/{rank}/{seq}"
        store.wait([key], timedelta(seconds=timeout))
        command = json.loads(store.get(key))
        if command["op"] == "done":
            return
        if command["op"] == "compute":
            reply = compute_window(float(command["window"]))
        else:
            reply = pair_test(store, command, device)
        store.set(f"res/{rank}/{seq}", json.dumps(reply))
        store.add(NEWS, 1)
        seq += 1


class StoreBoard:
    """coordinate.Board on a torch TCPStore."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def _read(self, key: str) -> dict[str, Any] | None:
        if not self.store.check([key]):
            return None
        value: dict[str, Any] = json.loads(self.store.get(key))
        return value

    def joined(self, rank: int) -> dict[str, Any] | None:
        return self._read(f"join/{rank}")

    def post(self, rank: int, seq: int, command: Any) -> None:
        self.store.set(f"cmd/{rank}/{seq}", json.dumps(command))

    def reply(self, rank: int, seq: int) -> dict[str, Any] | None:
        return self._read(f"res/{rank}/{seq}")

    def news(self) -> int:
        return int(self.store.add(NEWS, 0))


def connect(addr: str, port: int, master: bool, timeout: float) -> Any:
    return dist.TCPStore(addr, port, None, master, timedelta(seconds=timeout), wait_for_workers=False)


def coordinate(addr: str, port: int, world: int, args: argparse.Namespace, backend: str) -> None:
    """Node 0: the store, the coordinator on this thread, this host's own worker on another."""
    store = connect(addr, port, True, args.timeout)
    print(f"{SERVING} {addr}:{port}", flush=True)
    errors: list[BaseException] = []

    def own() -> None:
        try:
            worker(0, connect(addr, port, False, args.timeout), args.timeout)
        except BaseException as exc:  # said below; the others go on without node 0's figures
            errors.append(exc)

    thread = threading.Thread(target=own, name="hostcheck-worker", daemon=True)
    thread.start()
    settings = Settings(args.bytes, args.iters, args.compute_seconds, args.links_budget, backend)
    coordinator = Coordinator(world, StoreBoard(store), settings, progress=lambda line: print(line, flush=True))
    figures = coordinator.run()
    thread.join(timeout=5.0)
    if errors:
        figures = replace(figures, coordinator_host_error=repr(errors[0])[:300])
    print(RESULT + json.dumps(figures.to_json()), flush=True)
    # the store lives until the hosts that joined have read `done` (the others ddpctl stops)
    joined = [r for r in range(1, world) if store.check([f"join/{r}"])]
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and not all(store.check([f"bye/{r}"]) for r in joined):
        time.sleep(0.05)


def main() -> int:
    args = parse_args(sys.argv[1:])
    rank = int(os.environ["DDPCTL_NODE_RANK"])
    world = int(os.environ["DDPCTL_NNODES"])
    addr, _, port = os.environ["DDPCTL_COORDINATOR"].rpartition(":")
    addr = addr.strip("[]")
    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "gloo"
    print(f"{STARTED} rank={rank} store={os.environ['DDPCTL_COORDINATOR']}", flush=True)
    if rank == 0:
        coordinate(addr, int(port), world, args, backend)
        return 0
    try:
        store = connect(addr, int(port), False, args.timeout)
        worker(rank, store, args.timeout)
        store.set(f"bye/{rank}", "1")
    except Exception as exc:  # the coordinator is gone (it named this host late): nothing to add
        print(f"{LATE} rank {rank}: {str(exc).splitlines()[0][:200] if str(exc) else exc!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
