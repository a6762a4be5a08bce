"""The "gpu_health" op (`ddpctl doctor --deep`): each GPU's health fields from nvidia-smi's query
(uncorrectable ECC errors, pending page retirement and row remapping, active throttle reasons,
PCIe link, temperature) and the last Xid lines of the kernel log. Every GPU is reported with its
index; the control plane keeps the host's selected ones (orchestrator/checks/gpu_health.py).

A host without nvidia-smi answers "no GPU" (nvidia_smi False), not an error. A driver that refuses
a field of the full query is asked the fields in groups (gpuhealthparse.FIELD_GROUPS); a group it
refuses is unknown, not a fault. Standard library only, Python >= 3.8.
"""

from __future__ import annotations

import socket
import subprocess

from node_agent.host.command import run_command
from node_agent.host.parallel import run_all
from node_agent.ops import gpuhealthparse as parse
from node_agent.wire.replies import wire
from node_agent.wire.replies_gpu import GpuHealth, GpuHealthReport, XidEvent

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, List, Optional, Sequence, Tuple

    from node_agent.host.command import Runner

NVIDIA_SMI_TIMEOUT_S = 15.0  # a host with many GPUs, or one that is failing, answers slowly
LOG_TIMEOUT_S = 10.0
# The kernel log, in this order: dmesg may be refused to users (kernel.dmesg_restrict: EPERM);
# journalctl -k reads the same lines where the user may read the system journal.
KERNEL_LOGS = (
    ["dmesg", "--ctime"],
    ["dmesg"],
    ["journalctl", "-k", "-o", "short-iso", "--since", "-7 days", "--no-pager", "-q"],
)
_PARTIAL_JOURNAL = "not seeing messages from other users and the system"


def gather(request: Dict[str, Any], control: Any) -> Dict[str, Any]:
    return wire(health_report(socket.gethostname()))


def health_report(hostname: str, run: Optional[Runner] = None) -> GpuHealthReport:
    """The host's report; `run` runs one command (tests give recorded outputs)."""
    runner = run or run_command
    gpus_found: List[Tuple[bool, Tuple[GpuHealth, ...], Optional[str], Tuple[str, ...]]] = []
    xids_found: List[Tuple[Tuple[XidEvent, ...], Optional[str], Optional[str]]] = []
    (_, gpus_err), (_, xids_err) = run_all([lambda: gpus_found.append(query_gpus(runner)),
                                            lambda: xids_found.append(read_xids(runner))])
    gpus = gpus_found[0] if gpus_found else (True, (), "nvidia-smi could not run: %s" % gpus_err, ())
    xids = xids_found[0] if xids_found else ((), None, "the kernel log could not be read: %s" % xids_err)
    present, found, error, unsupported = gpus
    if not present:  # no nvidia-smi: a host without GPU (its kernel log has no Xid to read)
        return GpuHealthReport(hostname, False, (), None, (), (), None, None)
    events, source, log_error = xids
    return GpuHealthReport(hostname, True, found, error, unsupported, events, source, log_error)


def _query(run: Runner, fields: Sequence[str]) -> Dict[str, Any]:
    try:
        code, out = run(parse.query_argv(fields), NVIDIA_SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"gpus": [], "lost": [], "error": "nvidia-smi did not answer in %.0f s" % NVIDIA_SMI_TIMEOUT_S,
                "refused": None}
    return parse.parse_health(out, fields, code)


def query_gpus(run: Runner) -> Tuple[bool, Tuple[GpuHealth, ...], Optional[str], Tuple[str, ...]]:
    """(nvidia-smi is installed, the GPUs, the host's error, the fields this driver refused)."""
    try:
        result = _query(run, parse.HEALTH_FIELDS)
    except FileNotFoundError:
        return False, (), None, ()
    except OSError as exc:
        return True, (), "nvidia-smi could not run: %s" % exc, ()
    unsupported: List[str] = []
    if result["refused"] is not None:
        result, unsupported = _grouped(run)
    gpus = [_gpu(row) for row in result["gpus"]]
    gpus += [_lost(row) for row in result["lost"]]
    return True, tuple(gpus), result["error"], tuple(unsupported)


def _grouped(run: Runner) -> Tuple[Dict[str, Any], List[str]]:
    """The full query was refused: the base fields, then each group on its own (the throttle
    mask under its new name where the old one is refused)."""
    base = _query(run, parse.BASE_FIELDS)
    unsupported: List[str] = []
    if base["error"] is not None or base["refused"] is not None:
        return base, list(parse.HEALTH_FIELDS[len(parse.BASE_FIELDS):])
    for group in parse.FIELD_GROUPS:
        part = _query(run, ("index", *group))
        if part["refused"] == parse.THROTTLE_FIELD:
            part = _query(run, ("index", parse.THROTTLE_RENAMED))
        if part["refused"] is not None or part["error"] is not None:
            unsupported.extend(group)
            continue
        parse.merge_rows(base["gpus"], part["gpus"])
    return base, unsupported


def _gpu(row: Dict[str, Any]) -> GpuHealth:
    return GpuHealth(
        index=row.get("index"), uuid=row.get("uuid"), name=row.get("name"), bus_id=row.get("bus_id"),
        ecc_uncorrected=row.get("ecc_uncorrected"), retired_pages_pending=row.get("retired_pages_pending"),
        remap_pending=row.get("remap_pending"), remap_failure=row.get("remap_failure"),
        throttle_mask=row.get("throttle_mask"), pcie_gen=row.get("pcie_gen"), pcie_gen_max=row.get("pcie_gen_max"),
        pcie_width=row.get("pcie_width"), pcie_width_max=row.get("pcie_width_max"),
        temperature_c=row.get("temperature_c"), error=row.get("error"))


def _lost(row: Dict[str, Any]) -> GpuHealth:
    return GpuHealth(None, None, None, row["bus_id"], None, None, None, None, None, None, None, None, None, None,
                     error=row["error"])


def read_xids(run: Runner) -> Tuple[Tuple[XidEvent, ...], Optional[str], Optional[str]]:
    """(the last Xid events, the command that read the log, why no log could be read)."""
    tried = []
    for argv in KERNEL_LOGS:
        try:
            code, out = run(list(argv), LOG_TIMEOUT_S)
        except FileNotFoundError:
            tried.append("%s: not installed" % argv[0])
            continue
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append("%s: %s" % (argv[0], exc))
            continue
        if code != 0:
            last = out.strip().splitlines()
            tried.append(last[-1] if last else "%s exited %d" % (argv[0], code))
            continue
        events = tuple(XidEvent(e["pci"], e["xid"], e["text"], e["when"]) for e in parse.parse_xids(out))
        partial = None
        if _PARTIAL_JOURNAL in out and not events:
            partial = ("journalctl shows this user only their own messages (add the user to the "
                       "systemd-journal or adm group)")
        return events, " ".join(argv[:2]), partial
    return (), None, "; ".join(tried) or "no kernel log reader"
