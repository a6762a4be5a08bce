"""Check: for a job with restarts ([restart] max_restarts > 0), whether its first host's interpreter
finds ddpctl. `up --detach` runs the job's restarts there, as a daemon (`python -m orchestrator up`,
orchestrator/restarts/detached.py), and refuses when that interpreter cannot import
`orchestrator.cli`. A warning, never a failure: an attached `up` restarts the job from this machine
without it. Only the first host is judged; the others need no ddpctl.
"""

from __future__ import annotations

from orchestrator.checks.base import ok, skip, warn
from orchestrator.checks.model import Finding, Observations
from orchestrator.checks.spec import CheckSpec, Runs, implements

CHECK = "restarts"
# A column only for a job with restarts.
SPEC = CheckSpec(CHECK, order=80, runs=Runs.NODE, column="rst", shown=lambda ctx: ctx.max_restarts > 0)


@implements(SPEC)
def check(obs: Observations) -> list[Finding]:
    ctx = obs.ctx
    if ctx.max_restarts <= 0:
        return [skip(CHECK, None, "the job has no restarts ([restart] max_restarts = 0)")]
    host = ctx.hosts[0]
    hf = obs.facts.get(host.name)
    if hf is None:
        return []  # no facts from it: the ssh check says why
    python, found = host.python, hf.facts.ddpctl_lookup
    if found is None:
        return [warn(CHECK, host.name, f"could not tell whether ddpctl is importable by {python} on {host.name}",
                     hf.errors.get("ddpctl_lookup") or "the node agent sent no ddpctl_lookup fact",
                     f"check that {python} runs on {host.name}")]
    if found.found:
        return [ok(CHECK, host.name, f"ddpctl is importable by {python} on {host.name}: `up --detach` can run "
                   "the job's restarts from there",
                   f"{found.executable} finds orchestrator.cli at {found.origin or '(no file)'}")]
    evidence = f"{found.executable or python} does not find orchestrator.cli"
    if found.error:
        evidence += f" ({found.error})"
    return [warn(CHECK, host.name, f"ddpctl is not importable by {python} on {host.name}: `up --detach` with "
                 "restarts would refuse", evidence,
                 f"install ddpctl into that interpreter on {host.name}, or run `up` attached (tmux/screen)")]
