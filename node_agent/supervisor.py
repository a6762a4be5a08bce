"""Runs torchrun in its own session, records run state, and ends it when the control plane goes.

The control plane is gone when the control channel (stdin) reaches EOF, when no HEARTBEAT line
arrives for `heartbeat_timeout` seconds (a downed link leaves the TCP connection silently open),
or on SIGHUP/SIGTERM/SIGINT. Then the whole job is ended: SIGTERM to torchrun's process group and
to every process carrying DDPCTL_JOB_ID, SIGKILL after the grace period.

A rank that fails ends this host's part at once, without waiting for torchrun or the control
plane (fail fast): the supervisor sees the rank's error record within RANK_POLL_S, SIGKILLs that
rank (its error and its traceback are out already) and SIGTERMs the rest, which alone get the
grace period; the record goes to the control plane, which stops the other hosts meanwhile.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from node_agent.nccl_log import parse_files
from node_agent.protocol import emit_event, write_line
from node_agent.runstate import (
    JOB_ENV,
    NODE_RANK_ENV,
    end_job,
    proc_start_ticks,
    state_dir,
    write_json_atomic,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, List, Optional, Sequence

HEARTBEAT_EVERY = 2.0
TORCHRUN_MODULE = "torch.distributed.run"
RANK_POLL_S = 0.05  # how often the ranks' milestone files are looked for (one listdir)


class Supervisor:
    """One supervised torchrun: its process, its state file, its log, and why it stopped."""

    def __init__(self, request: Dict[str, Any], detached: bool) -> None:
        self.request = request
        self.job_id = str(request["job_id"])
        rank_env = request.get("node_rank_env")  # a scheduler numbers the nodes (Slurm: SLURM_PROCID)
        self.node_rank = int(os.environ[rank_env] if rank_env else request.get("node_rank", 0))
        self.grace = float(request.get("grace", 10.0))
        self.heartbeat_timeout = float(request.get("heartbeat_timeout", 20.0))
        self.detached = detached
        self.dir = state_dir(self.job_id, self.node_rank)
        self.log_path = self.dir / "output.log"
        self.proc: Optional[subprocess.Popen] = None
        self.stop_reason: Optional[str] = None
        self.last_beat = time.monotonic()
        self.stopping = threading.Event()
        self.passthrough = not detached
        self.wrap = bool(request.get("wrap"))
        self.rank_dir = self.dir / "ranks"
        self.rank_records: Dict[str, Dict[str, Any]] = {}  # "<local rank>.<phase>" -> its record

    def argv(self) -> List[str]:
        log_dir = str(self.dir / "torchrun")
        wrapper = [str(self.dir / "rankwrap.py")] if self.wrap else []
        launcher = list(self.request["launcher"])
        if self.wrap and launcher[1:3] == ["-m", TORCHRUN_MODULE]:  # see node_agent/torchrun.py
            launcher[1:3] = [str(self.dir / "bin" / "torchrun")]
        return [*launcher, "--log-dir", log_dir, *wrapper, *list(self.request["program"])]

    def write_wrapper(self) -> None:
        """Each rank starts through node_agent/rankwrap.py and torchrun through
        node_agent/torchrun.py: their sources go next to the run state."""
        (self.dir / "bin").mkdir(exist_ok=True, mode=0o700)  # "torchrun" itself is the log dir
        for module_name, file_name in (("node_agent.rankwrap", "rankwrap.py"),
                                       ("node_agent.torchrun", "bin/torchrun")):
            module = importlib.import_module(module_name)
            source = module.__loader__.get_source(module.__name__)  # type: ignore[union-attr]
            (self.dir / file_name).write_text(source)
        self.rank_dir.mkdir(exist_ok=True, mode=0o700)

    def scan_ranks(self) -> None:
        """Read milestone files not seen yet (started/init/joined/error) and report each once."""
        try:
            names = sorted(os.listdir(str(self.rank_dir)))
        except OSError:
            return
        for name in names:
            if name.endswith(".tmp") or name in self.rank_records:
                continue
            try:
                record = json.loads((self.rank_dir / name).read_text())
            except (OSError, ValueError):
                continue  # being replaced: read it next time
            self.rank_records[name] = record
            if self.passthrough:
                try:
                    emit_event("rank", **record)
                except (BrokenPipeError, OSError):
                    self.passthrough = False
            if record.get("phase") == "error":
                self.rank_failed(record)

    def rank_failed(self, record: Dict[str, Any]) -> None:
        """torchrun runs with --max-restarts 0: one failed rank fails the job. End it here now."""
        if self.proc is None or self.proc.poll() is not None:
            return  # over already (a record first read after torchrun exited)
        pid = record.get("pid")
        self.stop("rank %s failed (%s)" % (record.get("rank", record.get("local_rank")),
                                           record.get("type") or "error"),
                  failed=[int(pid)] if isinstance(pid, int) else [])

    def watch_ranks(self) -> None:
        while self.proc is not None and self.proc.poll() is None:
            self.scan_ranks()
            time.sleep(RANK_POLL_S)

    def env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (self.request.get("env") or {}).items()})
        env[JOB_ENV] = self.job_id
        env[NODE_RANK_ENV] = str(self.node_rank)
        if self.wrap:
            env["DDPCTL_RANK_DIR"] = str(self.rank_dir)
        if self.request.get("nccl_debug"):
            env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET",
                       NCCL_DEBUG_FILE=str(self.dir / "nccl.%h.%p.log"))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def state(self, **extra: Any) -> Dict[str, Any]:
        assert self.proc is not None
        data = {
            "job_id": self.job_id,
            "job_name": self.request.get("job_name"),
            "node_rank": self.node_rank,
            "hostname": socket.gethostname(),
            "pid": self.proc.pid,
            "pgid": self.proc.pid,
            "start_ticks": proc_start_ticks(self.proc.pid),
            "supervisor_pid": os.getpid(),
            "argv": self.argv(),
            "cwd": self.request.get("cwd"),
            "started_at": time.time(),
            "detached": self.detached,
            "log": str(self.log_path),
            "status": "running",
        }
        data.update(extra)
        return data

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.wrap:
            self.write_wrapper()
        self.proc = subprocess.Popen(
            self.argv(), cwd=self.request.get("cwd") or None, env=self.env(),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started = self.state()
        write_json_atomic(self.dir / "state.json", self.started)

    def stop(self, reason: str, force: bool = False, failed: Sequence[int] = ()) -> None:
        """End the job on this host (once; `force` again skips the grace). `failed`: pids of ranks
        that have failed, killed at once."""
        if self.stopping.is_set() and not force:
            return
        self.stopping.set()
        self.stop_reason = self.stop_reason or reason
        assert self.proc is not None
        threading.Thread(target=end_job,
                         args=(self.job_id, self.proc.pid, 0.0 if force else self.grace, self.node_rank,
                               list(failed)),
                         daemon=True).start()

    def forward(self, signum: int, frame: Any) -> None:
        """A batch scheduler's early warning (e.g. SIGUSR1 before the time limit) goes on to
        torchrun, which passes it to every rank (--signals-to-handle)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(self.proc.pid, signum)

    def pump_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(str(self.log_path), "ab", buffering=0) as log:
            for raw in iter(self.proc.stdout.readline, b""):
                log.write(raw)
                if self.passthrough:
                    try:
                        write_line(raw.decode("utf-8", "replace").rstrip("\r\n"))
                    except (BrokenPipeError, OSError):
                        self.passthrough = False
                        self.stop("control connection lost (stdout closed)")

    def read_control(self, control: BinaryIO) -> None:
        for raw in iter(control.readline, b""):
            word = raw.strip().decode("ascii", "replace")
            if word == "HEARTBEAT":
                self.last_beat = time.monotonic()
            elif word == "STOP":
                self.stop("stopped by the control plane")
            elif word == "KILL":
                self.stop("killed by the control plane", force=True)
        self.stop("control connection lost (stdin closed)")

    def watch_heartbeat(self) -> None:
        while self.proc is not None and self.proc.poll() is None:
            if self.heartbeat_timeout > 0 and time.monotonic() - self.last_beat > self.heartbeat_timeout:
                self.stop("no heartbeat from the control plane for %.0fs" % self.heartbeat_timeout)
                return
            try:
                emit_event("heartbeat", pid=self.proc.pid)
            except (BrokenPipeError, OSError):
                self.passthrough = False
                self.stop("control connection lost (stdout closed)")
            time.sleep(HEARTBEAT_EVERY)

    def rank_errors(self) -> List[Dict[str, Any]]:
        """Every rank's error, earliest first: the wrapper's records, and torchelastic's error
        files (from @record) for ranks the wrapper has no record of."""
        errors = [dict(r, timestamp=r.get("time"), file=str(self.rank_dir / name))
                  for name, r in self.rank_records.items() if r.get("phase") == "error"]
        recorded = {e.get("local_rank") for e in errors}
        errors += [e for e in self.error_files() if e["local_rank"] not in recorded]
        return sorted(errors, key=lambda e: e.get("timestamp") or 0.0)

    def error_files(self) -> List[Dict[str, Any]]:
        """torchelastic's error files of this node's ranks (written by scripts that use @record)."""
        errors = []
        for path in (self.dir / "torchrun").glob("**/error.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            message = data.get("message", {})
            extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
            errors.append({
                "local_rank": int(path.parent.name) if path.parent.name.isdigit() else path.parent.name,
                "timestamp": path.stat().st_mtime,
                "message": message.get("message") if isinstance(message, dict) else str(message),
                "traceback": extra.get("py_callstack", ""),
                "file": str(path),
            })
        return errors

    def run(self, control: Optional[BinaryIO]) -> Dict[str, Any]:
        self.start()
        assert self.proc is not None
        emit_event("started", pid=self.proc.pid, pgid=self.proc.pid, state_dir=str(self.dir),
                   log=str(self.log_path), hostname=socket.gethostname())
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, f: self.stop("supervisor got signal %d" % s))
        for name in self.request.get("forward_signals") or ():
            signal.signal(getattr(signal, "SIG" + str(name)), self.forward)
        pump = threading.Thread(target=self.pump_output, daemon=True)
        pump.start()
        if control is not None:
            threading.Thread(target=self.read_control, args=(control,), daemon=True).start()
        if control is not None or self.request.get("batch"):
            threading.Thread(target=self.watch_heartbeat, daemon=True).start()
        if self.wrap:
            threading.Thread(target=self.watch_ranks, daemon=True).start()
        code = self.proc.wait()
        pump.join(10)
        self.scan_ranks()
        if self.stopping.is_set():
            end_job(self.job_id, self.proc.pid, self.grace, self.node_rank)  # stragglers
        errors = self.rank_errors()
        result = {"exit_code": code, "stop_reason": self.stop_reason,
                  "first_error": errors[0] if errors else None, "rank_errors": errors[:32],
                  "state_dir": str(self.dir), "log": str(self.log_path)}
        if self.request.get("nccl_debug"):
            result["nccl"] = parse_files(sorted(self.dir.glob("nccl.*.log")))
        write_json_atomic(self.dir / "state.json", dict(self.started, status="exited",
                                                           ended_at=time.time(), **result))
        return result


def _daemonize(request: Dict[str, Any]) -> Dict[str, Any]:
    """Double-fork a supervisor that outlives this SSH session; return once it has started."""
    sup = Supervisor(request, detached=True)
    state_file = sup.dir / "state.json"
    if os.fork() == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:
            sup.run(control=None)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not state_file.exists():
        time.sleep(0.05)
    data = json.loads(state_file.read_text()) if state_file.exists() else {}
    return {"detached": True, "exit_code": 0 if data else 1, "pid": data.get("pid"),
            "state_dir": str(sup.dir), "log": str(sup.log_path)}


def supervise(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    if request.get("cwd"):  # "~/proj" (a [sync] dest) is the login's home here, as in a shell
        request["cwd"] = os.path.expanduser(str(request["cwd"]))
    cwd = request.get("cwd")
    if cwd and not os.path.isdir(cwd):
        emit_event("error", message="workdir %s does not exist on %s" % (cwd, socket.gethostname()))
        return {"exit_code": 2, "error_kind": "workdir", "stop_reason": "workdir missing: %s" % cwd}
    if request.get("detach"):
        return _daemonize(request)
    sys.stdout.flush()
    # "batch": a scheduler (Slurm) started this node: no control channel (stdin is a file), its
    # signals stop the job, heartbeats still go out with the output
    return Supervisor(request, detached=False).run(None if request.get("batch") else control)
