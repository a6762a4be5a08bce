"""`ddpctl top`'s rows: each host's reply parsed, GPUs summed over the job's, worst first, errors
as rows; and the command on this machine (the real agent, a fake job) through typer's runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from top_fakes import fake_job, install_fake_nvidia_smi, recorded
from typer.testing import CliRunner

from node_agent.host.factparse import parse_nvidia_gpu_stats
from orchestrator.cli import app
from orchestrator.commands import top as top_command
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.hostops.top import TopRow, TopSession, TopState, build_report, selected_gpus, sort_key
from orchestrator.remote.wire import HostTop, parse_top

WINDOW = {"steps": 20, "seconds": 2.0, "p50_ms": 95.0, "p95_ms": 120.0}


def gpus(recording: str) -> dict[str, Any]:
    code, output = recorded(recording)
    return parse_nvidia_gpu_stats(output, code)


def rank(r: int, rate: float | None, p50: float | None = 95.0, p95: float | None = 120.0, step: int = 100,
         stalled: bool = False) -> dict[str, Any]:
    return {"rank": r, "local_rank": r % 2, "step": step, "total": 1000, "age_s": 0.4, "steps_per_s": rate,
            "p50_ms": p50, "p95_ms": p95, "stalled": stalled}


def node(ranks: list[dict[str, Any]], running: bool = True, **extra: Any) -> dict[str, Any]:
    return {"job_id": "toy-20250101-000000-abcd", "job_name": "toy", "node_rank": 0, "running": running,
            "status": "running" if running else "exited", "exit_code": None if running else 1,
            "ranks_alive": len(ranks) if running else 0, "ranks_expected": 2, "ranks": ranks, "log_age_s": 1.5,
            "iface": "eth0", "iface_source": "GLOO_SOCKET_IFNAME=eth0", "tx_bytes_per_s": 2.5e6,
            "rx_bytes_per_s": 2.4e6, "cpu_pct": 187.5, "rss_bytes": 3 << 30, "processes": 3, "gpu_select": None,
            **extra}


def reply(nodes: list[dict[str, Any]], recording: str | None = None, hostname: str = "h") -> dict[str, Any]:
    g = gpus(recording) if recording else {"gpus": [], "error": None}
    return {"hostname": hostname, "interval_s": 2.0, "gpus": g["gpus"], "gpu_error": g["error"],
            "nvidia_smi": recording is not None, "proc_source": "/proc", "nodes": nodes}


def host(name: str, nodes: list[dict[str, Any]], recording: str | None = None) -> HostTop:
    return parse_top(name, reply(nodes, recording, name))


# -- one row --------------------------------------------------------------------------------------

def test_a_busy_host_row_takes_the_slowest_rank_and_sums_its_gpus() -> None:
    report = build_report("toy", {"n0": host("n0", [node([rank(0, 10.5, 95, 120), rank(1, 9.8, 101, 130)])],
                                               "busy.csv")}, {})
    (row,) = report.rows
    assert (row.host, row.state, row.ranks_alive, row.ranks_expected) == ("n0", TopState.RUNNING, 2, 2)
    assert (row.steps_per_s, row.p50_ms, row.p95_ms, row.step, row.total) == (9.8, 101, 130, 100, 1000)
    assert (row.gpus, row.gpu_util_min, row.gpu_util_max) == (4, 95, 99)
    assert row.gpu_memory_used_mib == 71234 + 71302 + 71188 + 71250
    assert row.gpu_memory_total_gib == pytest.approx(4 * 81559 / 1024)
    assert row.power_w == pytest.approx(612.45 + 634.10 + 598.72 + 621.33, abs=0.1)
    assert (row.cpu_pct, row.rss_bytes, row.iface, row.log_age_s) == (187.5, 3 << 30, "eth0", 1.5)
    assert (row.tx_bytes_per_s, row.rx_bytes_per_s, row.error) == (2.5e6, 2.4e6, None)


def test_nvml_failure_is_the_rows_error_and_keeps_cpu_memory_and_steps() -> None:
    (row,) = build_report(None, {"n1": host("n1", [node([rank(0, 10.0)])], "nvml_failed.txt")}, {}).rows
    assert row.state is TopState.ERROR
    assert row.error == "Failed to initialize NVML: Driver/library version mismatch"
    assert (row.cpu_pct, row.rss_bytes, row.steps_per_s, row.gpu_util_min) == (187.5, 3 << 30, 10.0, None)


def test_a_lost_gpu_is_named_in_the_rows_error_and_the_others_still_count() -> None:
    (row,) = build_report(None, {"n2": host("n2", [node([rank(0, 10.0)])], "gpu_lost.txt")}, {}).rows
    assert row.state is TopState.ERROR
    assert row.error == "GPU 0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU"
    assert (row.gpus, row.gpu_util_min, row.gpu_util_max) == (3, 88, 90)


def test_na_fields_leave_those_columns_empty() -> None:
    (row,) = build_report(None, {"n3": host("n3", [node([rank(0, 1.0)])], "na_fields.csv")}, {}).rows
    assert (row.state, row.gpu_util_min, row.gpu_util_max, row.power_w) == (TopState.RUNNING, 12, 12, None)
    assert row.gpu_memory_used_mib == 1027


def test_the_jobs_cuda_visible_devices_picks_its_gpus() -> None:
    stats = host("n", [], "busy.csv").gpus
    assert [g.index for g in selected_gpus(stats, ["0", "2"])] == [0, 2]
    assert [g.index for g in selected_gpus(stats, ["GPU-0b7e91d4"])] == [1]
    assert [g.index for g in selected_gpus(stats, None)] == [0, 1, 2, 3]
    (row,) = build_report(None, {"n": host("n", [node([rank(0, 1.0)], gpu_select=["1", "3"])], "busy.csv")},
                          {}).rows
    assert (row.gpus, row.gpu_util_min, row.gpu_util_max) == (2, 98, 99)


def test_a_host_without_the_job_is_a_no_job_row_with_its_gpus_and_an_ended_node_says_how() -> None:
    report = build_report("toy", {"idle": host("idle", [], "idle.csv"),
                                  "done": host("done", [node([rank(0, 0.0, stalled=True)], running=False)])}, {})
    done, idle = report.rows
    assert (idle.state, idle.gpus, idle.gpu_util_max, idle.job_id) == (TopState.NO_JOB, 2, 0, None)
    assert (done.state, done.detail, done.steps_per_s, done.stalled) == \
        (TopState.NO_JOB, "node 0 exited (exit code 1)", None, False)
    assert not report.running


@pytest.mark.parametrize(("kind", "state"), [
    (HostErrorKind.UNREACHABLE, TopState.UNREACHABLE), (HostErrorKind.TIMEOUT, TopState.UNREACHABLE),
    (HostErrorKind.LOST, TopState.UNREACHABLE), (HostErrorKind.SSHD_DOWN, TopState.UNREACHABLE),
    (HostErrorKind.AUTH, TopState.ERROR), (HostErrorKind.AGENT, TopState.ERROR),
])
def test_a_host_that_gave_no_answer_is_a_row_with_its_error(kind: HostErrorKind, state: TopState) -> None:
    err = HostError("n9", kind, "it failed", "do this")
    (row,) = build_report(None, {}, {"n9": err}).rows
    assert (row.host, row.state, row.error, row.fix) == ("n9", state, "it failed", "do this")


# -- worst first ----------------------------------------------------------------------------------------

def test_rows_are_sorted_worst_first() -> None:
    results = {
        "fast": host("fast", [node([rank(0, 12.0)])]),
        "slow": host("slow", [node([rank(0, 3.0)])]),
        "stalled": host("stalled", [node([rank(0, 0.0, stalled=True)])]),
        "starting": host("starting", [node([rank(0, None, None, None, step=1)])]),
        "idle": host("idle", []),
        "nvml": host("nvml", [node([rank(0, 12.0)])], "nvml_failed.txt"),
        "b-fast": host("b-fast", [node([rank(0, 12.0)])]),
    }
    failed = {"gone": HostError("gone", HostErrorKind.UNREACHABLE, "no route to host")}
    report = build_report(None, results, failed)
    assert [r.host for r in report.rows] == ["gone", "nvml", "stalled", "slow", "b-fast", "fast", "starting",
                                             "idle"]
    assert report.failed == ("gone",)
    assert sorted(report.rows, key=sort_key) == list(report.rows)


def test_the_json_form_has_every_field_of_every_row() -> None:
    report = build_report("toy", {"n0": host("n0", [node([rank(0, 10.0)])], "busy.csv")},
                          {"n1": HostError("n1", HostErrorKind.UNREACHABLE, "timed out")})
    data = json.loads(json.dumps(report.to_json()))
    assert data["job"] == "toy"
    fields = set(TopRow.__dataclass_fields__)
    assert all(set(row) == fields for row in data["rows"])
    assert [(r["host"], r["state"]) for r in data["rows"]] == [("n1", "unreachable"), ("n0", "running")]


def test_a_malformed_reply_is_a_protocol_error() -> None:
    with pytest.raises(HostError) as caught:
        parse_top("n0", {"nodes": [{"running": True}]})
    assert caught.value.kind is HostErrorKind.PROTOCOL


# -- rendering ------------------------------------------------------------------------------------------

def test_plain_text_has_a_header_and_a_line_per_row() -> None:
    report = build_report("toy", {"n0": host("n0", [node([rank(0, 9.8, 101, 130)])], "busy.csv")},
                          {"n1": HostError("n1", HostErrorKind.UNREACHABLE, "no route to host", "check the link")})
    title, header, first, second = top_command.plain_lines(report)
    assert title.startswith("ddpctl top: job toy, ")
    assert header.split()[:4] == ["host", "state", "ranks", "steps/s"]
    assert first.split()[:2] == ["n1", "unreachable"] and first.endswith("no route to host; fix: check the link")
    assert second.split() == ["n0", "running", "1/2", "9.80", "101/130", "95–99", "278.3/318.6", "2467", "188",
                              "3.0", "GiB", "2.5/2.4", "(eth0)", "2s", "ago"]


# -- the command on this machine -------------------------------------------------------------------------

@pytest.fixture
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "state"
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(root))  # inherited by the local agent
    monkeypatch.setenv("PATH", f"{install_fake_nvidia_smi(tmp_path / 'bin', 'busy.csv')}:/usr/bin:/bin")
    return root


def test_top_once_json_on_a_job_running_here(state_root: Path) -> None:
    with fake_job(state_root, "cli-20250101-000000-abcd", env={"GLOO_SOCKET_IFNAME": "lo"}) as job:
        job.write_step(0, 0, 50, window=WINDOW)
        result = CliRunner().invoke(app, ["top", "cli-20250101-000000-abcd", "--json", "--interval", "0.3"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (row,) = data["rows"]
    assert (row["host"], row["state"], row["ranks_alive"], row["steps_per_s"]) == ("localhost", "running", 1, 10.0)
    assert (row["gpus"], row["gpu_util_min"], row["gpu_util_max"], row["iface"]) == (4, 95, 99, "lo")
    assert row["cpu_pct"] is not None and row["rss_bytes"] > 0 and row["log_age_s"] is not None


def test_top_once_prints_a_table_and_an_unknown_job_exits_1(state_root: Path) -> None:
    with fake_job(state_root, "tbl-20250101-000000-abcd") as job:
        job.write_step(0, 0, 50, window=WINDOW)
        shown = CliRunner().invoke(app, ["top", "--once", "--interval", "0.2"])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[1].split()[:3] == ["host", "state", "ranks"]
    assert lines[2].split()[:4] == ["localhost", "running", "1/1", "10.00"]
    missing = CliRunner().invoke(app, ["top", "nope", "--once", "--interval", "0.2"])
    assert missing.exit_code == 1
    assert "job nope: no host has it running" in missing.stderr
    assert "localhost  no job" in missing.stdout


def test_ctrl_c_exits_130_without_a_word(state_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def interrupted(self: object) -> None:
        calls.append(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(TopSession, "sample", interrupted)
    result = CliRunner().invoke(app, ["top"])
    assert result.exit_code == 130 and calls
    assert result.stderr == "" and result.stdout == ""


def test_help_ends_with_examples() -> None:
    result = CliRunner().invoke(app, ["top", "--help"])
    assert result.exit_code == 0
    assert "ddpctl top myjob -i hosts.toml --once --json" in result.stdout
