"""What a doctor check declares about itself, once, in its own module: its name, its column, its place
and where it runs (`CheckSpec`), and, for a check of the hosts' facts, the mark on the function that
runs it (`implements`). catalog.py finds the declarations and builds every list from them."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.checks.base import Check
from orchestrator.checks.model import DoctorContext

MARK = "__ddpctl_check__"


class Runs(enum.Flag):
    """Where a check runs; a check may run in several places (`Runs.NODE | Runs.LAUNCH`)."""

    NODE = enum.auto()  # doctor's table over SSH: a pure function of the hosts' facts and the probe (registry.py)
    # Before every launch too, in up's pre-launch round trip (launch/preflight.py): a check of the facts that
    # predicts a launch that fails or hangs at the rendezvous, or ranks that cannot start (no torch).
    LAUNCH = enum.auto()
    SLURM = enum.auto()  # the Slurm doctor's table: its controller and allocation, or a NODE check on its nodes
    JOB = enum.auto()  # a job doctor launches through the launch path (--smoke, --bandwidth, --deep's host check)
    DEEP = enum.auto()  # doctor --deep


def always(ctx: DoctorContext) -> bool:
    return True


@dataclass(frozen=True)
class CheckSpec:
    """One doctor check: its name (the findings' `check`, `--explain NAME`, `explain/NAME.md`), its
    place in every table and in --explain (`order`, lower first), where it runs, and its column's
    header where shorter than its name (`--explain` takes that too)."""

    name: str
    order: int
    runs: Runs
    column: str = ""
    # Whether doctor's table has a column for this job: a check only some jobs have (it says it
    # skipped, once) has none for the others.
    shown: Callable[[DoctorContext], bool] = always

    @property
    def header(self) -> str:
        return self.column or self.name


def implements(spec: CheckSpec) -> Callable[[Check], Check]:
    """Marks the function that runs `spec` over the hosts' facts (a Runs.NODE check): the registry
    finds it by this mark."""
    def mark(check: Check) -> Check:
        setattr(check, MARK, spec)
        return check
    return mark


def implemented(value: object) -> CheckSpec | None:
    """The spec a module's function is marked as running (`implements`), or None."""
    spec = getattr(value, MARK, None) if inspect.isfunction(value) else None
    return spec if isinstance(spec, CheckSpec) else None
