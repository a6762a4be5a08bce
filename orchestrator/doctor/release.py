"""`ddpctl hosts --release HOST --check`: a repaired host comes back with a measurement, not a
promise. The deep checks run on it beside hosts of its inventory the ledger knows good (a good host
first, so the check's coordinator is not the host in question); it is released only where no
check names it and the deep figures came back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from inventory import ConfigError, Host, Inventory
from orchestrator.checks.model import CheckStatus, Finding, Report
from orchestrator.doctor.runner import DoctorRequest, LaunchPathChecks, run
from orchestrator.hostops.hostbook import Released, hosts_view, release_host
from orchestrator.hostops.ledger import Ledger
from orchestrator.hostops.quarantine import LedgerState
from orchestrator.remote.ssh_options import Connection

PARTNERS = 3  # known-good hosts it is measured against (a host verdict rests on two partners at least)
MIN_PARTNERS = 2


@dataclass(frozen=True)
class ReleaseCheck:
    """What the check found, and the release where it passed."""

    host: str
    partners: tuple[str, ...]
    report: Report
    held_by: tuple[Finding, ...]  # the findings that name the host (or say the check did not run)
    released: Released | None
    warnings: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.released is not None


def known_good(inventory: Inventory, host: Host, ledger: Ledger | None = None) -> tuple[list[Host], list[str]]:
    """The inventory's other hosts the ledger holds ok, as listed."""
    view = hosts_view(inventory, ledger)
    ok = {row.record.name for row in view.rows if row.judgement.state is LedgerState.OK}
    return [h for h in inventory.hosts if h.name != host.name and h.name in ok], view.warnings


def release_with_check(inventory: Inventory, name: str, connection: Connection, runs_dir: Path,
                       timeout: float = 120.0, notice: Callable[[str], None] = lambda _: None,
                       ledger: Ledger | None = None) -> ReleaseCheck:
    """Run doctor --deep on `name` and PARTNERS known-good hosts; release it where nothing names it."""
    host = inventory.get(name)
    if host is None:
        raise ConfigError(f"no host {name} in the inventory {inventory.source}", key="--release",
                          hint="give a host's name or address as the inventory lists it")
    good, warnings = known_good(inventory, host, ledger)
    if len(good) < MIN_PARTNERS:
        raise ConfigError(f"--check needs {MIN_PARTNERS} hosts the ledger knows good beside {host.name} "
                          f"(it has {len(good)}: {', '.join(h.name for h in good) or 'none'})", key="--check",
                          hint="run `ddpctl doctor -i <inventory> --deep` on the others first, or release "
                               "without --check")
    partners = good[:PARTNERS]
    subset = replace(inventory, hosts=(partners[0], host, *partners[1:]))
    notice(f"measuring {host.name} against {', '.join(h.name for h in partners)} (doctor --deep)")
    checked = run(DoctorRequest(subset, connection, timeout=timeout,
                                launch_path=LaunchPathChecks(deep=True, runs_dir=runs_dir)), notice)
    report = checked.report
    held = tuple(f for f in report.findings if f.status in (CheckStatus.WARN, CheckStatus.FAIL)
                 and (f.host == host.name or (f.host is None and f.status is CheckStatus.FAIL)))
    if report.deep is None and not held:
        held = (Finding("links", CheckStatus.FAIL, None, "the deep checks did not run"),)
    released = None if held else release_host(inventory, host.name, ledger, how="after a passing deep check")
    return ReleaseCheck(host.name, tuple(h.name for h in partners), report, held, released,
                        tuple(warnings) + checked.ledger_warnings)
