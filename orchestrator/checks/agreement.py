"""Check 3: every host runs the same python/torch/CUDA/NCCL, GPU count and script."""

from __future__ import annotations

from typing import Any

from inventory.gpus import selection
from orchestrator.checks.base import fail, majority, ok, torch_of, warn
from orchestrator.checks.model import Finding, Observations

VERSIONS = "versions"
WORKDIR = "workdir"

# (torch fact, label, status when hosts disagree)
COMPARED = (("version", "torch", fail), ("nccl", "NCCL", fail), ("cuda", "CUDA", warn),
            ("python", "python", warn))
MIN_FREE_BYTES = 1 << 30
CRITICAL_FREE_BYTES = 100 << 20


def check_versions(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    usable = {h: torch_of(hf) for h, hf in obs.facts.items() if torch_of(hf).get("importable")}
    for key, label, status in COMPARED:
        values = {h: str(t.get(key)) for h, t in usable.items()}
        common, odd = majority(values)
        for host in odd:
            out.append(status(VERSIONS, host, f"{label} {values[host]} differs from the other "
                              f"hosts' {common}",
                              "; ".join(f"{h}={v}" for h, v in values.items()),
                              f"install {label} {common} on {host} (all hosts must match)"))
    if obs.ctx.nproc_per_node == "gpu":
        chosen = {h.name: selection(h) for h in obs.ctx.hosts}  # a host's ranks see only its selection
        counts = {h: len(chosen.get(h) or (hf.get("gpus") or {}).get("gpus") or [])
                  for h, hf in obs.facts.items()}
        usual, odd = majority(counts)
        for host in odd:
            out.append(fail(VERSIONS, host, f"{host} has {counts[host]} GPU(s), the others "
                            f"{usual}", "; ".join(f"{h}={v}" for h, v in counts.items()),
                            "set an integer nproc_per_node, or select hosts with equal GPUs"))
    if not out and usable:
        t = next(iter(usable.values()))
        out.append(ok(VERSIONS, None, f"all {len(usable)} host(s) agree: torch {t.get('version')},"
                      f" CUDA {t.get('cuda') or '-'}, NCCL {t.get('nccl') or '-'}, "
                      f"python {t.get('python')}"))
    return out


def _disk(host: str, wd: dict[str, Any]) -> list[Finding]:
    free = wd.get("free_bytes")
    if free is None:
        return []
    gib = free / (1 << 30)
    if free < CRITICAL_FREE_BYTES:
        return [fail(WORKDIR, host, f"only {gib:.2f} GiB free in {wd.get('path')}",
                     f"free={free} bytes", f"free disk space on {host}")]
    if free < MIN_FREE_BYTES:
        return [warn(WORKDIR, host, f"only {gib:.2f} GiB free in {wd.get('path')}",
                     f"free={free} bytes", f"free disk space on {host} (checkpoints, logs)")]
    return []


def _copy_fix(obs: Observations, host: str, path: str) -> str:
    if obs.ctx.sync_command:
        return f"run `{obs.ctx.sync_command}` (ddpctl up syncs first too)"
    return (f"add a [sync] table to the job file (ddpctl up then copies the code to every host), or copy "
            f"it yourself: rsync -a ./ {host}:{path}/")


def check_workdir(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    digests: dict[str, str] = {}
    for host, hf in obs.facts.items():
        wd = hf.get("workdir") or {}
        if not wd.get("exists"):
            out.append(fail(WORKDIR, host, f"workdir {wd.get('path')} does not exist on {host}",
                            hf.errors.get("workdir", ""), _copy_fix(obs, host, str(wd.get("path")))
                            + f", or set workdir for {host} in the inventory"))
            continue
        out += _disk(host, wd)
        script = hf.get("script")
        if obs.ctx.script and isinstance(script, dict):
            if not script.get("exists"):
                out.append(fail(WORKDIR, host, f"script {script.get('path')} is missing on {host}",
                                "", _copy_fix(obs, host, str(wd.get("path")))))
            else:
                digests[host] = str(script.get("sha256"))
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
                        _copy_fix(obs, host, str((obs.facts[host].get("workdir") or {}).get("path")))))
    bad = {f.host for f in out if f.status.rank >= 3}
    good = [h for h in obs.facts if h not in bad]
    same = f", {obs.ctx.script} identical on all hosts" if digests and not odd else ""
    out += [ok(WORKDIR, h, f"workdir {(obs.facts[h].get('workdir') or {}).get('path')} present"
               + same) for h in good]
    return out
