"""Preemption of the image classifier: SIGUSR1 through real torchrun (2 CPU ranks, gloo) stops every
rank at one optimizer step with a checkpoint, and a Slurm restart resumes there, bit-identically."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

from test_train_jobs_torchrun import JOBS, TIMEOUT_S, _env, field, rank_lines, stop_torchrun, torchrun  # noqa: E402

from train_jobs.image_classifier import checkpoint  # noqa: E402
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
    # The workers stopped by themselves, before torchrun's shutdown timeout; torchrun itself exits 1
    # whatever they do (it re-raises the forwarded signal as SignalException).
    assert stopped.seconds < SHUTDOWN_S and "forcefully exiting" not in stopped.output, stopped.output[-3000:]
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
