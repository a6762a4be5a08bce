"""Check 2: the inventory's interpreter, torch on it, and the GPUs (busy ones included)."""

from __future__ import annotations

from typing import Any

from orchestrator.doctor.checks.base import fail, info, listing, ok, torch_of, warn
from orchestrator.doctor.model import DoctorContext, Finding, Observations
from orchestrator.remote.wire import HostFacts

PYTHON = "python"
GPU = "gpu"


def python_findings(name: str, hf: HostFacts, ctx: DoctorContext) -> list[Finding]:
    py: dict[str, Any] = hf.get("python") or {}
    wanted = py.get("requested", "python3")
    if hf.errors.get("python"):
        return [fail(PYTHON, name, "could not inspect the interpreter", hf.errors["python"])]
    if not py.get("found"):
        return [fail(PYTHON, name, f"interpreter {wanted} not found in the {ctx.session} (the context "
                     "the launch uses)", f"PATH={py.get('path_env', '')}",
                     f"install it on {name}, or set {ctx.python_key.format(host=name)}")]
    if hf.errors.get("torch"):
        return [fail(PYTHON, name, f"running {wanted} to import torch failed",
                     hf.errors["torch"], f"run `{wanted} -c 'import torch'` on {name}")]
    t = torch_of(hf)
    if not t.get("importable"):
        return [fail(PYTHON, name, f"torch is not importable by {py.get('found')}",
                     str(t.get("error", "")),
                     f"on {name}: {py.get('found')} -m pip install torch (the version the other "
                     f"hosts have), or set {ctx.python_key.format(host=name)} (an interpreter with torch)")]
    return [ok(PYTHON, name, f"python {t.get('python')}, torch {t.get('version')}, "
               f"CUDA {t.get('cuda') or '-'}, NCCL {t.get('nccl') or '-'}",
               f"interpreter {py.get('found')}")]


def _busy(gpus: list[dict[str, Any]], apps: list[dict[str, Any]]) -> list[str]:
    index = {g.get("uuid"): g.get("index") for g in gpus}
    return [f"GPU {index.get(a.get('gpu_uuid'), '?')}: pid {a.get('pid')} {a.get('name')} "
            f"({a.get('used_memory_mib') or 0:.0f} MiB)" for a in apps]


def gpu_findings(name: str, hf: HostFacts, wants_gpu: bool) -> list[Finding]:
    smi = hf.get("gpus")
    t = torch_of(hf)
    if hf.errors.get("gpus"):
        return [warn(GPU, name, "nvidia-smi failed", hf.errors["gpus"],
                     f"run nvidia-smi on {name}; reinstall or reload the NVIDIA driver")]
    if not smi or not smi.get("gpus"):
        if wants_gpu:
            return [fail(GPU, name, 'nproc_per_node = "gpu" but no NVIDIA GPU was found',
                         "nvidia-smi: " + ("not installed" if smi is None else "no GPUs"),
                         "set an integer nproc_per_node, or remove this host from the job")]
        return [info(GPU, name, "no NVIDIA GPU: CPU training (gloo) only")]
    gpus, apps = smi["gpus"], smi.get("apps") or []
    models = sorted({f"{g.get('name')} ({g.get('memory_total_mib') or 0:.0f} MiB)" for g in gpus})
    out = [ok(GPU, name, f"{len(gpus)} GPU(s): {listing(models)}")]
    if t.get("importable") and not t.get("cuda_available"):
        out.append(warn(GPU, name, f"torch {t.get('version')} cannot use the GPUs "
                        "(CPU build or CUDA unavailable)", str(t.get("cuda_error", "")),
                        "install a CUDA build of torch that matches the driver"))
    busy = _busy(gpus, apps)
    if busy:
        out.append(warn(GPU, name, f"{len(busy)} process(es) already use GPUs on {name}",
                        "; ".join(busy), "stop them, or restrict the job with "
                        "CUDA_VISIBLE_DEVICES in [env]"))
    return out


def check_python(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    for name, hf in obs.facts.items():
        out += python_findings(name, hf, obs.ctx)
    return out


def check_gpu(obs: Observations) -> list[Finding]:
    wants_gpu = obs.ctx.nproc_per_node == "gpu"
    out: list[Finding] = []
    for name, hf in obs.facts.items():
        out += gpu_findings(name, hf, wants_gpu)
    return out


NPROC = "nproc"
OVERSUBSCRIBED = 4  # more CPU ranks than this many per CPU is a typo, not a plan


def nproc_findings(name: str, hf: HostFacts, spec: object) -> list[Finding]:
    """nproc_per_node against the host's CPUs and GPUs ("gpu"/"cpu"/"auto" resolve to them)."""
    if "cpu_count" not in hf.facts:
        return []
    cpus = hf.cpu_count
    gpus = hf.gpu_count if "gpu_count" in hf.facts else len((hf.get("gpus") or {}).get("gpus") or [])
    evidence = f"{cpus} CPU(s), {gpus} GPU(s)"
    if not isinstance(spec, int):
        n = {"gpu": gpus, "cpu": cpus}.get(str(spec), gpus or cpus)
        return [ok(NPROC, name, f"{n} rank(s) (nproc_per_node = {spec}) on {evidence}")] if n else []
    if gpus == 0 and spec > OVERSUBSCRIBED * cpus:
        return [fail(NPROC, name, f"nproc_per_node = {spec} would start {spec} ranks on {name}, "
                     f"which has {cpus} CPU(s) and no GPU", evidence,
                     f'set nproc_per_node = {cpus} (or "cpu") in [job], or pass --nproc-per-node {cpus}')]
    if gpus == 0 and spec > cpus:
        return [warn(NPROC, name, f"nproc_per_node = {spec} is more than the {cpus} CPU(s) of {name}: "
                     "ranks will share CPUs", evidence, f'set nproc_per_node = {cpus} (or "cpu")')]
    if gpus and spec > gpus:
        return [warn(NPROC, name, f"nproc_per_node = {spec} is more than the {gpus} GPU(s) of {name}: "
                     "NCCL refuses two ranks on one GPU", evidence, 'set nproc_per_node = "gpu"')]
    return [ok(NPROC, name, f"{spec} rank(s) on {evidence}")]


def check_nproc(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    for name, hf in obs.facts.items():
        out += nproc_findings(name, hf, obs.ctx.nproc_per_node)
    return out
