"""The "slurm_check" op: one Slurm task's facts and its TCP probe of the other tasks, meeting
through files in a shared directory (a Slurm task has no control channel to the orchestrator).

Every task listens on an ephemeral port (task 0 also on a port of the launch's rendezvous range:
base + SLURM_JOB_ID % spread, then the next free one; or, inside a running job, request["master"]
names the job's own store, which every task dials) and writes listen-<rank>.json. Once all
have, it dials every other task's listeners by hostname, as torchrun's c10d store and Gloo do,
writes done-<rank>, gathers the facts op's facts with task 0's hostname as the master address,
and keeps accepting until every task is done. Each wait is bounded by request["wait"]; a task
that never shows up is reported missing, not waited for again.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from pathlib import Path

from node_agent.host.runstate import read_json, write_json_atomic
from node_agent.ops.facts import collect
from node_agent.ops.probe import connect_all, connect_one, open_listeners

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, List, Optional, Tuple

DEFAULT_WAIT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 3.0
POLL_S = 0.1


def _env_int(request: Dict[str, Any], key: str, default_name: str, default: int) -> int:
    value = os.environ.get(str(request.get(key) or default_name), "")
    return int(value) if value.isdigit() else default


def rendezvous_listener(base: int, job_id: int, spread: int,
                        tries: int) -> Tuple[Optional[socket.socket], Dict[str, Any]]:
    """Bind the first free port from base + job_id % spread, as the launch's batch script picks it."""
    start = base + job_id % max(1, spread)
    error = "no port tried"
    for port in range(start, min(65536, start + max(1, tries))):
        sockets, ports = open_listeners([port])
        if ports[0]["port"] is not None:
            return sockets[port], {"purpose": "master_port", "port": port, "error": None}
        error = "ports %d-%d: %s" % (start, port, ports[0]["error"])
    return None, {"purpose": "master_port", "port": None, "error": error}


def _accept_until(sockets: List[socket.socket], stop: threading.Event) -> None:
    """Accept (and close) every connection, so a crowd of dialers never fills the backlog."""
    while not stop.is_set() and sockets:
        readable, _, _ = select.select(sockets, [], [], 0.2)
        for s in readable:
            try:
                conn, _ = s.accept()
                conn.close()
            except OSError:
                continue


def wait_for(paths: Dict[int, Path], deadline: float) -> Dict[int, Dict[str, Any]]:
    """The JSON of each rank's file, polling until all are there or the deadline passes."""
    found: Dict[int, Dict[str, Any]] = {}
    while True:
        for rank, path in paths.items():
            if rank not in found:
                data = read_json(path)
                if data is not None:
                    found[rank] = data
        if len(found) == len(paths) or time.monotonic() >= deadline:
            return found
        time.sleep(POLL_S)


def dial(peers: Dict[int, Dict[str, Any]], rank: int, timeout: float) -> List[Dict[str, Any]]:
    """Connect to every listener of every other rank at once (by its hostname)."""
    targets = [(r, str(p["hostname"]), listener) for r, p in sorted(peers.items()) if r != rank
               for listener in p.get("listeners") or [] if listener.get("port")]
    results = connect_all(["%s:%d" % (host, int(listener["port"])) for _, host, listener in targets], timeout)
    for i, (r, host, listener) in enumerate(targets):  # one result per target, in order
        results[i].update(rank=r, hostname=host, purpose=listener["purpose"], port=int(listener["port"]))
    return results


def dial_master(master: str, peers: Dict[int, Dict[str, Any]], timeout: float) -> Dict[str, Any]:
    """Connect to a running job's rendezvous store (its master port, held by the job itself)."""
    host, _, port = master.rpartition(":")
    owner = next((r for r, p in sorted(peers.items()) if p.get("hostname") == host), 0)
    result = connect_one(master, timeout)
    result.update(rank=owner, hostname=host, purpose="master_port", port=int(port))
    return result


def check(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """The op: listen, meet the other tasks, dial them, gather facts, wait for all to finish."""
    started = time.monotonic()
    rank = _env_int(request, "rank_env", "SLURM_PROCID", 0)
    world = _env_int(request, "world_env", "SLURM_NTASKS", 1)
    shared = Path(str(request["dir"]))
    shared.mkdir(parents=True, exist_ok=True)
    wait = float(request.get("wait") or DEFAULT_WAIT_S)
    hostname = socket.gethostname()
    sockets, ports = open_listeners([0])
    listeners = [{"purpose": "ephemeral", "port": ports[0]["port"], "error": ports[0]["error"]}]
    master = request.get("master")  # "host:port" of a running job's store: dialed, not listened on
    if rank == 0 and not master:
        rdzv, entry = rendezvous_listener(int(request.get("rdzv_base") or 29500),
                                          _env_int(request, "job_env", "SLURM_JOB_ID", 0),
                                          int(request.get("rdzv_spread") or 1000),
                                          int(request.get("rdzv_tries") or 200))
        listeners.append(entry)
        if rdzv is not None:
            sockets[int(entry["port"])] = rdzv
    stop = threading.Event()
    server = threading.Thread(target=_accept_until, args=(list(sockets.values()), stop), daemon=True)
    server.start()
    try:
        write_json_atomic(shared / ("listen-%d.json" % rank),
                          {"rank": rank, "hostname": hostname, "listeners": listeners})
        peers = wait_for({r: shared / ("listen-%d.json" % r) for r in range(world)},
                         time.monotonic() + wait)
        timeout = float(request.get("connect_timeout") or DEFAULT_CONNECT_TIMEOUT_S)
        results = dial(peers, rank, timeout)
        if master:
            results.append(dial_master(str(master), peers, timeout))
        write_json_atomic(shared / ("done-%d.json" % rank), {"rank": rank})
        head = peers.get(0, {}).get("hostname")
        reply = collect(dict(request, master_addr=head), started) if request.get("facts", True) else {}
        done = wait_for({r: shared / ("done-%d.json" % r) for r in peers}, time.monotonic() + wait)
    finally:
        stop.set()
        server.join(1.0)
        for s in sockets.values():
            s.close()
    reply["probe"] = {"rank": rank, "world": world, "hostname": hostname, "head": head, "dir": str(shared),
                      "listeners": listeners, "results": results,
                      "missing": [r for r in range(world) if r not in peers],
                      "late": sorted(r for r in peers if r not in done)}
    return reply
