"""doctor --deep's figures, declared once (train_jobs/hostcheck/figures.py): recorded `DDPCTL-DEEP` lines
read and written back byte for byte, the control plane's additions kept, the coordinator's own
figures equal to their decoded copy, a line that does not fit refused, and doctor's reading of a run
(a result, none, or one that does not decode)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from orchestrator.checks.model import CheckStatus, Report
from orchestrator.doctor import deep
from orchestrator.doctor.collective_jobs import CollectiveRun
from tests.unit.test_deep_schedule import coordinator, quick
from train_jobs.hostcheck.figures import DeepFigures, Missed, Phases
from train_jobs.hostcheck.verdict import Figure

FIXTURES = Path(__file__).parent / "fixtures" / "deep"
LINES = sorted(FIXTURES.glob("*.txt"))


def recorded(path: Path) -> str:
    """The JSON of a recorded line."""
    (line,) = path.read_text().splitlines()
    return line.removeprefix(deep.RESULT)


@pytest.mark.parametrize("path", LINES, ids=lambda p: p.stem)
def test_a_recorded_line_reads_and_writes_back_byte_for_byte(path: Path) -> None:
    text = recorded(path)
    d = json.loads(text)
    x = DeepFigures.from_json(d)
    assert x.to_json() == d
    assert json.dumps(x.to_json()) == text, "the same keys, in the same order, with the same values"
    assert DeepFigures.from_json(x.to_json()) == x


def test_the_control_planes_additions_come_last_and_round_trip() -> None:
    d = json.loads(recorded(FIXTURES / "cpu_4_hosts_one_never_started.txt"))
    d |= {"coordinator_host_error": "RuntimeError('the worker of node 0')", "hosts": ["a", "b", "c", "d"],
          "logs": "runs/ddpctl-deep-1"}
    x = DeepFigures.from_json(d)
    assert (x.hosts, x.logs) == (("a", "b", "c", "d"), "runs/ddpctl-deep-1")
    assert json.dumps(x.to_json()) == json.dumps(d)
    assert DeepFigures.from_json(x.to_json()) == x
    assert list(replace(x, coordinator_host_error=None, hosts=None, logs=None).to_json())[-1] == "backend"


def test_what_the_recorded_lines_hold_reads_as_attributes() -> None:
    x = DeepFigures.from_json(json.loads(recorded(FIXTURES / "cpu_4_hosts_one_never_started.txt")))
    assert (x.nbytes, x.iters, x.backend, x.tested, x.all_pairs) == (1 << 20, 2, "gloo", (0, 1, 2), False)
    assert x.missed == (Missed("join", (3,), 10.0, 0.101, "did not start its host check"),)
    assert [row.rank for row in x.compute] == [0, 1, 2] and all(len(row.windows) == 3 for row in x.compute)
    assert x.phases == Phases(10.025, 1.823, 0.156)
    stuck = DeepFigures.from_json(json.loads(recorded(FIXTURES / "sim_8_hosts_a_pair_stuck.txt")))
    (late,) = stuck.missed
    assert late.phase == "links" and 6 in late.ranks and late.round is not None
    assert any(row.figure.missed for row in stuck.links)
    again = DeepFigures.from_json(json.loads(recorded(FIXTURES / "sim_8_hosts_slow_host_measured_again.txt")))
    assert any(row.figure.first is not None and row.figure.first < row.figure.mbps for row in again.links)


@pytest.mark.parametrize("slow", [frozenset(), frozenset({3})])
def test_the_coordinators_figures_equal_their_decoded_copy(slow: frozenset[int]) -> None:
    c, _ = coordinator(6, {0: 0.0, 1: 0.5, 2: 0.5, 3: 0.6, 4: None, 5: 0.7}, quick, slow=slow)
    x = c.run()
    assert DeepFigures.from_json(json.loads(json.dumps(x.to_json()))) == x


def test_a_figure_measured_again_keeps_one_form() -> None:
    assert Figure(900.0, first=900.0) == Figure(900.0)
    assert Figure(5.0).again(Figure(4.0)) == Figure(5.0, 2)
    assert Figure(5.0).again(Figure(6.0)).first == 5.0


@pytest.mark.parametrize("change", [
    lambda d: d.pop("links"),
    lambda d: d.update(schema=3),
    lambda d: d.update(links=[[0, 1, 900.0]]),
    lambda d: d["compute"][0].pop("tflops"),
    lambda d: d["missed"].append({"phase": "join", "ranks": None, "after_s": 10.0}),
    lambda d: d.update(phases=[]),
])
def test_figures_that_do_not_fit_their_declaration_are_refused(change: Any) -> None:
    d = json.loads(recorded(FIXTURES / "cpu_3_hosts.txt"))
    change(d)
    with pytest.raises(ValueError, match="not the host check's figures"):
        DeepFigures.from_json(d)
    with pytest.raises(ValueError, match="not the host check's figures"):
        DeepFigures.from_json([d])


def fake_run(tmp_path: Path, lines: list[str], hosts: int = 4) -> CollectiveRun:
    plan = SimpleNamespace(hosts=[SimpleNamespace(node_rank=r, host=SimpleNamespace(name=f"node{r}"))
                                  for r in reversed(range(hosts))], master_addr="198.18.0.10", master_port=29500)
    result = SimpleNamespace(first_failure=None, hosts=[], run_dir=tmp_path / "run")
    output = SimpleNamespace(lines=[("node0", "0", line) for line in lines])
    return cast(CollectiveRun, SimpleNamespace(result=result, output=output, plan=plan))


def host_check(monkeypatch: pytest.MonkeyPatch, run: CollectiveRun) -> deep.DeepReport:
    monkeypatch.setattr(deep, "run_collective", lambda *_a, **_k: run)
    return deep.host_check(cast(Any, None), cast(Any, None), Path("runs"), 1.0, 1 << 20)


def test_doctor_decodes_the_line_once_adds_the_hosts_and_judges_it(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    text = recorded(FIXTURES / "cpu_4_hosts_one_never_started.txt")
    out = host_check(monkeypatch, fake_run(tmp_path, ["DDPCTL-DEEP-ROUND 0 1", deep.RESULT + text]))
    assert out.figures is not None and out.figures.hosts == ("node0", "node1", "node2", "node3")
    late = [f for f in out.findings if f.status is CheckStatus.WARN]
    assert [(f.check, f.host) for f in late] == [("compute", "node3")]
    assert late[0].message.startswith("did not start its host check in 10 s; the others started in 0.1 s")
    report = Report(["node0"], [], out.findings, deep=out.figures)
    assert report.to_json()["deep"] == {**json.loads(text), "hosts": ["node0", "node1", "node2", "node3"],
                                        "logs": str(tmp_path / "run")}


@pytest.mark.parametrize(("lines", "why"), [
    ([], None),
    ([deep.RESULT + '{"schema": 2, "bytes": 20'], "its result line does not decode"),
    ([deep.RESULT + '{"schema": 2}'], "its result line does not decode (not the host check's figures: KeyError"),
])
def test_a_run_without_figures_that_decode_fails_each_job_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                lines: list[str], why: str | None) -> None:
    out = host_check(monkeypatch, fake_run(tmp_path, lines))
    assert out.figures is None
    assert [(f.check, f.status, f.message) for f in out.findings] == [
        (check, CheckStatus.FAIL, "the host check printed no result") for check in deep.job_checks()]
    for f in out.findings:
        assert (why is not None and why in f.evidence) or (why is None and "decode" not in f.evidence)
        assert f.evidence.endswith(f"logs: {tmp_path / 'run'}")
