"""Preemption of the image classifier: SIGUSR1 through real torchrun (2 CPU ranks, gloo) stops every
rank at one optimizer step with a checkpoint, and a Slurm restart resumes there, bit-identically.
A ddpctl restart (DDPCTL_ATTEMPT > 0) resumes too, from DDPCTL_CHECKPOINT_DIR when no
--checkpoint-dir is given, and past a corrupt newest checkpoint (in process: one gloo rank)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from test_train_jobs_torchrun import JOBS, TIMEOUT_S, _env, field, rank_lines, stop_torchrun, torchrun  # noqa: E402

from train_jobs import common  # noqa: E402
from train_jobs.image_classifier import checkpoint, train  # noqa: E402
from train_jobs.image_classifier.train import parse_args  # noqa: E402

pytestmark = pytest.mark.torch

SCRIPT = JOBS / "image_classifier" / "train.py"
SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # what ddpctl's Slurm backend gives torchrun
SHUTDOWN_S = 30.0  # torchrun's default: SIGKILL for workers still alive this long after the signal
SMALL = ("--width", "4", "--train-size", "256", "--test-size", "64", "--batch-size", "16")
PREEMPTED = re.compile(r"^preempted: .*$", re.MULTILINE)


class Lines:
    """A process's output read on a thread, so waiting for a line has a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._seen: list[str] = []
        self._ended = False
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def text(self) -> str:
        return "".join(self._seen)

    def wait_for(self, prefix: str, timeout: float) -> bool:
        """Read until a line starts with prefix (True), the output ends or the deadline passes."""
        deadline = time.monotonic() + timeout
        while not self._ended and (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                return False
            if line is None:
                self._ended = True
                return False
            self._seen.append(line)
            if line.startswith(prefix):
                return True
        return False

    def drain(self, timeout: float) -> str:
        """Everything up to the end of the output (all writers gone), within timeout."""
        self.wait_for("\0never", timeout)
        return self.text()


@dataclass(frozen=True)
class Preempted:
    returncode: int  # torchrun's
    output: str
    seconds: float  # from the signal to torchrun's exit


def start(args: list[str]) -> subprocess.Popen[str]:
    """torchrun as ddpctl's Slurm backend starts it: forwarding SIGUSR1 to every worker."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.Popen(
        [*argv, "--signals-to-handle", SIGNALS, SCRIPT.name, *args],
        cwd=SCRIPT.parent,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def workers(proc: subprocess.Popen[str]) -> dict[int, int]:
    """rank -> pid of torchrun's worker processes."""
    found: dict[int, int] = {}
    for p in psutil.Process(proc.pid).children(recursive=True):
        rank = p.environ().get("RANK")
        if rank is not None:
            found[int(rank)] = p.pid
    return found


def torchrun_only(proc: subprocess.Popen[str]) -> list[int]:
    return [proc.pid]


def rank(n: int) -> Callable[[subprocess.Popen[str]], list[int]]:
    return lambda proc: [workers(proc)[n]]


def preempt(args: list[str], after: str, targets: Callable[[subprocess.Popen[str]], list[int]]) -> Preempted:
    """Start the job, SIGUSR1 the targets once a line starts with `after`, wait for the end."""
    proc = start(args)
    assert proc.stdout is not None
    lines = Lines(proc.stdout)
    try:
        if not lines.wait_for(after, TIMEOUT_S):
            pytest.fail(f"no line starting {after!r}:\n{lines.text()[-3000:]}")
        signalled = time.monotonic()
        for pid in targets(proc):
            os.kill(pid, signal.SIGUSR1)
        returncode = proc.wait(timeout=SHUTDOWN_S + 30)
        seconds = time.monotonic() - signalled
    except (subprocess.TimeoutExpired, psutil.Error, KeyError):
        out = stop_torchrun(proc)
        pytest.fail(f"preempting the job failed:\n{(lines.text() + out)[-3000:]}")
    return Preempted(returncode, lines.drain(30), seconds)


def epoch_figures(output: str) -> list[tuple[str, ...]]:
    """(epoch, loss, acc, train_acc) of every epoch line: what must not depend on an interruption."""
    return re.findall(r"^epoch=(\d+) loss=(\S+) acc=(\S+) .*train_acc=(\S+)", output, re.MULTILINE)


def test_sigusr1_to_torchrun_saves_a_checkpoint_and_a_slurm_restart_resumes_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    ckpt = ["--checkpoint-dir", str(tmp_path / "ck")]
    stopped = preempt([*SMALL, "--epochs", "30", *ckpt], after="epoch=", targets=torchrun_only)
    lines = PREEMPTED.findall(stopped.output)
    assert len(lines) == 1 and lines[0].startswith("preempted: checkpoint saved at epoch="), stopped.output[-3000:]
    epoch = int(lines[0].rsplit("=", 1)[1])
    assert 1 <= epoch < 30  # signalled after epoch 0's line, and well before the end
    assert "final " not in stopped.output and not rank_lines(stopped.output)
    # The workers stopped by themselves, before torchrun's shutdown timeout (past it, torchrun says it
    # is "forcefully exiting" them); torchrun itself exits 1 whatever they do (it re-raises the
    # forwarded signal as SignalException).
    assert "forcefully exiting" not in stopped.output, stopped.output[-3000:]
    assert (tmp_path / "ck" / checkpoint.LAST).is_file()
    assert not list((tmp_path / "ck").glob(".*tmp*"))

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    resumed = torchrun(SCRIPT, *SMALL, "--epochs", str(epoch + 1), *ckpt)
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert f"resumed from checkpoint at epoch={epoch} (restart 1)" in resumed.output.splitlines()
    assert [e for e, *_ in epoch_figures(resumed.output)] == [str(epoch)]
    assert re.search(rf"^final acc=\S+ loss=\S+ epochs={epoch + 1} checksum=\S+$", resumed.output, re.MULTILINE)
    assert [v[4] for v in rank_lines(resumed.output).values()] == ["True", "True"]


def test_sigusr1_to_one_rank_stops_every_rank_and_all_exit_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    stopped = preempt([*SMALL, "--epochs", "30"], after="epoch=", targets=rank(1))
    # torchrun was not signalled: it exits 0 only when every worker did.
    assert stopped.returncode == 0, stopped.output[-3000:]
    assert PREEMPTED.findall(stopped.output) == ["preempted: no --checkpoint-dir, nothing saved"]
    assert "final " not in stopped.output and not rank_lines(stopped.output)
    assert len(epoch_figures(stopped.output)) < 30


def test_resuming_after_preemption_ends_exactly_like_an_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Signalled as training starts, the ranks stop mid-epoch (3 micro-batches a step, 16 an epoch);
    a plain --resume continues there with every rank's RNG and running totals."""
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    job = [*SMALL, "--train-size", "512", "--accum-steps", "3", "--clip-grad", "5.0"]
    ckpt = ["--checkpoint-dir", str(tmp_path / "ck")]
    stopped = preempt([*job, "--epochs", "30", *ckpt], after="data=", targets=rank(0))
    assert stopped.returncode == 0, stopped.output[-3000:]
    lines = PREEMPTED.findall(stopped.output)
    assert len(lines) == 1 and lines[0].startswith("preempted: checkpoint saved at epoch="), stopped.output[-3000:]
    epoch = int(lines[0].rsplit("=", 1)[1])
    saved = checkpoint.load_last(tmp_path / "ck")
    assert saved is not None and saved["sampler"]["next_epoch"] == epoch
    assert saved["sampler"]["batches_done"] % 3 == 0  # at a step boundary (16 micro-batches an epoch)
    epochs = str(max(epoch + 1, 2))

    resumed = torchrun(SCRIPT, *job, "--epochs", epochs, *ckpt, "--resume")
    straight = torchrun(SCRIPT, *job, "--epochs", epochs)
    for run in (resumed, straight):
        assert run.returncode == 0, run.output[-3000:]
    assert f"resumed from checkpoint at epoch={epoch} (restart 0)" in resumed.output.splitlines()
    interrupted = [f for f in epoch_figures(straight.output) if int(f[0]) >= epoch]
    assert epoch_figures(resumed.output) == interrupted
    for key in ("acc", "loss", "checksum"):
        assert field(resumed.output, "final ", key) == field(straight.output, "final ", key)


@pytest.mark.parametrize(
    ("argv", "environ", "restart", "auto_resume"),
    [
        ([], {}, 0, False),
        (["--checkpoint-dir", "ck"], {}, 0, False),
        (["--checkpoint-dir", "ck"], {"SLURM_RESTART_COUNT": "0"}, 0, False),
        (["--checkpoint-dir", "ck"], {"SLURM_RESTART_COUNT": "2"}, 2, True),
        ([], {"SLURM_RESTART_COUNT": "2"}, 2, False),  # nowhere to resume from
        (["--checkpoint-dir", "ck", "--resume"], {}, 0, True),
    ],
)
def test_a_slurm_restart_resumes_only_with_a_checkpoint_dir(
    argv: list[str], environ: dict[str, str], restart: int, auto_resume: bool
) -> None:
    args = parse_args(argv, environ)
    assert (args.restart, args.auto_resume) == (restart, auto_resume)


@pytest.mark.parametrize("bad", ["x", "-1", "1.5"])
def test_a_bad_slurm_restart_count_is_named(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args([], {"SLURM_RESTART_COUNT": bad})
    assert f"SLURM_RESTART_COUNT={bad!r}" in capsys.readouterr().err


PREV_FAILURE = "node1: rank 3 was killed (SIGKILL)"
DDPCTL_VARS = ("DDPCTL_ATTEMPT", "DDPCTL_RUN_ID", "DDPCTL_PREV_FAILURE", "DDPCTL_CHECKPOINT_DIR")


@pytest.mark.parametrize(
    ("argv", "environ", "checkpoint_dir", "auto_resume"),
    [
        ([], {"DDPCTL_CHECKPOINT_DIR": "ck-env"}, Path("ck-env"), False),  # the flag is absent: the env's
        (["--checkpoint-dir", "ck"], {"DDPCTL_CHECKPOINT_DIR": "ck-env"}, Path("ck"), False),  # the flag wins
        ([], {"DDPCTL_CHECKPOINT_DIR": ""}, None, False),
        ([], {"DDPCTL_CHECKPOINT_DIR": "ck-env", "DDPCTL_ATTEMPT": "0"}, Path("ck-env"), False),
        ([], {"DDPCTL_CHECKPOINT_DIR": "ck-env", "DDPCTL_ATTEMPT": "1"}, Path("ck-env"), True),
        (["--checkpoint-dir", "ck"], {"DDPCTL_ATTEMPT": "2"}, Path("ck"), True),
        ([], {"DDPCTL_ATTEMPT": "2"}, None, False),  # nowhere to resume from
        (["--resume"], {"DDPCTL_CHECKPOINT_DIR": "ck-env"}, Path("ck-env"), True),
    ],
)
def test_ddpctl_variables_give_the_checkpoint_dir_and_resume_on_a_restart(
    argv: list[str], environ: dict[str, str], checkpoint_dir: Path | None, auto_resume: bool
) -> None:
    args = parse_args(argv, environ)
    assert (args.checkpoint_dir, args.auto_resume) == (checkpoint_dir, auto_resume)
    assert args.attempt == int(environ.get("DDPCTL_ATTEMPT") or 0)


def test_the_previous_failure_is_read_as_one_line() -> None:
    assert parse_args([], {}).prev_failure is None
    args = parse_args([], {"DDPCTL_ATTEMPT": "1", "DDPCTL_PREV_FAILURE": " node1:\n rank 3  killed "})
    assert args.prev_failure == "node1: rank 3 killed"


@pytest.mark.parametrize("bad", ["x", "-1", "1.5"])
def test_a_bad_ddpctl_attempt_is_named(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args([], {"DDPCTL_ATTEMPT": bad})
    assert f"DDPCTL_ATTEMPT={bad!r}" in capsys.readouterr().err


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[common.DistContext]:
    """This process as the only rank of a gloo group: train.resume runs its collectives for real."""
    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    env = common.DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                         master_addr="127.0.0.1", master_port=0)
    try:
        yield common.DistContext(env=env, device=torch.device("cpu"), backend="gloo")
    finally:
        dist.destroy_process_group()


def _trainer(ctx: common.DistContext, args: train.TrainArgs) -> tuple[torch.nn.Module, torch.optim.Optimizer,
                                                                      torch.amp.GradScaler]:
    ddp = train.build_model(ctx, args)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    return ddp, opt, torch.amp.GradScaler("cpu", enabled=False)


def _first_weight(ddp: torch.nn.Module) -> float:
    return float(next(ddp.module.parameters()).detach().view(-1)[0])


def _save_epochs(ctx: common.DistContext, folder: Path, epochs: list[int], run_id: str | None = None) -> None:
    """A checkpoint after each of `epochs`, the model's weights all set to the epoch number."""
    args = parse_args(["--width", "4", "--checkpoint-dir", str(folder)], {})
    ddp, opt, scaler = _trainer(ctx, args)
    for epoch in epochs:
        with torch.no_grad():
            for p in ddp.module.parameters():
                p.fill_(float(epoch))
        at = checkpoint.Progress(epoch=epoch, totals=checkpoint.zero_totals(ctx.device))
        checkpoint.save_run(ctx, folder, ddp.module, opt, scaler, at, [], args.seed, run_id)


def _resume(ctx: common.DistContext, environ: dict[str, str], *argv: str) -> tuple[checkpoint.Resumed, float]:
    args = parse_args(["--width", "4", *argv], environ)
    ddp, opt, scaler = _trainer(ctx, args)
    return train.resume(ctx, args, ddp, opt, scaler), _first_weight(ddp)


def test_attempt_above_zero_resumes_from_the_env_checkpoint_dir(
    one_rank: common.DistContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ck = tmp_path / "ck"
    _save_epochs(one_rank, ck, [1, 2])
    capsys.readouterr()
    env = {"DDPCTL_CHECKPOINT_DIR": str(ck), "DDPCTL_ATTEMPT": "1", "DDPCTL_PREV_FAILURE": PREV_FAILURE}
    resumed, weight = _resume(one_rank, env)
    assert (resumed.at.epoch, resumed.path, weight) == (2, ck / "last.pt", 2.0)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"resumed from {ck / 'last.pt'} at epoch=2 on attempt 1 after: {PREV_FAILURE}"
    assert not [ln for ln in lines if "warning" in ln]

    # the first attempt starts fresh, as without ddpctl: the checkpoint dir alone resumes nothing
    fresh, weight = _resume(one_rank, {"DDPCTL_CHECKPOINT_DIR": str(ck), "DDPCTL_ATTEMPT": "0"})
    assert (fresh.at.epoch, fresh.path, fresh.history) == (0, None, [])
    assert weight != 2.0
    assert "resume" not in capsys.readouterr().out


def test_attempt_above_zero_without_a_checkpoint_starts_fresh_and_says_why(
    one_rank: common.DistContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ck = tmp_path / "empty"
    resumed, _ = _resume(one_rank, {"DDPCTL_CHECKPOINT_DIR": str(ck), "DDPCTL_ATTEMPT": "2"})
    assert (resumed.at.epoch, resumed.path) == (0, None)
    assert capsys.readouterr().out.splitlines() == [f"resume: no checkpoint in {ck}, starting fresh on attempt 2"]


def test_a_corrupt_newest_checkpoint_falls_back_to_the_older_one(
    one_rank: common.DistContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ck = tmp_path / "ck"
    _save_epochs(one_rank, ck, [1, 2])
    last = ck / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # torn, as a non-atomic save leaves it
    capsys.readouterr()
    resumed, weight = _resume(one_rank, {"DDPCTL_CHECKPOINT_DIR": str(ck), "DDPCTL_ATTEMPT": "1"})
    assert (resumed.at.epoch, resumed.path, weight) == (1, ck / "prev.pt", 1.0)
    out = capsys.readouterr().out.splitlines()
    warnings = [ln for ln in out if ln.startswith("checkpoint: warning: ")]
    assert len(warnings) == 1 and f"{last} is unreadable (" in warnings[0], out
    assert warnings[0].endswith(f"; using {ck / 'prev.pt'}")
    assert out[-1] == f"resumed from {ck / 'prev.pt'} at epoch=1 on attempt 1"  # no DDPCTL_PREV_FAILURE: no "after"


def test_a_restart_of_a_fresh_run_never_resumes_from_an_earlier_runs_checkpoint(
    one_rank: common.DistContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ck = tmp_path / "ck"
    _save_epochs(one_rank, ck, [4, 5], run_id="run-old")  # what an earlier run left there
    capsys.readouterr()
    env = {"DDPCTL_CHECKPOINT_DIR": str(ck), "DDPCTL_ATTEMPT": "1", "DDPCTL_RUN_ID": "run-new"}
    resumed, _ = _resume(one_rank, env)
    assert (resumed.at.epoch, resumed.path) == (0, None)
    out = capsys.readouterr().out.splitlines()
    assert [ln for ln in out if "was saved by run run-old, not by this run run-new" in ln] == out[:2], out
    assert out[-1] == f"resume: no checkpoint in {ck}, starting fresh on attempt 1"

    _save_epochs(one_rank, ck, [1], run_id="run-new")  # this run's attempt 0 got through epoch 0
    resumed, weight = _resume(one_rank, env)
    assert (resumed.at.epoch, resumed.path, weight) == (1, ck / "last.pt", 1.0)
    (ck / "last.pt").write_bytes(b"torn")  # its fallback, prev.pt, is the earlier run's: not taken
    resumed, _ = _resume(one_rank, env)
    assert (resumed.at.epoch, resumed.path) == (0, None)
    capsys.readouterr()

    # --resume asks for whatever the directory holds, as without ddpctl
    resumed, weight = _resume(one_rank, env, "--resume")
    assert (resumed.at.epoch, resumed.path, weight) == (5, ck / "prev.pt", 5.0)


def test_a_ddpctl_restart_under_torchrun_resumes_from_the_env_checkpoint_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SLURM_RESTART_COUNT", *DDPCTL_VARS):
        monkeypatch.delenv(name, raising=False)
    ck = tmp_path / "ck"
    monkeypatch.setenv("DDPCTL_CHECKPOINT_DIR", str(ck))
    monkeypatch.setenv("DDPCTL_ATTEMPT", "0")
    monkeypatch.setenv("DDPCTL_RUN_ID", "image_classifier-run-1")
    first = torchrun(SCRIPT, *SMALL, "--epochs", "1")
    assert first.returncode == 0, first.output[-3000:]
    assert (ck / checkpoint.LAST).is_file() and "resume" not in first.output

    monkeypatch.setenv("DDPCTL_ATTEMPT", "1")
    monkeypatch.setenv("DDPCTL_PREV_FAILURE", PREV_FAILURE)
    second = torchrun(SCRIPT, *SMALL, "--epochs", "2")
    assert second.returncode == 0, second.output[-3000:]
    assert f"resumed from {ck / 'last.pt'} at epoch=1 on attempt 1 after: {PREV_FAILURE}" in second.output.splitlines()
    assert [e for e, *_ in epoch_figures(second.output)] == ["1"]  # epoch 0 was not run again
    assert (ck / checkpoint.PREV).is_file()
    assert checkpoint.load_last(ck)["run_id"] == "image_classifier-run-1"  # type: ignore[index]
