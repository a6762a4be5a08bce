"""doctor --deep's GPU health check: the gpu_health op's report of one host (node_agent/wire/replies_gpu.py)
-> findings. Pure: uncorrectable ECC errors, pending page retirement and row remapping, a row remap
failure, active hardware throttling, a PCIe link narrower than it can be, and the kernel log's Xid
lines, each with its evidence and fix; one OK finding for a healthy host. `[N/A]` (a value the GPU
does not report) is unknown, never a fault. Only the host's selected GPUs count (`gpus = [0, 2]`),
and every GPU the driver lost (its index is unknown: it may be one of them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.checks.base import fail, info, ok, skip, warn
from orchestrator.checks.model import CheckStatus, Finding
from orchestrator.checks.spec import CheckSpec, Runs
from orchestrator.errors import HostError
from orchestrator.remote.wire import GpuHealth, GpuHealthReport, XidEvent

GPU_HEALTH = "gpu_health"
SPEC = CheckSpec(GPU_HEALTH, order=190, runs=Runs.DEEP, column="gpuh")

# clocks_throttle_reasons.active bits (nvml.h nvmlClocksEventReason*). Idle (0x1), application
# clocks (0x2), SW power cap (0x4), sync boost (0x10) and display clocks (0x100) are normal.
IDLE = 0x1
SW_POWER_CAP = 0x4  # an idle GPU may show this one instead of IDLE (a recorded RTX 2080 SUPER at Gen1 of Gen3)
THROTTLE_FAULTS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
                   0x80: "HW power brake slowdown"}


@dataclass(frozen=True)
class Xid:
    """What a well-known Xid means, whether the GPU needs a reset or service, and the fix."""

    meaning: str
    fatal: bool
    fix: str


_RESET = "drain the host, then reset the GPU (`nvidia-smi -r -i {index}`, with no process on it) or reboot"
_APP = ("usually the application's fault: check the job's own error; if it recurs on this GPU only, run "
        "`dcgmi diag -r 3` on it")
_RMA = "; if it comes back, run `dcgmi diag -r 3` and have the GPU replaced (RMA)"
# The Xids a training job meets most (NVIDIA's Xid catalog: docs.nvidia.com/deploy/xid-errors).
XIDS: dict[int, Xid] = {
    13: Xid("graphics engine exception (an illegal address or instruction in a kernel)", False, _APP),
    31: Xid("GPU memory page fault (a kernel used an invalid address)", False, _APP),
    43: Xid("the GPU stopped an application after its fault (the GPU itself is fine)", False, _APP),
    45: Xid("preemptive cleanup: a process on the GPU was stopped (kill, Ctrl-C, reset, or an earlier Xid)",
            False, "nothing if the job was stopped on purpose; else look for the Xid before it"),
    48: Xid("uncorrectable double-bit ECC error in GPU memory", True, _RESET + _RMA),
    61: Xid("internal micro-controller warning", False, "if it recurs: " + _RESET),
    62: Xid("internal micro-controller halted", False, _RESET + _RMA),
    63: Xid("ECC page retirement or row remapping recorded (a reset applies it)", True, _RESET),
    64: Xid("ECC page retirement or row remapping failed to be recorded", True, _RESET + _RMA),
    68: Xid("video decoder (NVDEC) exception", False, _APP),
    74: Xid("NVLink error", True, "run `nvidia-smi nvlink -s` and check nvidia-fabricmanager; " + _RESET + _RMA),
    79: Xid("GPU has fallen off the bus (the host lost it over PCIe)", True,
            "drain and reboot the host; reseat the GPU and check its riser, slot and power cables" + _RMA),
    92: Xid("high single-bit ECC error rate", True, _RESET + _RMA),
    94: Xid("contained ECC error (the application using that memory was stopped)", True, _RESET),
    95: Xid("uncontained ECC error (every application on the GPU may be affected)", True, _RESET + _RMA),
    119: Xid("GSP RPC timeout (the GPU's system processor stopped answering)", True,
             _RESET + "; update the driver if it recurs" + _RMA),
    120: Xid("GSP error (the GPU's system processor failed)", True, _RESET + "; update the driver if it recurs" + _RMA),
}


def pci_key(address: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of nvidia-smi's `00000000:3B:00.0` or the kernel log's `0000:3b:00`."""
    if not address:
        return None
    parts = address.removeprefix("PCI:").split(":")
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
    except (IndexError, ValueError):
        return None


def kept_gpus(report: GpuHealthReport, selected: tuple[int, ...] | None) -> list[GpuHealth]:
    """The host's selected GPUs, and every GPU the driver lost (index unknown)."""
    return [g for g in report.gpus if selected is None or g.index is None or g.index in selected]


def gpu_health_findings(host: str, report: GpuHealthReport, selected: tuple[int, ...] | None) -> list[Finding]:
    """One finding per problem of the host's (selected) GPUs, or one OK finding."""
    if not report.nvidia_smi:
        return [skip(GPU_HEALTH, host, "no NVIDIA GPU (nvidia-smi is not installed): nothing to check")]
    if report.gpu_error is not None and not report.gpus:
        return [warn(GPU_HEALTH, host, "nvidia-smi failed: GPU health not checked", report.gpu_error,
                     "run `nvidia-smi` on the host and repair the driver (reload it, or reboot after an upgrade)")]
    gpus = kept_gpus(report, selected)
    findings = [f for g in gpus for f in gpu_findings(host, g)]
    findings += xid_findings(host, report, selected)
    findings += link_notes(host, gpus)
    if report.xid_error is not None:
        findings.append(info(GPU_HEALTH, host, "kernel log not readable: Xid errors not checked", report.xid_error,
                             "let the user read it: `sudo sysctl kernel.dmesg_restrict=0`, or add the user to the "
                             "adm or systemd-journal group"))
    if not any(f.status.rank >= CheckStatus.WARN.rank for f in findings):
        findings.insert(0, healthy(host, report, gpus))
    return findings


def _where(g: GpuHealth) -> str:
    return f"{g.label} ({g.name or 'unknown model'}, {g.bus_id or 'bus id unknown'})"


def gpu_findings(host: str, g: GpuHealth) -> list[Finding]:
    """One GPU's problems (a lost GPU: that alone)."""
    if g.index is None:
        return [fail(GPU_HEALTH, host, f"{g.label} is lost: the driver cannot reach it",
                     f"{g.bus_id}: {g.error}", "drain and reboot the host; if it stays lost, reseat the GPU, "
                     "check its riser and power cables, and have it replaced (RMA)")]
    out = [*memory_findings(host, g), *throttle_findings(host, g), *width_findings(host, g)]
    if g.error:
        out.append(warn(GPU_HEALTH, host, f"{g.label}: nvidia-smi could not read some values",
                        f"{_where(g)}: {g.error}",
                        f"run `nvidia-smi -q -i {g.index}`; a GPU that reads [GPU requires reset]: reset it "
                        f"(`nvidia-smi -r -i {g.index}`) or reboot"))
    return out


def memory_findings(host: str, g: GpuHealth) -> list[Finding]:
    out = []
    if g.ecc_uncorrected:
        out.append(fail(GPU_HEALTH, host, f"{g.label}: {g.ecc_uncorrected} uncorrectable ECC error(s) since the driver "
                        "loaded", f"{_where(g)}: ecc.errors.uncorrected.volatile.total = {g.ecc_uncorrected}",
                        f"drain the host (no new jobs), run `nvidia-smi -q -d ECC -i {g.index}`, then reset the GPU "
                        f"(`nvidia-smi -r -i {g.index}`) or reboot; if the errors come back, have it replaced (RMA)"))
    if g.remap_failure:
        out.append(fail(GPU_HEALTH, host, f"{g.label}: row remapping failed (the memory has no spare rows left)",
                        f"{_where(g)}: remapped_rows.failure = Yes",
                        "drain the host and have the GPU replaced (RMA): it can no longer hide bad memory"))
    if g.remap_pending:
        out.append(warn(GPU_HEALTH, host, f"{g.label}: row remapping pending until the GPU is reset",
                        f"{_where(g)}: remapped_rows.pending = Yes",
                        f"reset the GPU (`nvidia-smi -r -i {g.index}`, with no process on it) or reboot the host "
                        "to apply the remap; `nvidia-smi -q -d ROW_REMAPPER` shows the counts"))
    if g.retired_pages_pending:
        out.append(warn(GPU_HEALTH, host, f"{g.label}: page retirement pending until the GPU is reset",
                        f"{_where(g)}: retired_pages.pending = Yes",
                        f"reset the GPU (`nvidia-smi -r -i {g.index}`, with no process on it) or reboot the host "
                        "to retire the pages; `nvidia-smi -q -d PAGE_RETIREMENT` shows them"))
    return out


def throttle_reasons(mask: int | None) -> list[str]:
    """The active throttle reasons that point at cooling or power (none for idle, SW power cap, ...)."""
    return [] if mask is None else [name for bit, name in THROTTLE_FAULTS.items() if mask & bit]


def throttle_findings(host: str, g: GpuHealth) -> list[Finding]:
    reasons = throttle_reasons(g.throttle_mask)
    if not reasons:
        return []
    temp = f", temperature.gpu = {g.temperature_c:g} C" if g.temperature_c is not None else ""
    return [warn(GPU_HEALTH, host, f"{g.label} is throttled by hardware: {', '.join(reasons)}",
                 f"{_where(g)}: clocks_throttle_reasons.active = 0x{g.throttle_mask:016X}{temp}",
                 "check the cooling (fans, airflow, inlet temperature) and the power (PSU, cables, power "
                 f"brake signal); `nvidia-smi -q -d PERFORMANCE -i {g.index}` shows the reasons and their counters")]


def width_findings(host: str, g: GpuHealth) -> list[Finding]:
    if g.pcie_width is None or g.pcie_width_max is None or g.pcie_width >= g.pcie_width_max:
        return []
    return [warn(GPU_HEALTH, host, f"{g.label}: PCIe link is x{g.pcie_width}, narrower than its x{g.pcie_width_max}",
                 f"{_where(g)}: pcie.link.width.current = {g.pcie_width}, pcie.link.width.max = {g.pcie_width_max}",
                 f"reseat the GPU and check its riser and slot (`sudo lspci -vv -s {g.bus_id or '<bus id>'}`: LnkSta "
                 "against LnkCap); host-to-GPU copies run at a fraction of their speed until then")]


def link_notes(host: str, gpus: Sequence[GpuHealth]) -> list[Finding]:
    """A PCIe generation below the GPU's maximum while the GPU looks busy (an idle GPU slows its link
    down to save power: that is normal, and not reported). The throttle mask is the only hint at load
    here, and idle GPUs show IDLE or SW_POWER_CAP: only a mask with neither counts as busy."""
    slow = [g for g in gpus if g.pcie_gen is not None and g.pcie_gen_max is not None and g.pcie_gen < g.pcie_gen_max
            and g.throttle_mask is not None and not g.throttle_mask & (IDLE | SW_POWER_CAP)]
    return [info(GPU_HEALTH, host, f"{g.label}: PCIe Gen{g.pcie_gen} while busy, capable of Gen{g.pcie_gen_max}",
                 f"{_where(g)}: pcie.link.gen.current = {g.pcie_gen}, pcie.link.gen.max = {g.pcie_gen_max}, "
                 f"clocks_throttle_reasons.active = 0x{g.throttle_mask:016X}",
                 "rerun `ddpctl doctor --deep` while a job uses the GPU; if the link stays slow under load, check "
                 "the slot's PCIe generation in the BIOS and the riser") for g in slow]


def xid_findings(host: str, report: GpuHealthReport, selected: tuple[int, ...] | None) -> list[Finding]:
    """One finding per GPU and Xid code: the last line as evidence, with how often it occurred."""
    by_bus = {pci_key(g.bus_id): g for g in report.gpus if g.bus_id}
    groups: dict[tuple[str, int], list[XidEvent]] = {}
    for event in report.xids:
        gpu = by_bus.get(pci_key(event.pci))
        if selected is not None and gpu is not None and gpu.index is not None and gpu.index not in selected:
            continue
        groups.setdefault((event.pci, event.xid), []).append(event)
    return [xid_finding(host, events, by_bus.get(pci_key(pci))) for (pci, _), events in groups.items()]


def xid_finding(host: str, events: list[XidEvent], gpu: GpuHealth | None) -> Finding:
    last = events[-1]
    known = XIDS.get(last.xid)
    where = f"{gpu.label} (PCI:{last.pci})" if gpu is not None else f"PCI:{last.pci}"
    index = str(gpu.index) if gpu is not None and gpu.index is not None else "<index>"
    meaning = known.meaning if known else "see NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)"
    times = f" ({len(events)} times)" if len(events) > 1 else ""
    evidence = f"{last.when + ' ' if last.when else ''}NVRM: Xid (PCI:{last.pci}): {last.xid}, {last.text}"
    fix = known.fix.format(index=index) if known else ("look the Xid up in NVIDIA's catalog; if it recurs, "
                                                       + _RESET.format(index=index))
    make = fail if known is not None and known.fatal else warn
    return make(GPU_HEALTH, host, f"Xid {last.xid} on {where}{times}: {meaning}", evidence, fix)


def healthy(host: str, report: GpuHealthReport, gpus: Sequence[GpuHealth]) -> Finding:
    """`8 GPU(s) healthy: no uncorrectable ECC errors, no throttling, PCIe x16 Gen4`."""
    links = sorted({f"x{g.pcie_width_max} Gen{g.pcie_gen_max}" for g in gpus
                    if g.pcie_width_max is not None and g.pcie_gen_max is not None})
    link = f"PCIe {'/'.join(links)}" if links else "PCIe link unknown"
    models = sorted({g.name for g in gpus if g.name})
    notes = [", ".join(models)] if models else []
    if report.unsupported:
        notes.append("not reported by this driver: " + ", ".join(report.unsupported))
    notes.append(f"kernel log read with `{report.xid_source}`: no Xid" if report.xid_source else "kernel log not read")
    return ok(GPU_HEALTH, host, f"{len(gpus)} GPU(s) healthy: no uncorrectable ECC errors, no throttling, {link}",
              "; ".join(notes))


def unreachable(host: str, error: HostError | Exception) -> Finding:
    """A host whose report did not come back (or whose check crashed): one finding, never a raise."""
    message = error.message if isinstance(error, HostError) else f"{type(error).__name__}: {error}"
    fix = (error.fix if isinstance(error, HostError) and error.fix
           else "rerun `ddpctl doctor` to see the host's own checks")
    return fail(GPU_HEALTH, host, f"GPU health not checked on {host}: {message}", message, fix)
