"""What `top` samples on a host: nvidia-smi's recorded outputs parsed, process CPU/RSS from psutil
and /proc, NIC counters, the ranks' step records, and the top op on a job running here."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from top_fakes import fake_job, install_fake_nvidia_smi, recorded

from node_agent.host import hoststats, runstate
from node_agent.host.factparse import parse_nvidia_gpu_stats, parse_proc_net_dev
from node_agent.ops import top
from node_agent.runtime import supervisor
from node_agent.wire.replies import wire
from node_agent.wire.replies_top import GpuStat
from node_agent.wire.requests import SuperviseRequest
from orchestrator.remote.agent import AgentEvent, decode
from orchestrator.remote.transport import OutputLine
from orchestrator.remote.wire import parse_sample, parse_top

H100 = "NVIDIA H100 80GB HBM3"
CPU_HOST = hoststats.GpuSample((), None, False)


def gpu(index: int, util: float | None, used: float | None, total: float | None, power: float | None,
        name: str = H100) -> dict[str, Any]:
    return {"index": index, "util_pct": util, "memory_used_mib": used, "memory_total_mib": total,
            "power_w": power, "error": None, "name": name}


def essentials(g: dict[str, Any]) -> dict[str, Any]:
    return {k: g[k] for k in ("index", "util_pct", "memory_used_mib", "memory_total_mib", "power_w", "error", "name")}


# -- nvidia-smi ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("recording", "gpus", "error"), [
    ("busy.csv", [gpu(0, 97, 71234, 81559, 612.45), gpu(1, 99, 71302, 81559, 634.10),
                  gpu(2, 95, 71188, 81559, 598.72), gpu(3, 98, 71250, 81559, 621.33)], None),
    ("idle.csv", [gpu(0, 0, 1, 81559, 69.87), gpu(1, 0, 1, 81559, 71.02)], None),
    ("no_step.csv", [gpu(0, 100, 78112, 81559, 311.20), gpu(1, 100, 78090, 81559, 309.84)], None),
    ("na_fields.csv", [gpu(0, None, 3, 81920, None, "NVIDIA A100 80GB PCIe"),
                       gpu(1, 12, 1024, 11441, None, "Tesla K80")], None),
    ("nvml_failed.txt", [], "Failed to initialize NVML: Driver/library version mismatch"),
], ids=["busy", "idle", "100%-no-step", "n/a-fields", "nvml-failed"])
def test_recorded_gpu_queries_parse(recording: str, gpus: list[dict[str, Any]], error: str | None) -> None:
    code, output = recorded(recording)
    parsed = parse_nvidia_gpu_stats(output, code)
    assert [essentials(g) for g in parsed["gpus"]] == gpus
    assert parsed["error"] == error


def test_a_gpu_lost_after_an_xid_is_an_error_entry_of_its_own_and_the_others_still_count() -> None:
    code, output = recorded("gpu_lost.txt")
    parsed = parse_nvidia_gpu_stats(output, code)
    assert parsed["error"] is None
    assert [g["index"] for g in parsed["gpus"]] == [0, None, 2]
    lost = parsed["gpus"][1]
    assert lost["bus_id"] == "0000:3B:00.0"
    assert lost["error"] == "GPU is lost.  Reboot the system to recover this GPU"
    assert parsed["gpus"][2]["util_pct"] == 90


@pytest.mark.parametrize(("output", "code", "gpus", "error"), [
    ("No devices were found\n", 6, 0, None),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
     "latest NVIDIA driver is installed and running.\n", 9, 0,
     "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
     "latest NVIDIA driver is installed and running."),
    ("", 255, 0, "nvidia-smi exited 255 with no output"),
    ("0, GPU-a, Tesla V100, [Unknown Error], 10, 16160, 40.1\n", 0, 1, None),
])
def test_other_nvidia_smi_answers(output: str, code: int, gpus: int, error: str | None) -> None:
    parsed = parse_nvidia_gpu_stats(output, code)
    assert (len(parsed["gpus"]), parsed["error"]) == (gpus, error)


def test_a_bracketed_complaint_in_a_field_is_that_gpus_error() -> None:
    (g,) = parse_nvidia_gpu_stats("0, GPU-a, Tesla V100, [Unknown Error], 10, 16160, 40.1\n")["gpus"]
    assert (g["util_pct"], g["memory_used_mib"], g["error"]) == (None, 10, "Unknown Error")


def test_gpu_sample_runs_the_query_and_a_host_without_nvidia_smi_is_a_cpu_host() -> None:
    seen: list[list[str]] = []

    def runner(argv: list[str], timeout: float) -> tuple[int, str]:
        seen.append(argv)
        return recorded("idle.csv")

    idle = hoststats.gpu_sample(runner)
    assert [g.index for g in idle.gpus] == [0, 1] and idle.error is None and idle.nvidia_smi
    assert seen == [["nvidia-smi", "--query-gpu=index,uuid,name,utilization.gpu,memory.used,memory.total,"
                                   "power.draw", "--format=csv,noheader,nounits"]]

    def missing(argv: list[str], timeout: float) -> tuple[int, str]:
        raise FileNotFoundError(argv[0])

    assert hoststats.gpu_sample(missing) == hoststats.GpuSample((), None, False)

    def hung(argv: list[str], timeout: float) -> tuple[int, str]:
        raise subprocess.TimeoutExpired(argv, timeout)

    assert hoststats.gpu_sample(hung) == hoststats.GpuSample((), "nvidia-smi did not answer in 5 s", True)


@pytest.mark.parametrize("recording", ["busy.csv", "gpu_lost.txt", "nvml_failed.txt"])
def test_the_fake_nvidia_smi_replays_its_recording_for_the_real_command(
        recording: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fake_nvidia_smi(tmp_path / "bin", recording)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    code, output = recorded(recording)
    parsed = parse_nvidia_gpu_stats(output, code)
    gpus = tuple(GpuStat(**g) for g in parsed["gpus"])
    assert hoststats.gpu_sample() == hoststats.GpuSample(gpus, parsed["error"], True)


# -- processes and the NIC --------------------------------------------------------------------------

def proc_sources() -> list[Any]:
    return [False, pytest.param(True, marks=pytest.mark.skipif(hoststats._psutil() is None, reason="no psutil"))]


@pytest.mark.parametrize("use_psutil", proc_sources(), ids=["proc", "psutil"])
def test_cpu_seconds_and_rss_of_a_busy_process(use_psutil: bool) -> None:
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 0.6\n"
                             "while time.time() < end: pass\ntime.sleep(30)"])
    try:
        reader = hoststats.ProcReader(use_psutil)
        before = reader.sample([busy.pid, 999999999])
        time.sleep(0.4)
        after = reader.sample([busy.pid])
        cpu_pct, rss = hoststats.cpu_and_rss(before, after, 0.4)
    finally:
        busy.kill()
        busy.wait()
    assert list(before) == [busy.pid]  # a pid that does not exist is left out
    assert cpu_pct is not None and cpu_pct > 20
    assert 1 << 20 < rss < 1 << 30
    assert reader.source == ("psutil" if use_psutil else "/proc")
    assert reader.one(busy.pid) is None  # gone (reaped)


def test_cpu_percent_counts_a_process_started_in_between_whole_and_one_gone_not_at_all() -> None:
    before = {1: (10.0, 100), 2: (5.0, 200)}
    after = {1: (11.0, 150), 3: (0.5, 50)}
    assert hoststats.cpu_and_rss(before, after, 2.0) == (75.0, 200)
    assert hoststats.cpu_and_rss(before, after, 0.0) == (None, 200)


NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier \
compressed
    lo:  123456  100 0 0 0 0 0 0   123456  100 0 0 0 0 0 0
  eth0: 9000000000 7000000 0 0 0 0 0 0 8000000000 6000000 0 0 0 0 0 0
"""

def test_proc_net_dev_and_rates_over_the_jobs_interfaces() -> None:
    before = parse_proc_net_dev(NET_DEV)
    assert before == {"lo": (123456, 123456), "eth0": (9000000000, 8000000000)}
    after = {"lo": (123456, 123456), "eth0": (9000000000 + 4_000_000, 8000000000 + 2_000_000)}
    assert hoststats.nic_rates(["eth0"], before, after, 2.0) == (1_000_000.0, 2_000_000.0)
    assert hoststats.nic_rates(["ib0"], before, after, 2.0) == (None, None)
    assert hoststats.nic_counters()  # this machine's, read for real: lo at least


# -- step records ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("record", "rate", "stalled"), [
    ({"time": 100.0, "step": 40, "window": {"steps": 20, "seconds": 1.0, "p50_ms": 48.0, "p95_ms": 61.0}},
     20.0, False),
    ({"time": 94.0, "step": 40, "window": {"steps": 20, "seconds": 1.0, "p50_ms": 48.0, "p95_ms": 61.0}},
     0.0, True),  # 6 s old > max(5 s, 3 x 1 s)
    ({"time": 80.0, "step": 4, "window": {"steps": 1, "seconds": 10.0, "p50_ms": 9000.0, "p95_ms": 9000.0}},
     0.1, False),  # 20 s old < 3 x 10 s: a slow step, not a stall
    ({"time": 99.0, "step": 1}, None, False),  # the first record has no window
    ({"time": 90.0, "step": 1}, 0.0, True),
])
def test_a_ranks_rate_and_whether_it_stalled(record: dict[str, Any], rate: float | None, stalled: bool) -> None:
    got = top.rank_steps({"phase": "step", "rank": 3, "local_rank": 1, **record}, now=100.0)
    assert (got.steps_per_s, got.stalled) == (rate, stalled)
    assert (got.rank, got.local_rank, got.step) == (3, 1, record["step"])


# -- the job's interface ----------------------------------------------------------------------------

ROUTES = [{"dst": "default", "dev": "ens1", "gateway": "10.0.0.1"},
          {"dst": "10.0.0.0/24", "dev": "ens1", "gateway": None},
          {"dst": "192.168.7.0/24", "dev": "ib0", "gateway": None}]


@pytest.mark.parametrize(("env", "master", "expected"), [
    ({"NCCL_SOCKET_IFNAME": "ib"}, "10.0.0.5", (["ib0"], "NCCL_SOCKET_IFNAME=ib")),
    ({"NCCL_SOCKET_IFNAME": "^lo,docker"}, None, (["ens1", "ib0"], "NCCL_SOCKET_IFNAME=^lo,docker")),
    ({"GLOO_SOCKET_IFNAME": "ens1"}, None, (["ens1"], "GLOO_SOCKET_IFNAME=ens1")),
    ({"NCCL_SOCKET_IFNAME": "x"}, None, ([], "no master address")),  # one character: NCCL ignores it
])
def test_the_interface_comes_from_the_jobs_variables_first(env: dict[str, str], master: str | None,
                                                           expected: tuple[list[str], str]) -> None:
    assert top.job_interfaces(env, master, ["lo", "ens1", "ib0", "docker0"]) == expected


@pytest.mark.parametrize(("address", "dev"), [
    ("192.168.7.20", "ib0"), ("10.0.0.9", "ens1"), ("8.8.8.8", "ens1"), ("127.0.0.1", "lo"), ("nonsense", None)])
def test_else_the_route_to_the_master(address: str, dev: str | None) -> None:
    assert top.route_interface(address, ROUTES) == dev


def test_the_master_address_from_a_rank_then_torchruns_argv() -> None:
    state = {"argv": ["python", "-m", "torch.distributed.run", "--master-addr", "10.0.0.5"]}
    assert top.master_address(state, {"MASTER_ADDR": "10.0.0.7"}) == "10.0.0.7"
    assert top.master_address(state, None) == "10.0.0.5"
    assert top.master_address({"argv": ["--rdzv-endpoint", "[fd00::1]:29500"]}, None) == "fd00::1"
    assert top.master_address({"argv": ["--rdzv_endpoint=node0:29500"]}, None) == "node0"


# -- the op on a job running here ---------------------------------------------------------------------

@pytest.fixture
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "state"
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(root))
    return root


def test_the_op_samples_a_running_job(state_root: Path) -> None:
    window = {"steps": 10, "seconds": 2.0, "p50_ms": 190.0, "p95_ms": 240.0}
    with fake_job(state_root, "hs-1", env={"GLOO_SOCKET_IFNAME": "lo"}, busy_s=1.0, workers=2) as job:
        job.write_step(0, 0, 120, window=window, total=1000)
        built = top.host_top("hs-1", 0.5, use_psutil=False,
                             gpus=lambda: hoststats.gpu_sample(lambda argv, t: recorded("busy.csv")))
    reply = wire(built)
    assert parse_top("", json.loads(json.dumps(reply, sort_keys=True))) == built  # as the control plane reads it
    (node,) = reply["nodes"]
    assert node["running"] and node["job_id"] == "hs-1" and node["node_rank"] == 0
    # the launcher, the rank and its 2 workers (which carry RANK too, but are not ranks)
    assert (node["ranks_alive"], node["ranks_expected"], node["processes"]) == (1, 1, 4)
    (rank,) = node["ranks"]
    assert (rank["steps_per_s"], rank["p50_ms"], rank["p95_ms"], rank["step"], rank["total"]) == \
        (5.0, 190.0, 240.0, 120, 1000)
    assert (node["iface"], node["iface_source"]) == ("lo", "GLOO_SOCKET_IFNAME=lo")
    assert node["tx_bytes_per_s"] is not None and node["rx_bytes_per_s"] is not None
    assert node["cpu_pct"] > 20 and node["rss_bytes"] > 1 << 20
    assert 0 <= node["log_age_s"] < 30
    assert len(reply["gpus"]) == 4 and reply["gpu_error"] is None
    assert reply["proc_source"] == "/proc" and reply["interval_s"] >= 0.5


def test_the_route_to_the_master_names_the_interface_when_the_job_sets_none(state_root: Path) -> None:
    with fake_job(state_root, "hs-2") as job:
        job.write_step(0, 0, 1)
        reply = top.sample("hs-2", 0.0, gpus=lambda: CPU_HOST)
    (node,) = reply["nodes"]
    assert (node["iface"], node["iface_source"]) == ("lo", "route to 127.0.0.1")
    assert node["ranks"][0]["steps_per_s"] is None  # no window yet


def test_nvml_failing_still_gives_the_jobs_cpu_memory_and_steps(state_root: Path) -> None:
    with fake_job(state_root, "hs-3") as job:
        job.write_step(0, 0, 7, window={"steps": 7, "seconds": 1.0, "p50_ms": 140.0, "p95_ms": 150.0})
        reply = top.sample(None, 0.2, gpus=lambda: hoststats.gpu_sample(lambda argv, t: recorded("nvml_failed.txt")))
    assert reply["gpu_error"] == "Failed to initialize NVML: Driver/library version mismatch"
    (node,) = reply["nodes"]
    assert node["cpu_pct"] is not None and node["rss_bytes"] and node["ranks"][0]["steps_per_s"] == 7.0


def test_a_job_that_ended_is_its_last_state_and_nothing_is_sampled(state_root: Path) -> None:
    with fake_job(state_root, "hs-4") as job:
        pass  # its processes are gone now
    slept: list[float] = []
    reply = top.sample("hs-4", 5.0, sleep=slept.append, gpus=lambda: CPU_HOST)
    assert slept == []  # no interval to wait through
    (node,) = reply["nodes"]
    assert not node["running"] and node["ranks_alive"] == 0 and node["cpu_pct"] is None
    assert job.state_dir.exists()
    assert top.sample(None, 5.0, gpus=lambda: CPU_HOST)["nodes"] == []  # every job: running ones only


def test_a_gpu_sample_that_failed_or_hung_is_the_hosts_gpu_error_in_a_reply_that_decodes(
        monkeypatch: pytest.MonkeyPatch, state_root: Path) -> None:
    def broken() -> hoststats.GpuSample:
        raise RuntimeError("no")

    failed = top.host_top(None, 0.0, gpus=broken)
    assert (failed.gpus, failed.gpu_error, failed.nodes) == ((), "sampling the GPUs failed: RuntimeError: no", ())
    monkeypatch.setattr(top, "GPU_JOIN_S", 0.05)
    hung = top.host_top(None, 0.0, gpus=lambda: time.sleep(0.5) or CPU_HOST)  # type: ignore[func-returns-value]
    assert hung.gpu_error == "nvidia-smi did not finish in 0 s"
    for reply in (failed, hung):
        assert parse_top("", json.loads(json.dumps(wire(reply)))) == reply


@pytest.mark.parametrize("recording", ["busy.csv", None], ids=["gpu-host", "cpu-host"])
def test_the_supervisors_sample_events_decode_to_what_it_sampled(
        recording: str | None, state_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `sample_every` seconds: the job's CPU, memory and GPUs (nvidia-smi asked again only
    where it is installed)."""
    gpu_samples = []

    def sampled_gpus() -> hoststats.GpuSample:
        got = hoststats.gpu_sample(lambda argv, t: recorded(recording)) if recording else CPU_HOST
        gpu_samples.append(got)
        return got

    monkeypatch.setattr(supervisor, "gpu_sample", sampled_gpus)
    events: list[tuple[str, dict[str, Any]]] = []
    three = threading.Event()

    def message(_uplink: object, line: bytes) -> None:  # the event line, as it goes to the control plane
        event = decode(OutputLine("stdout", line.decode().rstrip("\n")))
        assert isinstance(event, AgentEvent), line
        events.append((event.name, dict(event.fields)))
        if len(events) >= 3:
            three.set()

    with fake_job(state_root, "hs-5") as job:
        sup = supervisor.Supervisor(SuperviseRequest("hs-5", sample_every=0.1, env={"CUDA_VISIBLE_DEVICES": "1,3"}),
                                    detached=False)
        sup.proc = job.launcher
        sup.uplink = type("Uplink", (), {"message": message})()
        watching = threading.Thread(target=sup.watch_host, daemon=True)
        watching.start()
        three.wait(20)
        sup.stopping.set()
        watching.join(5)
    assert len(events) >= 3 and {name for name, _ in events} == {"sample"}
    got = [parse_sample(json.loads(json.dumps(fields, sort_keys=True))) for _, fields in events]
    assert all(g.processes == 2 and g.rss_bytes and g.cpu_percent is not None for g in got)
    if recording:
        assert len(gpu_samples) == len(events)
        assert all(g.gpus == gpu_samples[0].gpus and g.gpu_select == ("1", "3") for g in got)
        assert [g.index for g in got[0].job_gpus] == [1, 3]
    else:  # a CPU host: nvidia-smi asked once, its answer (no GPUs) sent once
        assert len(gpu_samples) == 1
        assert (got[0].gpus, got[0].gpu_error, got[0].gpu_select) == ((), None, ("1", "3"))
        assert all((g.gpus, g.gpu_select) == ((), None) for g in got[1:])


def test_a_named_job_is_found_without_reading_every_run(state_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def state(job_id: str, name: str, run_id: str | None = None) -> None:
        d = state_root / "runs" / job_id / "node0"
        d.mkdir(parents=True)
        (d / "state.json").write_text(json.dumps({"job_id": job_id, "job_name": name, "run_id": run_id,
                                                  "hostname": socket.gethostname()}))

    state("toy-20250101-000000-aaaa", "toy")
    state("toy2-20250101-000000-bbbb", "toy2")
    state("rs-20250101-000000-cccc.0", "rs", "rs-20250101-000000-cccc")
    state("rs-20250101-000000-cccc.1", "rs", "rs-20250101-000000-cccc")
    state("my-job-20250101-000000-dddd", "my job")
    read: list[str] = []
    monkeypatch.setattr(runstate, "read_json",
                        lambda path: read.append(path.parts[-3]) or json.loads(path.read_text()))

    def states(job: str) -> list[str]:
        return [s["job_id"] for s in runstate.iter_states(job)]

    assert states("toy") == ["toy-20250101-000000-aaaa"]
    assert read == ["toy-20250101-000000-aaaa", "toy2-20250101-000000-bbbb"]
    assert states("rs-20250101-000000-cccc") == ["rs-20250101-000000-cccc.0", "rs-20250101-000000-cccc.1"]
    assert states("my job") == ["my-job-20250101-000000-dddd"]  # every run read
    assert states("nothing") == []
