"""Every doctor check, in table column order; a check that raises becomes a FAIL finding."""

from __future__ import annotations

import traceback

from orchestrator.checks import agreement, checkpoint, clock, firewall, ifname, names, nccl, node, port, restarts
from orchestrator.checks import ssh as ssh_check
from orchestrator.checks.base import Check, fail
from orchestrator.checks.model import Finding, Observations

CHECKS: tuple[tuple[str, Check], ...] = (
    ("ssh", ssh_check.check),
    ("python", node.check_python),
    ("gpu", node.check_gpu),
    ("nproc", node.check_nproc),
    ("versions", agreement.check_versions),
    ("workdir", agreement.check_workdir),
    ("checkpoint", checkpoint.check),
    ("restarts", restarts.check),
    ("firewall", firewall.check),
    ("port", port.check),
    ("ifname", ifname.check),
    ("nccl", nccl.check),
    ("dns", names.check),
    ("clock", clock.check),
)


def run_check(name: str, check: Check, obs: Observations) -> list[Finding]:
    try:
        return check(obs)
    except Exception as exc:
        return [fail(name, None, f"the {name} check crashed: {type(exc).__name__}: {exc}",
                     traceback.format_exc(limit=3), "this is a ddpctl bug: please report it")]


def run_checks(obs: Observations, only: tuple[str, ...] | None = None) -> list[Finding]:
    """Every check (or those named in `only`: the launch runs a few), in table order."""
    findings: list[Finding] = []
    for name, check in CHECKS:
        if only is None or name in only:
            findings += run_check(name, check, obs)
    return findings
