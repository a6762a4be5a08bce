"""doctor --deep's GPU health: the gpu_health op's pure parsers on recorded nvidia-smi rows and kernel
log lines (tests/unit/fixtures/nvidia_smi/README.md names each one's source), its query falling back
to field groups when a driver refuses a field, the reply's round trip over the wire, and the check's
findings for healthy and sick GPUs, a GPU selection, and a host without GPU."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from node_agent.ops import gpuhealthparse as parse
from node_agent.ops.gpuhealth import health_report, query_gpus, read_xids
from node_agent.wire.replies import wire
from orchestrator.checks.gpu_health import GPU_HEALTH, XIDS, gpu_health_findings, pci_key, unreachable
from orchestrator.checks.model import CheckStatus, Finding
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote.wire import GpuHealth, GpuHealthReport, XidEvent, parse_gpu_health

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia_smi"
OK, INFO, WARN, FAIL, SKIP = (CheckStatus.OK, CheckStatus.INFO, CheckStatus.WARN, CheckStatus.FAIL,
                              CheckStatus.SKIP)
FULL = parse.query_argv(parse.HEALTH_FIELDS)


def fixture(name: str) -> str:
    """A fixture's text without its `#` source lines."""
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("#"))


def rows(name: str) -> list[dict[str, object]]:
    parsed = parse.parse_health(fixture(name), parse.HEALTH_FIELDS)
    assert parsed["error"] is None and parsed["refused"] is None
    return parsed["gpus"]  # type: ignore[no-any-return]


def replay(outputs: dict[str, tuple[int, str]]) -> tuple[list[list[str]], object]:
    """A command runner that answers each command line from `outputs` (a missing program: not installed)."""
    calls: list[list[str]] = []

    def run(argv: list[str], timeout: float) -> tuple[int, str]:
        calls.append(argv)
        key = " ".join(argv)
        if key not in outputs:
            if argv[0] in {k.split()[0] for k in outputs}:
                return 1, "unexpected command"
            raise FileNotFoundError(argv[0])
        return outputs[key]

    return calls, run


def report(name: str, xids: str = "", hostname: str = "node0") -> GpuHealthReport:
    """The op's report from a fixture's nvidia-smi output and a kernel log read by `dmesg --ctime`."""
    _, run = replay({" ".join(FULL): (0, fixture(name)), "dmesg --ctime": (0, xids)})
    return health_report(hostname, run)  # type: ignore[arg-type]


def statuses(findings: list[Finding]) -> list[CheckStatus]:
    return [f.status for f in findings]


# -- parsers on recorded outputs ----------------------------------------------------------------

@pytest.mark.parametrize(("name", "expected"), [
    ("h100_hbm3_idle.csv", {"index": 0, "name": "NVIDIA H100 80GB HBM3", "bus_id": "00000000:00:09.0",
                            "ecc_uncorrected": 0, "retired_pages_pending": None, "remap_pending": False,
                            "remap_failure": False, "throttle_mask": 0x1, "pcie_gen": 5, "pcie_gen_max": 5,
                            "pcie_width": 16, "pcie_width_max": 16, "temperature_c": 41.0, "error": None}),
    ("h100_hbm3_load.csv", {"throttle_mask": 0, "temperature_c": 59.0}),
    ("h100_mig_idle.csv", {"remap_pending": None, "remap_failure": None, "ecc_uncorrected": 0}),
    ("h200_load.csv", {"name": "NVIDIA H200", "bus_id": "00000000:83:00.0", "pcie_gen": 5}),
    ("l40s_idle.csv", {"name": "NVIDIA L40S", "pcie_gen_max": 4, "throttle_mask": 0}),
    ("rtx2080super_idle.csv", {"ecc_uncorrected": None, "retired_pages_pending": None, "throttle_mask": 0x4,
                               "pcie_gen": 1, "pcie_gen_max": 3}),
    ("rtx2080super_load.csv", {"pcie_gen": 3, "pcie_gen_max": 3, "throttle_mask": 0}),
    ("v100_retired_pending_constructed.csv", {"name": "Tesla V100-SXM2-16GB", "retired_pages_pending": True,
                                              "remap_pending": None, "pcie_gen_max": 3}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_each_recorded_row_parses_with_na_as_unknown(name: str, expected: dict[str, object]) -> None:
    (row,) = rows(name)
    assert {k: row[k] for k in expected} == expected


def test_the_constructed_a100_rows_carry_each_problem() -> None:
    a100 = rows("a100_sick_constructed.csv")
    assert [r["index"] for r in a100] == [0, 1, 2, 3]
    assert (a100[1]["ecc_uncorrected"], a100[1]["remap_pending"]) == (2, True)
    assert a100[2]["remap_failure"] is True
    assert (a100[3]["throttle_mask"], a100[3]["pcie_width"]) == (0x48, 8)


@pytest.mark.parametrize(("name", "bus_id", "error"), [
    ("lost_gpu_is_lost.txt", "0000:02:00.0", "GPU is lost. Reboot the system to recover this GPU"),
    ("lost_unknown_error.txt", "0000:07:00.0", "Unknown Error"),
])
def test_a_lost_gpu_is_its_own_entry_not_the_hosts_error(name: str, bus_id: str, error: str) -> None:
    parsed = parse.parse_health(fixture(name), parse.HEALTH_FIELDS, returncode=15)
    assert parsed["gpus"] == [] and parsed["error"] is None
    assert parsed["lost"] == [{"bus_id": bus_id, "error": error}]


@pytest.mark.parametrize(("name", "field"), [
    ("refused_device_minor.txt", "device_minor"),
    ("refused_throttle_unknown.txt", "clocks_throttle_reasons.unknown"),
])
def test_a_refused_field_is_named(name: str, field: str) -> None:
    assert parse.refused_field(fixture(name)) == field
    assert parse.parse_health(fixture(name), parse.HEALTH_FIELDS, 2)["refused"] == field


def test_nvml_failure_is_the_hosts_error_and_no_devices_is_no_gpu() -> None:
    failed = parse.parse_health("Failed to initialize NVML: Driver/library version mismatch\n", FULL, 18)
    assert failed["error"] == "Failed to initialize NVML: Driver/library version mismatch"
    assert parse.parse_health("No devices were found\n", FULL, 6)["error"] is None


def test_a_bracketed_complaint_is_the_gpus_error_not_a_value() -> None:
    line = ("0, GPU-x, NVIDIA A100-SXM4-80GB, 00000000:94:00.0, [GPU requires reset], [N/A], No, No, 0x0, "
            "4, 4, 16, 16, 40")
    (row,) = parse.parse_health(line, parse.HEALTH_FIELDS)["gpus"]
    assert row["ecc_uncorrected"] is None and row["error"] == "ecc_uncorrected: GPU requires reset"


@pytest.mark.parametrize(("name", "expected"), [
    ("xid_dmesg_ctime_13_109.log", [("0000:cb:00", 13, "Fri Aug 30 11:43:09 2024")] * 3
     + [("0000:cb:00", 109, "Fri Aug 30 11:43:14 2024")]),
    ("xid_journal_45.log", [(p, 45, None) for p in ("0000:dc:00", "0000:ed:00", "0000:ba:00", "0000:97:00",
                                                    "0000:dc:00", "0000:ba:00", "0000:ed:00")]),
    ("xid_79_fallen_off_bus.log", [("0000:44:00", 79, None)]),
    ("xid_62_154_gsp.log", [("0000:01:00", 62, None), ("0000:01:00", 154, None)]),
    ("xid_94_149_kmsg.log", [("0019:01:00", 149, None), ("0018:01:00", 145, None), ("0000:9b:00", 94, None)]),
])
def test_xid_lines_give_pci_code_and_time(name: str, expected: list[tuple[str, int, str | None]]) -> None:
    assert [(e["pci"], e["xid"], e["when"]) for e in parse.parse_xids(fixture(name))] == expected


def test_xid_text_is_the_rest_of_the_line_and_only_the_last_are_kept() -> None:
    events = parse.parse_xids(fixture("xid_dmesg_ctime_13_109.log"))
    assert events[-1]["text"] == ("pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, "
                                  "Info 0x58005")
    many = fixture("xid_journal_45.log") * 5  # 35 lines
    assert len(parse.parse_xids(many)) == parse.XID_KEEP == 20
    stamped = ("2024-01-15T03:00:00+0000 node3 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, "
               "GPU has fallen off the bus.")
    assert parse.parse_xids(stamped)[0]["when"] == "2024-01-15T03:00:00+0000"


def test_pci_keys_of_nvidia_smi_and_the_kernel_log_match() -> None:
    assert pci_key("00000000:3B:00.0") == pci_key("0000:3b:00") == (0, 0x3B, 0)
    assert pci_key("garbage") is None and pci_key(None) is None


# -- the op: fallback query, kernel log readers, no GPU ------------------------------------------

def test_a_refused_full_query_falls_back_to_groups_and_the_renamed_throttle_field() -> None:
    """Constructed: a driver that knows neither remapped_rows nor the old throttle name (the refusal's
    wording is recorded: refused_device_minor.txt)."""
    refused = lambda field: (2, f'Field "{field}" is not a valid field to query.\n\n')  # noqa: E731
    base = "0, GPU-a, Tesla V100-SXM2-16GB, 00000000:0A:00.0\n1, GPU-b, Tesla V100-SXM2-16GB, 00000000:0B:00.0\n"
    answers = {
        " ".join(FULL): refused("remapped_rows.pending"),
        " ".join(parse.query_argv(parse.BASE_FIELDS)): (0, base),
        " ".join(parse.query_argv(("index", "ecc.errors.uncorrected.volatile.total"))): (0, "0, 0\n1, 3\n"),
        " ".join(parse.query_argv(("index", "retired_pages.pending"))): (0, "0, No\n1, Yes\n"),
        " ".join(parse.query_argv(("index", "remapped_rows.pending", "remapped_rows.failure"))):
            refused("remapped_rows.pending"),
        " ".join(parse.query_argv(("index", parse.THROTTLE_FIELD))): refused(parse.THROTTLE_FIELD),
        " ".join(parse.query_argv(("index", parse.THROTTLE_RENAMED))): (0, "0, 0x0000000000000001\n1, 0x0\n"),
        " ".join(parse.query_argv(("index", "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current",
                                   "pcie.link.width.max"))): (0, "0, 3, 3, 16, 16\n1, 3, 3, 16, 16\n"),
        " ".join(parse.query_argv(("index", "temperature.gpu"))): (0, "0, 35\n1, 37\n"),
    }
    calls, run = replay(answers)
    present, gpus, error, unsupported = query_gpus(run)  # type: ignore[arg-type]
    assert present and error is None
    assert unsupported == ("remapped_rows.pending", "remapped_rows.failure")
    assert [(g.index, g.ecc_uncorrected, g.retired_pages_pending, g.throttle_mask, g.remap_pending) for g in gpus] == [
        (0, 0, False, 0x1, None), (1, 3, True, 0, None)]
    assert all(c[0] == "nvidia-smi" and c[1].startswith("--query-gpu=") for c in calls)  # argument lists, no shell


def test_a_host_without_nvidia_smi_says_no_gpu_cleanly() -> None:
    _, run = replay({})
    got = health_report("cpu0", run)  # type: ignore[arg-type]
    assert (got.nvidia_smi, got.gpus, got.gpu_error, got.xids) == (False, (), None, ())
    assert statuses(gpu_health_findings("cpu0", got, None)) == [SKIP]


def test_dmesg_refused_falls_back_to_journalctl_and_a_journal_of_ones_own_says_so() -> None:
    journal = " ".join(["journalctl", "-k", "-o", "short-iso", "--since", "-7 days", "--no-pager", "-q"])
    eperm = (1, "dmesg: read kernel buffer failed: Operation not permitted\n")
    _, run = replay({"dmesg --ctime": eperm, "dmesg": eperm, journal: (0, fixture("xid_journal_45.log"))})
    events, source, error = read_xids(run)  # type: ignore[arg-type]
    assert (len(events), source, error) == (7, "journalctl -k", None)
    hint = "Hint: You are currently not seeing messages from other users and the system.\n"
    _, run = replay({"dmesg --ctime": eperm, "dmesg": eperm, journal: (0, hint)})
    events, _, error = read_xids(run)  # type: ignore[arg-type]
    assert events == () and error is not None and "systemd-journal" in error


def test_no_kernel_log_reader_is_an_error_string_not_a_raise() -> None:
    _, run = replay({"dmesg --ctime": (1, "dmesg: read kernel buffer failed: Operation not permitted\n"),
                     "dmesg": (1, "dmesg: read kernel buffer failed: Operation not permitted\n")})
    events, source, error = read_xids(run)  # type: ignore[arg-type]
    assert events == () and source is None
    assert error == ("dmesg: read kernel buffer failed: Operation not permitted; "
                     "dmesg: read kernel buffer failed: Operation not permitted; journalctl: not installed")


def test_a_hung_nvidia_smi_is_the_hosts_error() -> None:
    def run(argv: list[str], timeout: float) -> tuple[int, str]:
        if argv[0] == "nvidia-smi":
            raise subprocess.TimeoutExpired(argv, timeout)
        return 0, ""

    got = health_report("node0", run)
    assert got.nvidia_smi and got.gpus == () and "did not answer" in (got.gpu_error or "")
    assert statuses(gpu_health_findings("node0", got, None)) == [WARN]


def test_the_reply_round_trips_through_the_wire() -> None:
    sent = report("a100_sick_constructed.csv", fixture("xid_dmesg_ctime_13_109.log"))
    back = parse_gpu_health("node0", wire(sent))
    assert back == GpuHealthReport(**{**sent.__dict__, "host": "node0"})
    with pytest.raises(HostError):
        parse_gpu_health("node0", {"hostname": "x"})


# -- the check -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["h100_hbm3_idle.csv", "h100_hbm3_load.csv", "h100_mig_idle.csv", "h200_load.csv",
                                  "l40s_idle.csv", "rtx2080super_idle.csv", "rtx2080super_load.csv"])
def test_each_recorded_healthy_gpu_gives_one_ok_finding(name: str) -> None:
    findings = gpu_health_findings("node0", report(name), None)
    assert statuses(findings) == [OK]
    assert findings[0].message.startswith("1 GPU(s) healthy: no uncorrectable ECC errors, no throttling, PCIe x16 Gen")
    assert findings[0].check == GPU_HEALTH and findings[0].host == "node0"


def test_the_idle_link_generation_drop_is_not_reported_but_a_busy_one_is_information() -> None:
    (ok,) = gpu_health_findings("node0", report("rtx2080super_idle.csv"), None)  # Gen1 of Gen3 at idle
    assert ok.message.endswith("PCIe x16 Gen3")
    busy = "0, GPU-b, NVIDIA A100-SXM4-80GB, 00000000:94:00.0, 0, [N/A], No, No, 0x0000000000000000, 3, 4, 16, 16, 60\n"
    _, run = replay({" ".join(FULL): (0, busy), "dmesg --ctime": (0, "")})
    findings = gpu_health_findings("node0", health_report("node0", run), None)  # type: ignore[arg-type]
    assert statuses(findings) == [OK, INFO] and "PCIe Gen3 while busy, capable of Gen4" in findings[1].message


def test_each_sick_a100_gives_its_own_finding_with_evidence_and_fix() -> None:
    findings = gpu_health_findings("node3", report("a100_sick_constructed.csv"), None)
    got = {(f.status, f.message) for f in findings}
    assert (FAIL, "GPU 1: 2 uncorrectable ECC error(s) since the driver loaded") in got
    assert (WARN, "GPU 1: row remapping pending until the GPU is reset") in got
    assert (FAIL, "GPU 2: row remapping failed (the memory has no spare rows left)") in got
    assert (WARN, "GPU 3 is throttled by hardware: HW slowdown, HW thermal slowdown") in got
    assert (WARN, "GPU 3: PCIe link is x8, narrower than its x16") in got
    assert OK not in statuses(findings) and all(f.host == "node3" for f in findings)
    ecc = next(f for f in findings if "uncorrectable ECC" in f.message)
    assert "ecc.errors.uncorrected.volatile.total = 2" in ecc.evidence and "00000000:95:00.0" in ecc.evidence
    assert "nvidia-smi -q -d ECC -i 1" in ecc.fix and "RMA" in ecc.fix
    throttle = next(f for f in findings if "throttled" in f.message)
    assert "0x0000000000000048" in throttle.evidence and "89 C" in throttle.evidence
    assert "nvidia-smi -q -d PERFORMANCE -i 3" in throttle.fix


def test_the_selection_keeps_only_the_selected_gpus_and_their_xids() -> None:
    xid = "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:95:00): 48, pid=7, name=python3, DBE\n"
    sick = report("a100_sick_constructed.csv", xid)
    assert statuses(gpu_health_findings("node3", sick, (0,))) == [OK]
    only1 = gpu_health_findings("node3", sick, (1,))
    assert {f.message.split(":")[0].split(" (")[0] for f in only1} == {"GPU 1", "Xid 48 on GPU 1"}
    assert gpu_health_findings("node3", sick, (0,))[0].message.startswith("1 GPU(s) healthy")


def test_a_v100_with_pages_pending_warns_to_reset() -> None:
    (found,) = gpu_health_findings("node0", report("v100_retired_pending_constructed.csv"), None)
    assert (found.status, found.message) == (WARN, "GPU 0: page retirement pending until the GPU is reset")
    assert "nvidia-smi -r -i 0" in found.fix


def test_a_lost_gpu_fails_whatever_the_selection() -> None:
    lost = report("lost_gpu_is_lost.txt")
    (found,) = gpu_health_findings("node0", lost, (0, 1))
    assert (found.status, found.message) == (FAIL, "GPU 0000:02:00.0 is lost: the driver cannot reach it")
    assert "GPU is lost" in found.evidence


@pytest.mark.parametrize(("log", "expected"), [
    ("xid_dmesg_ctime_13_109.log", [(WARN, "Xid 13 on PCI:0000:cb:00 (3 times)"), (WARN, "Xid 109 on PCI:0000:cb:00")]),
    ("xid_79_fallen_off_bus.log", [(FAIL, "Xid 79 on PCI:0000:44:00")]),
    ("xid_62_154_gsp.log", [(WARN, "Xid 62 on PCI:0000:01:00"), (WARN, "Xid 154 on PCI:0000:01:00")]),
    ("xid_94_149_kmsg.log", [(WARN, "Xid 149 on PCI:0019:01:00"), (WARN, "Xid 145 on PCI:0018:01:00"),
                             (FAIL, "Xid 94 on PCI:0000:9b:00")]),
])
def test_xid_lines_are_one_finding_per_gpu_and_code(log: str, expected: list[tuple[CheckStatus, str]]) -> None:
    findings = [f for f in gpu_health_findings("node0", report("h100_hbm3_load.csv", fixture(log)), None)
                if f.message.startswith("Xid")]
    assert [(f.status, f.message.split(": ")[0]) for f in findings] == expected
    assert all("NVRM: Xid" in f.evidence and f.fix for f in findings)


def test_an_xid_on_a_known_gpu_names_its_index_in_message_and_fix() -> None:
    xid = "NVRM: Xid (PCI:0000:00:09): 79, pid=0, GPU has fallen off the bus.\n"
    (found,) = gpu_health_findings("node0", report("h100_hbm3_load.csv", xid), None)  # a FAIL: no OK beside it
    assert found.status == FAIL
    assert found.message == "Xid 79 on GPU 0 (PCI:0000:00:09): GPU has fallen off the bus (the host lost it over PCIe)"
    assert "reseat the GPU" in found.fix


def test_the_fatal_xid_table_is_the_documented_one() -> None:
    assert {x for x, meaning in XIDS.items() if meaning.fatal} == {48, 63, 64, 74, 79, 92, 94, 95, 119, 120}
    assert {13, 31, 43, 45, 61, 62, 68} <= set(XIDS)


def test_an_unreadable_kernel_log_is_information_beside_the_ok() -> None:
    _, run = replay({" ".join(FULL): (0, fixture("h200_load.csv")),
                     "dmesg --ctime": (1, "dmesg: read kernel buffer failed: Operation not permitted\n"),
                     "dmesg": (1, "dmesg: read kernel buffer failed: Operation not permitted\n")})
    findings = gpu_health_findings("node0", health_report("node0", run), None)  # type: ignore[arg-type]
    assert statuses(findings) == [OK, INFO]
    assert findings[1].message == "kernel log not readable: Xid errors not checked"


def test_an_unreachable_host_is_one_finding_naming_host_and_error() -> None:
    err = HostError("node2", HostErrorKind.TIMEOUT, "the node agent sent no result in time", "raise --timeout")
    found = unreachable("node2", err)
    assert (found.status, found.host, found.fix) == (FAIL, "node2", "raise --timeout")
    assert found.message == "GPU health not checked on node2: the node agent sent no result in time"


def test_the_round_fans_out_and_turns_failures_into_findings() -> None:
    from inventory import Host
    from orchestrator.doctor.gpu_health_round import gpu_health_round
    from orchestrator.remote.pool import FanOut

    class Pool:
        def map(self, hosts: list[Host], fn: object) -> FanOut[GpuHealthReport]:
            return FanOut(succeeded={"node0": report("a100_sick_constructed.csv")},
                          failed={"node1": HostError("node1", HostErrorKind.SSHD_DOWN, "connection refused")})

    hosts = [Host(name="node0", address="10.0.0.1", gpus=(0,)), Host(name="node1", address="10.0.0.2")]
    findings = gpu_health_round(Pool(), hosts, 30.0)  # type: ignore[arg-type]
    assert [(f.host, f.status) for f in findings] == [("node0", OK), ("node1", FAIL)]
    assert "connection refused" in findings[1].message


def test_gpu_health_values_default_to_unknown() -> None:
    gpu = GpuHealth(0, None, None, None, None, None, None, None, None, None, None, None, None, None)
    assert gpu.label == "GPU 0" and XidEvent("0000:3b:00", 79, "x", None).xid == 79
