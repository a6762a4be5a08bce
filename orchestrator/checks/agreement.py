"""Check 3: every host runs the same python/torch/CUDA/NCCL, GPU count and script."""

from __future__ import annotations

from collections.abc import Callable

from inventory.gpus import selection
from orchestrator.checks.base import fail, majority, ok, torch_of, warn
from orchestrator.checks.model import Finding, Observations
from orchestrator.checks.spec import CheckSpec, Runs, implements
from orchestrator.remote.wire import HostFacts, TorchFact, WorkdirFact

VERSIONS = "versions"
WORKDIR = "workdir"
VERSIONS_SPEC = CheckSpec(VERSIONS, order=50, runs=Runs.NODE | Runs.SLURM, column="ver")
WORKDIR_SPEC = CheckSpec(WORKDIR, order=60, runs=Runs.NODE | Runs.LAUNCH | Runs.SLURM, column="wdir")

# (the torch fact's field, label, status when hosts disagree)
COMPARED: tuple[tuple[Callable[[TorchFact], str | None], str, Callable[..., Finding]], ...] = (
    (lambda t: t.version, "torch", fail), (lambda t: t.nccl, "NCCL", fail), (lambda t: t.cuda, "CUDA", warn),
    (lambda t: t.python, "python", warn))
MIN_FREE_BYTES = 1 << 30
CRITICAL_FREE_BYTES = 100 << 20


@implements(VERSIONS_SPEC)
def check_versions(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    usable = {h: torch_of(hf) for h, hf in obs.facts.items() if torch_of(hf).importable}
    for field, label, status in COMPARED:
        values = {h: str(field(t)) for h, t in usable.items()}
        common, odd = majority(values)
        for host in odd:
            out.append(status(VERSIONS, host, f"{label} {values[host]} differs from the other "
                              f"hosts' {common}",
                              "; ".join(f"{h}={v}" for h, v in values.items()),
                              f"install {label} {common} on {host} (all hosts must match)"))
    if obs.ctx.nproc_per_node == "gpu":
        chosen = {h.name: selection(h) for h in obs.ctx.hosts}  # a host's ranks see only its selection
        counts = {h: len(chosen.get(h) or (hf.facts.gpus.gpus if hf.facts.gpus is not None else ()))
                  for h, hf in obs.facts.items()}
        usual, odd = majority(counts)
        for host in odd:
            out.append(fail(VERSIONS, host, f"{host} has {counts[host]} GPU(s), the others "
                            f"{usual}", "; ".join(f"{h}={v}" for h, v in counts.items()),
                            "set an integer nproc_per_node, or select hosts with equal GPUs"))
    if not out and usable:
        t = next(iter(usable.values()))
        out.append(ok(VERSIONS, None, f"all {len(usable)} host(s) agree: torch {t.version},"
                      f" CUDA {t.cuda or '-'}, NCCL {t.nccl or '-'}, "
                      f"python {t.python}"))
    return out


def _disk(host: str, wd: WorkdirFact) -> list[Finding]:
    free = wd.free_bytes
    if free is None:
        return []
    gib = free / (1 << 30)
    if free < CRITICAL_FREE_BYTES:
        return [fail(WORKDIR, host, f"only {gib:.2f} GiB free in {wd.path}",
                     f"free={free} bytes", f"free disk space on {host}")]
    if free < MIN_FREE_BYTES:
        return [warn(WORKDIR, host, f"only {gib:.2f} GiB free in {wd.path}",
                     f"free={free} bytes", f"free disk space on {host} (checkpoints, logs)")]
    return []


def _copy_fix(obs: Observations, host: str, path: str) -> str:
    if obs.ctx.sync_command:
        return f"run `{obs.ctx.sync_command}` (ddpctl up syncs first too)"
    return (f"add a [sync] table to the job file (ddpctl up then copies the code to every host), or copy "
            f"it yourself: rsync -a ./ {host}:{path}/")


@implements(WORKDIR_SPEC)
def check_workdir(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    digests: dict[str, str] = {}
    for host, hf in obs.facts.items():
        wd = hf.facts.workdir
        if wd is None or not wd.exists:
            out.append(fail(WORKDIR, host, f"workdir {workdir_path(hf)} does not exist on {host}",
                            hf.errors.get("workdir", ""), _copy_fix(obs, host, workdir_path(hf))
                            + f", or set workdir for {host} in the inventory"))
            continue
        out += _disk(host, wd)
        script = hf.facts.script
        if obs.ctx.script and script is not None:
            if not script.exists:
                out.append(fail(WORKDIR, host, f"script {script.path} is missing on {host}",
                                "", _copy_fix(obs, host, wd.path)))
            else:
                digests[host] = str(script.sha256)
    local = obs.ctx.script_sha256
    if local is not None:  # [sync]: this machine's copy is the reference
        odd = [h for h, d in digests.items() if d != local]
        whose = "this machine's copy (changed since the last sync?)"
    else:
        _common, odd = majority(digests)
        whose = "the other hosts' copy (stale code?)"
    for host in odd:
        detail = "; ".join(f"{h}={d[:12]}" for h, d in digests.items())
        out.append(warn(WORKDIR, host, f"{obs.ctx.script} on {host} differs from {whose}",
                        detail + (f"; here={local[:12]}" if local else ""),
                        _copy_fix(obs, host, workdir_path(obs.facts[host]))))
    bad = {f.host for f in out if f.status.rank >= 3}
    good = [h for h in obs.facts if h not in bad]
    same = f", {obs.ctx.script} identical on all hosts" if digests and not odd else ""
    out += [ok(WORKDIR, h, f"workdir {workdir_path(obs.facts[h])} present" + same) for h in good]
    return out


def workdir_path(hf: HostFacts) -> str:
    """The workdir as the host expanded it ("None" where it sent no workdir fact)."""
    return str(hf.facts.workdir.path if hf.facts.workdir is not None else None)
