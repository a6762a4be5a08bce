"""Runs torchrun in its own session, records its run state, fails fast on a rank's error, and ends
the job when the control plane goes (docs/architecture.md, "The node supervisor")."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

from node_agent.host.hoststats import ProcReader, cpu_and_rss, gpu_sample, gpu_select
from node_agent.host.lines import whole_lines
from node_agent.host.procfs import read_stat
from node_agent.host.runstate import (
    JOB_ENV,
    NODE_RANK_ENV,
    JobScan,
    end_job,
    proc_start_ticks,
    read_json,
    write_json_atomic,
)
from node_agent.rank.torchrun import STOPPING, record_killed
from node_agent.runtime.attach import listen, serve
from node_agent.runtime.attempt_mark import claim
from node_agent.runtime.checkpoints import CheckpointWatch
from node_agent.runtime.metrics_file import JobLabels, MetricsFile, job_text, sweep
from node_agent.runtime.nccl_log import parse_files
from node_agent.runtime.programs import module_source, write_program, write_source
from node_agent.runtime.quiet import QuietSignalTracebacks
from node_agent.runtime.ranklogs import RankLogs
from node_agent.runtime.records import is_rank_record, rank_error, rank_message, sample_message
from node_agent.runtime.uplink import Sink, Uplink
from node_agent.wire.layout import (
    DOWN_MARK,
    PROGRAM_DIR,
    PROGRAM_DIR_ENV,
    STOPPED_BY_DOWN,
    STOPPED_BY_SIGNAL,
    node_state_dir,
)
from node_agent.wire.protocol import emit_event
from node_agent.wire.replies import wire
from node_agent.wire.replies_run import RANK_ENDS, DetachedStart, NcclChoice, RankError, SuperviseResult
from node_agent.wire.replies_top import GpuStat, HostSample
from node_agent.wire.requests import SuperviseRequest, read

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, List, Optional, Sequence, Set, Tuple

TORCHRUN_MODULE = "torch.distributed.run"
RANK_POLL_S = 0.05  # how often the ranks' milestone files are looked for (one listdir)
WATCH_EVERY = 0.5  # how often the watchdog looks at the last heartbeat
READ_CHUNK = 1 << 16
CHECKPOINT_ENV = "DDPCTL_CHECKPOINT_DIR"  # [restart] checkpoint_dir, as the ranks get it
ATTEMPT_ENV = "DDPCTL_ATTEMPT"  # which attempt of its run a job is (orchestrator/launch/plan.py)


class Supervisor:
    """One supervised torchrun: its process, its state file, its log, and why it stopped."""

    def __init__(self, request: SuperviseRequest, detached: bool) -> None:
        self.request = request
        self.job_id = request.job_id
        rank_env = request.node_rank_env
        self.node_rank = int(os.environ[rank_env]) if rank_env else request.node_rank
        self.grace = float(request.grace)
        self.heartbeat_timeout = float(request.heartbeat_timeout)
        self.detached = detached
        self.dir = node_state_dir(self.job_id, self.node_rank)
        self.log_path = self.dir / "output.log"
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.stop_reason: Optional[str] = None
        self.stopped_at: Optional[float] = None  # someone else stopped it (`ddpctl down`, a signal), then
        self.quiet = QuietSignalTracebacks()  # torchrun's own output, less its SignalException tracebacks
        self.last_beat = time.monotonic()
        self.stopping = threading.Event()
        self.aborted = False  # the job failed: torchrun was killed with its failed rank (stop)
        self.wrap = request.wrap
        self.rank_dir = self.dir / "ranks"
        self.rank_records: Dict[str, Dict[str, Any]] = {}  # "<local rank>.<phase>" -> its record
        self.read_mtimes: Dict[str, int] = {}  # "<local rank>.<phase>" -> its mtime when last read
        self.checkpoints: Optional[CheckpointWatch] = None  # [restart] checkpoint_dir, where the job has one
        self.uplink: Optional[Uplink] = None
        self.attach_path: Optional[str] = None
        self.log_lock = threading.Lock()
        self.log_end = 0
        self.log: Any = None
        self.index: Any = None
        self.stragglers: Set[int] = set()  # local ranks `ddpctl up` names stragglers now (STRAGGLER words)
        self.gpus: Tuple[Tuple[GpuStat, ...], Optional[Tuple[str, ...]]] = ((), None)  # the last sample, its selection
        self.over = threading.Event()  # torchrun has exited...
        self.ended_at: Optional[float] = None  # ...at this time.time()
        self.metrics = MetricsFile(request.metrics_dir, self.job_id, self.node_rank) if request.metrics_dir else None

    def argv(self) -> List[str]:
        log_dir = str(self.dir / "torchrun")
        wrapper = [str(self.dir / "rankwrap.py")] if self.wrap else []
        launcher = list(self.request.launcher)
        if self.wrap and launcher[1:3] == ["-m", TORCHRUN_MODULE]:  # see node_agent/rank/torchrun.py
            launcher[1:3] = [str(self.dir / "bin" / "torchrun")]
        return [*launcher, "--log-dir", log_dir, *wrapper, *self.request.program]

    def write_wrapper(self) -> None:
        """Each rank starts through node_agent/rank/rankwrap.py and torchrun through
        node_agent/rank/torchrun.py: their sources go next to the run state."""
        (self.dir / "bin").mkdir(exist_ok=True, mode=0o700)  # "torchrun" itself is the log dir
        for module_name, file_name in (("node_agent.rank.rankwrap", "rankwrap.py"),
                                       ("node_agent.rank.torchrun", "bin/torchrun")):
            write_source(self.dir / file_name, module_source(module_name)[1])
        self.rank_dir.mkdir(exist_ok=True, mode=0o700)

    def scan_ranks(self) -> None:
        """Read milestone files not seen yet (started/init/joined/error) and report each once."""
        try:
            names = sorted(os.listdir(str(self.rank_dir)))
        except OSError:
            return
        for name in names:
            mtime = self._unread(name) if is_rank_record(name) else None
            if mtime is None:
                continue  # not a rank's record (a dump request, the dumps folder), or read already
            try:
                record = json.loads((self.rank_dir / name).read_text())
            except (OSError, ValueError):
                continue  # being replaced: read it next time
            self.read_mtimes[name] = mtime
            self.rank_records[name] = record
            if self.uplink is not None:
                self.uplink.message(rank_message(record))
            if record.get("phase") == "error":
                self.rank_failed(record)
        if self.proc is not None and self.proc.poll() is None:
            self.record_killed_ranks()

    def record_killed_ranks(self) -> None:
        """A rank whose process is a zombie that a signal ended (torchrun has not reaped it yet):
        its `ended` record (node_agent/rank/torchrun.py writes the same once it has reaped it)."""
        if self.stopping.is_set():
            return
        for name, started in list(self.rank_records.items()):
            local = name[:-len(".started")]
            if not name.endswith(".started") or not isinstance(started.get("pid"), int) or \
                    local + ".error" in self.rank_records or local + ".ended" in self.rank_records:
                continue  # told already: no /proc read every poll for it
            stat = read_stat(int(started["pid"]))
            if stat is not None and stat.killed_by:
                record_killed(str(self.rank_dir), int(started.get("local_rank", 0)), int(started["pid"]),
                              stat.killed_by, "supervisor")

    def _unread(self, name: str) -> Optional[int]:
        """The mtime of a record not read yet, or of a `step` record rewritten since it was read
        (the others are written once); None: nothing new in it."""
        if name in self.rank_records and not name.endswith(".step"):
            return None
        try:
            mtime = os.stat(str(self.rank_dir / name)).st_mtime_ns
        except OSError:
            return None
        return None if self.read_mtimes.get(name) == mtime else mtime

    def steps(self) -> Optional[int]:
        """The most optimizer steps any rank of this node took (None: no rank stepped or said)."""
        counts = [step for step in (r.get("step") for r in list(self.rank_records.values())) if isinstance(step, int)]
        return max(counts) if counts else None

    def checkpoint_dir(self) -> Optional[str]:
        where = self.request.env.get(CHECKPOINT_ENV)
        if not where:
            return None
        return os.path.join(self.request.cwd or ".", os.path.expanduser(where))

    def attempt(self) -> int:
        """This node's attempt of its run (DDPCTL_ATTEMPT; 0 for a job without restarts)."""
        try:
            return int(self.request.env.get(ATTEMPT_ENV, 0))
        except (TypeError, ValueError):
            return 0

    def replay(self) -> List[bytes]:
        """What a re-attached control plane gets again (it keeps each once): every rank milestone and
        the newest checkpoint seen, built as they were sent live."""
        ranks = [rank_message(record) for record in list(self.rank_records.values())]
        return ranks + (self.checkpoints.replay() if self.checkpoints is not None else [])

    def rank_failed(self, record: Dict[str, Any]) -> None:
        """torchrun runs with --max-restarts 0: one failed rank fails the job. End it here now."""
        if self.proc is None or self.proc.poll() is not None:
            return  # over already (a record first read after torchrun exited)
        pid = record.get("pid")
        self.stop("rank %s failed (%s)" % (record.get("rank", record.get("local_rank")),
                                           record.get("type") or "error"),
                  failed=[int(pid)] if isinstance(pid, int) else [], abort=True)

    def env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env.update(self.request.env)
        env[JOB_ENV] = self.job_id
        env[NODE_RANK_ENV] = str(self.node_rank)
        if self.wrap:
            env["DDPCTL_RANK_DIR"] = str(self.rank_dir)
        if self.request.modules:
            env[PROGRAM_DIR_ENV] = str(self.dir / PROGRAM_DIR)
        if self.request.nccl_debug:
            env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET",
                       NCCL_DEBUG_FILE=str(self.dir / "nccl.%h.%p.log"))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def state(self, **extra: Any) -> Dict[str, Any]:
        assert self.proc is not None
        data = {
            "job_id": self.job_id,
            "job_name": self.request.job_name or None,
            "run_id": self.request.run_id or None,  # the same for every attempt of a restarted job
            "node_rank": self.node_rank,
            "hostname": socket.gethostname(),
            "pid": self.proc.pid,
            "pgid": self.proc.pid,
            "start_ticks": proc_start_ticks(self.proc.pid),
            "supervisor_pid": os.getpid(),
            "argv": self.argv(),
            "cwd": self.request.cwd or None,
            "started_at": time.time(),
            "detached": self.detached,
            "log": str(self.log_path),
            "attach": self.attach_path,
            "status": "running",
        }
        data.update(extra)
        return data

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.wrap:
            self.write_wrapper()
        if self.request.modules:  # an inline program: its modules, from the agent's own copy
            write_program(self.dir / PROGRAM_DIR, self.request.modules)
        # both closed by run() once torchrun and its output's readers are done (append() from two threads)
        self.log = open(str(self.log_path), "ab", buffering=0)  # noqa: SIM115
        self.index = open(str(self.dir / "output.idx"), "ab", buffering=0)  # noqa: SIM115
        self.log_end = os.fstat(self.log.fileno()).st_size
        self.proc = subprocess.Popen(
            self.argv(), cwd=self.request.cwd or None, env=self.env(),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self, reason: str, force: bool = False, failed: Sequence[int] = (), abort: bool = False) -> None:
        """End the job on this host (once; `force` again skips the grace). `failed`: pids of ranks
        that have failed, killed at once. `abort`: the job has failed (here or on another host), so
        torchrun is killed at once too and only the ranks get the grace period: on SIGTERM torchrun
        passes SIGTERM on to the ranks, which get it from here anyway, and prints a SignalException
        traceback that says nothing about the cause, for about 0.15 s of CPU per host. A stop
        without a failure (Ctrl-C, `down`) leaves torchrun its SIGTERM: a rank saving on SIGTERM
        may still need the rendezvous store torchrun serves on the master."""
        if self.stopping.is_set() and not force:
            return
        self.record_killed_ranks()  # what ended a rank before we end the rest
        with contextlib.suppress(OSError):
            (self.dir / STOPPING).touch()  # from now on, a rank ended by a signal is ours
        self.stopping.set()
        self.stop_reason = self.stop_reason or reason
        assert self.proc is not None
        if abort:
            self.aborted = True
            failed = [*failed, self.proc.pid]
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

    def append(self, data: bytes) -> None:
        """Whole lines into the node's log (and the chunk's end and time into the index); the
        uplink sends them from there. From the pump and the rank files' reader; never touches
        the network."""
        with self.log_lock:
            if self.log.closed:  # a straggler holding torchrun's stdout after the end
                return
            self.log.write(data)
            self.log_end += len(data)
            self.index.write(b"%d %.3f\n" % (self.log_end, time.time()))
            if self.uplink is not None:
                self.uplink.grew(self.log_end)

    def pump_output(self) -> None:
        """torchrun's own output (its ranks' is in their files: watch_ranks), whole lines at a time."""
        assert self.proc is not None and self.proc.stdout is not None
        quiet = self.quiet
        for data in whole_lines(functools.partial(os.read, self.proc.stdout.fileno(), READ_CHUNK)):
            kept = quiet.feed(data)
            if kept:
                self.append(kept)
        rest = quiet.flush()
        if rest:
            self.append(rest)

    def watch_ranks(self) -> None:
        """Every RANK_POLL_S while torchrun runs: each rank's output from the files torchrun writes
        it to (node_agent/runtime/ranklogs.py), then, wrapped, its milestone files (a failed rank's
        traceback is in its file before its error record is: it reaches the log first). After
        torchrun has ended, the output files to their end; then they are removed, the log
        holding every line (torchrun's error.json files stay for rank_errors)."""
        ranks = RankLogs(str(self.dir / "torchrun"), self.append)
        try:
            while self.proc is not None and self.proc.poll() is None:
                ranks.poll()
                if self.wrap:
                    self.scan_ranks()
                time.sleep(RANK_POLL_S)
            ranks.poll(final=True)
            with self.log_lock:
                kept = not self.log.closed  # else append() dropped the last lines: the files stay
            if kept:
                ranks.discard()  # the node's log holds every line now: the output is kept once
        finally:
            ranks.close()

    def read_control(self, control: Any, sink: Optional[Sink]) -> None:
        """Control words from one session (the first, or a re-attached one). A word counts from
        any session; its EOF only from the current one (an old channel closing is no news)."""
        for raw in iter(control.readline, b""):
            word = raw.strip().decode("ascii", "replace")
            if word == "HEARTBEAT":
                self.last_beat = time.monotonic()
            elif word == "STOP":
                self.stop("stopped by the control plane")
            elif word == "ABORT":
                self.stop("stopped by the control plane: the job failed", abort=True)
            elif word == "KILL":
                self.stop("killed by the control plane", force=True)
            elif word.startswith("STRAGGLER "):
                self.flag_straggler(word.split()[1:])
        if sink is None or self.uplink is None or self.uplink.is_current(sink):
            self.stop("control connection lost (%s closed)" % ("stdin" if sink is None or sink.sock is None
                                                                else sink.name))

    def flag_straggler(self, words: List[str]) -> None:
        """`STRAGGLER <local rank> <1|0>`: `ddpctl up` names one of this node's ranks a straggler, or
        back to pace (the textfile's ddpctl_rank_straggler)."""
        if len(words) == 2 and words[0].isdigit() and words[1] in ("0", "1"):
            (self.stragglers.add if words[1] == "1" else self.stragglers.discard)(int(words[0]))

    def metrics_text(self, exit_code: Optional[int] = None) -> str:
        labels = JobLabels(socket.gethostname(), self.request.job_name or self.job_id,
                           self.request.run_id or self.job_id, self.job_id, self.node_rank, self.attempt())
        ended = self.ended_at if self.over.is_set() else None
        return job_text(labels, float(self.started["started_at"]), dict(self.rank_records), set(self.stragglers),
                        self.gpus[0], self.gpus[1], ended, exit_code)

    def watch_metrics(self) -> None:
        """Every [metrics] every seconds while torchrun runs: the job's series into node_exporter's
        textfile directory (node_agent/runtime/metrics_file.py); run() writes the last one."""
        assert self.metrics is not None
        sweep(self.metrics.directory, float(self.request.metrics_keep), socket.gethostname())
        every = max(float(self.request.metrics_every), 0.1)
        while not self.over.is_set() and self.metrics.write(self.metrics_text()):
            self.over.wait(every)

    def watch_heartbeat(self) -> None:
        """Ends the job when the control plane has not been heard for heartbeat_timeout. Reads
        one timestamp: no lock, no write, so nothing the ranks print can hold it up."""
        while self.proc is not None and self.proc.poll() is None:
            if time.monotonic() - self.last_beat > self.heartbeat_timeout:
                self.stop("no heartbeat from the control plane for %.0fs" % self.heartbeat_timeout)
                return
            time.sleep(WATCH_EVERY)

    def attached(self, reader: Any, sink: Sink, offset: int) -> None:
        """A re-attached session (node_agent/runtime/attach.py): it is the sink from `offset` on, and its
        lines are control words."""
        self.last_beat = time.monotonic()
        if self.uplink is not None:
            self.uplink.attach(sink, offset)
        with contextlib.suppress(OSError, ValueError):
            self.read_control(reader, sink)

    def rank_errors(self) -> List[RankError]:
        """Every rank's error, earliest first: the wrapper's records, and torchelastic's error
        files (from @record) for ranks the wrapper has no record of."""
        errors = [rank_error(r, str(self.rank_dir / name))
                  for name, r in self.rank_records.items() if r.get("phase") in RANK_ENDS]
        recorded = {e.local_rank for e in errors}
        errors += [e for e in self.error_files() if e.local_rank not in recorded]
        return sorted(errors, key=lambda e: e.timestamp or 0.0)

    def error_files(self) -> List[RankError]:
        """torchelastic's error files of this node's ranks (written by scripts that use @record)."""
        errors = []
        for path in (self.dir / "torchrun").glob("**/error.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            message = data.get("message", {})
            extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
            errors.append(RankError(
                local_rank=int(path.parent.name) if path.parent.name.isdigit() else path.parent.name,
                timestamp=path.stat().st_mtime,
                message=str(message.get("message") or "") if isinstance(message, dict) else str(message),
                traceback=str(extra.get("py_callstack") or ""),
                file=str(path),
            ))
        return errors

    def watch_host(self) -> None:
        """Every `sample_every` seconds while torchrun runs: the host's GPUs (nvidia-smi's query, with
        the job's CUDA_VISIBLE_DEVICES to pick its own) and its processes' CPU and memory, sent as a `sample`
        event (orchestrator/watch/ finds an idle GPU or creeping memory in them). A host without
        nvidia-smi is asked once."""
        every = float(self.request.sample_every)
        if every <= 0 or (self.uplink is None and self.metrics is None) or self.proc is None:
            return
        reader = ProcReader()
        select = gpu_select(self.request.env)
        gpus_here = True
        scan = JobScan(self.job_id, self.node_rank)  # reads only the environments of new pids
        before = reader.sample(scan())
        then = time.monotonic()
        while not self.stopping.wait(every) and self.proc.poll() is None:
            after = reader.sample(scan())
            now = time.monotonic()
            cpu, rss = cpu_and_rss(before, after, now - then)
            before, then = after, now
            if not after:
                continue  # its processes are gone (the job is ending): nothing to say
            if gpus_here:
                gpus = gpu_sample()
                gpus_here = bool(gpus.nvidia_smi)
                sampled = HostSample(cpu, rss, tuple(gpus.gpus), gpus.error, select, len(after))
                self.gpus = (tuple(gpus.gpus), select)
            else:
                sampled = HostSample(cpu, rss, processes=len(after))
            if self.uplink is not None:
                self.uplink.message(sample_message(sampled))

    def _thread(self, target: Any, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        return thread

    def run(self, control: Optional[BinaryIO], sink: Optional[Sink] = None) -> Dict[str, Any]:
        """Run torchrun to its end. `control`: the session's control channel (None: detached, or a
        batch job's node); `sink`: where output and events go (None: nowhere, detached)."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        listener = listen(str(self.dir)) if control is not None else None
        self.attach_path = listener.getsockname() if listener is not None else None
        checkpoints = self.checkpoint_dir()
        if checkpoints:  # before any rank starts: an older attempt's rank still running sees it is stale
            self.checkpoints = CheckpointWatch(checkpoints)
            claim(checkpoints, self.request.run_id or None, self.attempt())
        self.start()
        assert self.proc is not None
        self.started = self.state()
        write_json_atomic(self.dir / "state.json", self.started)
        if sink is not None:
            self.uplink = Uplink(str(self.log_path), commit=control is not None, on_lost=self.stop,
                                 heard=(lambda: time.monotonic() - self.last_beat) if control is not None else None,
                                 replay=self.replay)
            self.uplink.attach(sink, 0)
            self.uplink.event("started", pid=self.proc.pid, pgid=self.proc.pid, state_dir=str(self.dir),
                              log=str(self.log_path), hostname=socket.gethostname())
            self._thread(self.uplink.run)
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, f: self.stop("supervisor got signal %d" % s))
        for name in self.request.forward_signals:
            signal.signal(getattr(signal, "SIG" + name), self.forward)
        pump = self._thread(self.pump_output)
        ranks = self._thread(self.watch_ranks)
        if control is not None:
            self._thread(self.read_control, control, sink)
        if listener is not None:
            self._thread(serve, listener, self.attached)
        if (control is not None or self.request.batch) and self.heartbeat_timeout > 0:
            self._thread(self.watch_heartbeat)
        self._thread(self.watch_host)
        if self.checkpoints is not None and self.uplink is not None:
            self._thread(self.checkpoints.watch, self.stopping, lambda: not self.over.is_set(), self.steps,
                         self.uplink.message)
        metrics = self._thread(self.watch_metrics) if self.metrics is not None else None
        code = self.proc.wait()
        self.ended_at = time.time()
        self.over.set()
        if self.aborted and code == -signal.SIGKILL:
            code = 1  # as torchrun itself exits when a rank fails
        pump.join(10)
        down = read_json(self.dir / DOWN_MARK)
        if down is not None:  # someone else's action, not a failure: a restarting control plane must know
            at = down.get("at") if isinstance(down.get("at"), (int, float)) else None
            self.stopped_at = at
            when = " at %s" % time.strftime("%H:%M:%S", time.localtime(at)) if at is not None else ""
            self.stop_reason = "%s (%s%s)" % (STOPPED_BY_DOWN, down.get("by") or "someone", when) + \
                (": " + self.stop_reason if self.stop_reason else "")
        elif self.quiet.signalled and not self.stopping.is_set():  # torchrun killed by hand, not by us
            self.stopped_at = self.quiet.signalled_at
            self.stop_reason = "%s on %s (%s)" % (STOPPED_BY_SIGNAL, socket.gethostname(), self.quiet.signalled)
        ranks.join(30)
        self.log.close()
        self.index.close()
        if self.uplink is not None:
            self.uplink.log_finished()
        self.scan_ranks()
        if self.stopping.is_set():
            end_job(self.job_id, self.proc.pid, self.grace, self.node_rank)  # stragglers
        errors = self.rank_errors()
        checkpointed, after = self.checkpoints.at_end() if self.checkpoints is not None else (False, None)
        nccl = parse_files(sorted(self.dir.glob("nccl.*.log"))) if self.request.nccl_debug else None
        result = wire(SuperviseResult(
            exit_code=code, stop_reason=self.stop_reason, first_error=errors[0] if errors else None,
            nccl=None if nccl is None else NcclChoice(**{k: tuple(str(v) for v in nccl.get(k) or ()) for k in (
                "files", "networks", "interfaces", "bootstrap", "transports")}),
            error=None, log=str(self.log_path), rank_errors=tuple(errors[:32]), steps=self.steps(),
            checkpointed=checkpointed,
            state_dir=str(self.dir), stopped_at=self.stopped_at, newest_checkpoint=after))
        write_json_atomic(self.dir / "state.json", dict(self.started, status="exited",
                                                           ended_at=time.time(), **result))
        if self.metrics is not None and metrics is not None:
            metrics.join(5)
            if self.metrics.write(self.metrics_text(code)):  # the job has ended, then the file goes
                self.metrics.remove_later(float(self.request.metrics_keep))
        if self.uplink is not None:  # a control plane cut off may still re-attach to read the end
            self.uplink.finish(result, max(self.heartbeat_timeout, 10.0))
        if listener is not None:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(str(self.attach_path))
        return dict(result, _sent=self.uplink is not None)


def _daemonize(request: SuperviseRequest) -> Dict[str, Any]:
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
    return wire(DetachedStart(pid=data.get("pid"), state_dir=str(sup.dir), log=str(sup.log_path),
                              exit_code=0 if data else 1))


def supervise(wired: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    request = read(SuperviseRequest, wired)
    if request.cwd:  # "~/proj" (a [sync] dest) is the login's home here, as in a shell
        request = replace(request, cwd=os.path.expanduser(request.cwd))
    cwd = request.cwd
    if cwd and not os.path.isdir(cwd):
        emit_event("error", message="workdir %s does not exist on %s" % (cwd, socket.gethostname()))
        return dict(wire(SuperviseResult(exit_code=2, stop_reason="workdir missing: %s" % cwd, first_error=None,
                                         nccl=None, error=None, log=None)), error_kind="workdir")
    if request.detach:
        return _daemonize(request)
    sys.stdout.flush()  # from here on the uplink alone writes to stdout
    # "batch": a scheduler (Slurm) started this node: no control channel (stdin is a file), its
    # signals stop the job, heartbeats still go out with the output
    sink = Sink("stdout", fd=sys.stdout.fileno())
    return Supervisor(request, detached=False).run(None if request.batch else control, sink)
