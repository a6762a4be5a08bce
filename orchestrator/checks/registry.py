"""Runs doctor's checks of the facts in table order (catalog.py finds them by their specs); a check
that raises becomes a FAIL finding."""

from __future__ import annotations

import traceback

from orchestrator.checks import catalog
from orchestrator.checks.base import Check, fail
from orchestrator.checks.model import Finding, Observations
from orchestrator.checks.spec import Runs


def checks(where: Runs = Runs.NODE) -> tuple[tuple[str, Check], ...]:
    """Each check of the facts that runs in `where` (every one by default; Runs.LAUNCH: before a
    launch, Runs.SLURM: in the Slurm doctor's allocation), with its function, in table order."""
    return tuple((spec.name, catalog.body(spec)) for spec in catalog.specs(where | Runs.NODE))


def run_check(name: str, check: Check, obs: Observations) -> list[Finding]:
    try:
        return check(obs)
    except Exception as exc:
        return [fail(name, None, f"the {name} check crashed: {type(exc).__name__}: {exc}",
                     traceback.format_exc(limit=3), "this is a ddpctl bug: please report it")]


def run_checks(obs: Observations, where: Runs = Runs.NODE) -> list[Finding]:
    """Every check of the facts (or those that run in `where`: the launch runs a few), in table order."""
    findings: list[Finding] = []
    for name, check in checks(where):
        findings += run_check(name, check, obs)
    return findings
