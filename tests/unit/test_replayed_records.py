"""Issue 54: what a node sends about its job decodes the same whichever path it takes. Every record
the node can emit (each rank phase the rank wrapper writes, the `ended` record of a killed rank, the
supervisor's checkpoint, sample and supervise result) is built as the node builds it: the real rank
wrapper (node_agent/rank/rankwrap.py, over a stand-in torch that has only the hooks it wraps) and the
real supervisor (a supervise op on this machine). It is then read back live (the supervise op's
stream), relayed to a re-attached session (the supervisor's own replay) and replayed from disk after
the supervisor ended (the attach op, node_agent/runtime/attach.py `_replay`), each decoded with the
control plane's decoder (orchestrator/launch/backends/node_messages.py), and compared."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import node_agent.rank.rankwrap as rankwrap
from inventory import LOCALHOST
from node_agent.rank.torchrun import record_killed
from node_agent.runtime.supervisor import Supervisor
from node_agent.runtime.uplink import Uplink
from node_agent.wire.requests import SuperviseRequest, read
from orchestrator.launch.backends.node_messages import NodeMessages
from orchestrator.launch.events import BackendEvent, Checkpointed, Milestone, Notice, Sampled
from orchestrator.remote.agent import AgentEvent, AgentResult, AgentStream, Batched, decode_chunk, start_agent
from orchestrator.remote.transport import LocalTransport
from orchestrator.remote.wire import RankPhase, SuperviseResult

JOB = "replayed-1"
PROTOCOL_ONLY = ("out", "attached", "heartbeat")  # the link's own events, not a record of the job

# A stand-in torch: the modules and hooks the rank wrapper wraps, nothing else (a real one costs
# seconds to import here).
FAKE_TORCH = {
    "torch/__init__.py": "",
    "torch/distributed/__init__.py": "from torch.distributed.distributed_c10d import init_process_group\n",
    "torch/distributed/distributed_c10d.py": "def init_process_group(*args, **kwargs):\n    return None\n",
    "torch/optim/__init__.py": "from torch.optim.optimizer import Optimizer as SGD\n",
    "torch/optim/optimizer.py": textwrap.dedent("""\
        HOOKS = []
        def register_optimizer_step_post_hook(hook):
            HOOKS.append(hook)
        class Optimizer:
            def step(self):
                for hook in HOOKS:
                    hook(self, (), {})
        """),
    "torch/nn/__init__.py": "",
    "torch/nn/parallel/__init__.py": "from torch.nn.parallel.distributed import DistributedDataParallel\n",
    "torch/nn/parallel/distributed.py": textwrap.dedent("""\
        import time
        class DistributedDataParallel:
            def __init__(self):
                self.data = {"iteration": -1}
            def _set_ddp_runtime_logging_sample_rate(self, rate):
                pass
            def __call__(self):
                start = time.time_ns()
                self.data = {"iteration": self.data["iteration"] + 1, "forward_compute_time_start": start,
                             "forward_compute_time": 1000000, "backward_compute_time": 2000000,
                             "backward_compute_time_end": start + 3000000, "backward_comm_time_end": start + 4000000}
            def _get_ddp_logging_data(self):
                return dict(self.data)
        """),
}

# A rank: joins, builds a DDP model, takes `steps` optimizer steps, then ends as `how` says.
RANK = textwrap.dedent("""\
    import sys, time
    import torch.distributed as dist
    import torch.optim
    from torch.nn.parallel import DistributedDataParallel
    how, steps = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    model, opt = DistributedDataParallel(), torch.optim.SGD()
    for _ in range(steps):
        model()
        time.sleep(0.01)
        opt.step()
    if how == "raise":
        raise ValueError("no good after its steps")
    if how == "exit":
        sys.exit(3)
    if how == "hang":
        print("hanging", flush=True)
        time.sleep(60)
    """)

# torchrun's stand-in: a checkpoint written, then (once the test has heard the supervisor's checkpoint
# and sample messages: the GO file) the ranks' records appear, as they would one by one; the
# supervisor ends it when it reads the failed rank's record.
LAUNCHER = textwrap.dedent("""\
    import os, sys, time
    with open(os.path.join(os.environ["CKPT"], "model.pt"), "w") as f:
        f.write("weights")
    deadline = time.monotonic() + 30
    while not os.path.exists(os.environ["GO"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    staged, ranks = os.environ["STAGED"], os.environ["DDPCTL_RANK_DIR"]
    for name in sorted(os.listdir(staged)):
        os.replace(os.path.join(staged, name), os.path.join(ranks, name))
    time.sleep(30)
    """)


@dataclass
class Heard:
    """What the control plane makes of one path's messages."""

    phases: list[RankPhase] = field(default_factory=list)
    events: list[BackendEvent] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    result: SuperviseResult | None = None

    def key(self) -> list[str]:
        """The phases, in an order that does not depend on the path's."""
        return sorted(json.dumps(repr(p)) for p in self.phases)


def hear(batches: Iterable[list[Batched]]) -> Heard:
    heard = Heard()
    messages = NodeMessages("node0", lambda event: heard.notices.append(event.text)
                            if isinstance(event, Notice) else None)
    for batch in batches:
        for message in batch:
            if isinstance(message, AgentResult):
                heard.result = messages.result(message)
            elif isinstance(message, AgentEvent) and message.name not in PROTOCOL_ONLY:
                event = messages.event(message)
                if isinstance(event, Milestone):
                    heard.phases.append(event.phase)
                elif event is not None:
                    heard.events.append(event)
    return heard


def stage_records(tmp_path: Path) -> Path:
    """Each rank's records as the rank wrapper (and torchrun's shim, for a killed rank) writes them."""
    torch_dir, staged = tmp_path / "faketorch", tmp_path / "staged"
    for name, text in FAKE_TORCH.items():
        (torch_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (torch_dir / name).write_text(text)
    staged.mkdir()
    (tmp_path / "rank.py").write_text(RANK)
    env = {**os.environ, "PYTHONPATH": str(torch_dir), "DDPCTL_RANK_DIR": str(staged), "DDPCTL_TOTAL_STEPS": "100"}

    def rank(local: int, *argv: str, global_rank: int | None = None) -> subprocess.Popen[bytes]:
        number = {"LOCAL_RANK": str(local), **({"RANK": str(global_rank)} if global_rank is not None else {})}
        return subprocess.Popen([sys.executable, rankwrap.__file__, *argv], env={**env, **number}, cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    script = str(tmp_path / "rank.py")
    for local, argv in ((0, ("ok", "5")), (1, ("raise", "3")), (2, ("exit", "1"))):
        assert rank(local, script, *argv, global_rank=local).wait(60) in (0, 1, 3)
    assert rank(3, str(tmp_path / "missing.py")).wait(60) == 2  # no RANK: the wrapper does not know it
    hung = rank(4, script, "hang", "2", global_rank=4)
    assert hung.stdout is not None and hung.stdout.readline() == b"hanging\n"
    hung.kill()
    hung.wait(10)
    record_killed(str(staged), 4, hung.pid, signal.SIGKILL, "torchrun")  # as torchrun's shim, having reaped it
    (staged / "dump.request").write_text("token-1")  # not records: left out on every path
    (staged / "dumps").mkdir()
    (staged / "5.step.tmp").write_text('{"phase": "st')
    return staged


def supervise_request(tmp_path: Path, staged: Path) -> dict[str, Any]:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    return {"job_id": JOB, "job_name": "replayed", "node_rank": 0, "launcher": [sys.executable, "launcher.py"],
            "program": ["rank.py"], "cwd": str(tmp_path), "grace": 2.0, "heartbeat_timeout": 0, "wrap": True,
            "sample_every": 0.3, "env": {"STAGED": str(staged), "CKPT": str(tmp_path / "ckpt"),
                                         "GO": str(tmp_path / "go"), "DDPCTL_CHECKPOINT_DIR": str(tmp_path / "ckpt")}}


def to_its_end(stream: AgentStream, go: Path | None = None) -> list[list[Batched]]:
    """The stream's batches to its end; `go` is made once it has carried a checkpoint and a sample."""
    batches, heard = [], set()
    for batch in stream.batches():
        batches.append(batch)
        heard.update(m.name for m in batch if isinstance(m, AgentEvent))
        if go is not None and {"checkpoint", "sample"} <= heard:
            go.touch()
    stream.close_stdin()
    assert stream.wait(30) is not None
    return batches


def test_every_record_decodes_alike_live_relayed_and_replayed_from_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(tmp_path / "state"))  # the agents inherit os.environ
    staged = stage_records(tmp_path)
    request = supervise_request(tmp_path, staged)

    live = hear(to_its_end(start_agent(LocalTransport(LOCALHOST), "supervise", request), tmp_path / "go"))
    replayed = hear(to_its_end(start_agent(LocalTransport(LOCALHOST), "attach",
                                           {"job_id": JOB, "node_rank": 0, "offset": 0})))
    supervisor = Supervisor(read(SuperviseRequest, request), detached=False)  # one re-attached to, on that state
    supervisor.uplink = Uplink(str(tmp_path / "unused.log"))
    supervisor.scan_ranks()
    relayed = hear([decode_chunk("stdout", b"".join(supervisor.replay()).decode())])

    assert live.notices == replayed.notices == relayed.notices == []  # every message decoded
    assert {p.phase for p in live.phases} == {"started", "init", "joined", "step", "error", "ended"}
    assert replayed.key() == live.key() and relayed.key() == live.key()
    by = {(p.local_rank, p.phase): p for p in live.phases}
    step = by[(0, "step")]
    assert step.step == 5 and step.total == 100 and step.window is not None and step.window.samples > 0
    failed = by[(1, "error")]
    assert failed.error is not None and failed.error.summary == "ValueError: no good after its steps"
    assert failed.step == 3
    assert by[(2, "error")].error is not None and by[(2, "error")].error.exit_code == 3
    missing = by[(3, "error")]
    assert missing.rank is None and missing.error is not None and missing.error.kind == "FileNotFoundError"
    assert by[(4, "ended")].error is not None and by[(4, "ended")].error.kind == "SIGKILL"

    assert live.result is not None and replayed.result == live.result  # the supervise result, whole
    assert live.result.checkpointed and live.result.newest_checkpoint is not None and live.result.steps == 5
    assert live.result.stop_reason is not None and live.result.stop_reason.startswith("rank 1 failed")
    assert any(isinstance(e, Checkpointed) for e in live.events) and any(isinstance(e, Sampled) for e in live.events)


def test_attaching_where_the_host_has_no_run_state_answers_the_declared_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its run state gone (pruned, another home): said in the supervise result, not a message that
    does not decode."""
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(tmp_path / "state"))
    heard = hear(to_its_end(start_agent(LocalTransport(LOCALHOST), "attach",
                                        {"job_id": "gone-1", "node_rank": 2, "offset": 0})))
    assert heard.notices == [] and heard.result is not None and heard.result.exit_code == 3
    assert (heard.result.error or "").startswith("no run state of job gone-1 node 2 on ")
