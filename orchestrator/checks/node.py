"""Check 2: the inventory's interpreter, torch on it, and the GPUs (busy ones, and a host's selection)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inventory.gpus import selection, show
from inventory.model import Host
from orchestrator.checks.base import fail, info, listing, ok, torch_of, warn
from orchestrator.checks.model import DoctorContext, Finding, Observations
from orchestrator.checks.selection import busy_apps, selection_findings
from orchestrator.remote.wire import HostFacts

PYTHON = "python"
GPU = "gpu"
TORCH_LOOKUP = "torch_lookup"  # the launch's sub-fact: is torch there (node_agent/torch_facts.py)


def python_findings(name: str, hf: HostFacts, ctx: DoctorContext) -> list[Finding]:
    """The interpreter, and torch in it: imported (doctor's torch fact) or only looked up (the
    launch's torch_lookup fact, which costs no torch import). One judgement for both."""
    py: dict[str, Any] = hf.get("python") or {}
    wanted = py.get("requested", "python3")
    if hf.errors.get("python"):
        return [fail(PYTHON, name, "could not inspect the interpreter", hf.errors["python"])]
    if not py.get("found"):
        return [fail(PYTHON, name, f"interpreter {wanted} not found in the {ctx.session} (the context "
                     "the launch uses)", f"PATH={py.get('path_env', '')}",
                     f"install it on {name}, or set {ctx.python_key.format(host=name)}")]
    for fact, doing in (("torch", "import torch"), (TORCH_LOOKUP, "look torch up")):
        if hf.errors.get(fact):
            return [fail(PYTHON, name, f"running {wanted} to {doing} failed",
                         hf.errors[fact], f"run `{wanted} -c 'import torch'` on {name}")]
    if "torch" not in hf.facts and TORCH_LOOKUP in hf.facts:
        found = hf.get(TORCH_LOOKUP) or {}
        if not found.get("found"):
            return [no_torch(name, py, ctx, "no module named torch on its path (looked up, not imported)")]
        return [ok(PYTHON, name, f"torch found by {py.get('found')}", str(found.get("origin", "")))]
    t = torch_of(hf)
    if not t.get("importable"):
        return [no_torch(name, py, ctx, str(t.get("error", "")))]
    return [ok(PYTHON, name, f"python {t.get('python')}, torch {t.get('version')}, "
               f"CUDA {t.get('cuda') or '-'}, NCCL {t.get('nccl') or '-'}",
               f"interpreter {py.get('found')}")]


def no_torch(name: str, py: Mapping[str, Any], ctx: DoctorContext, evidence: str) -> Finding:
    """The host's interpreter has no torch: every rank would fail to start."""
    return fail(PYTHON, name, f"torch is not importable by {py.get('found')}", evidence,
                f"on {name}: {py.get('found')} -m pip install torch (the version the other "
                f"hosts have), or set {ctx.python_key.format(host=name)} (an interpreter with torch)")


def gpu_findings(name: str, hf: HostFacts, wants_gpu: bool, host: Host | None = None,
                 job_env: Mapping[str, str] | None = None) -> list[Finding]:
    """nvidia-smi's GPUs, and the host's selection where it has one (`gpus = [0, 2]`). Nothing
    where nvidia-smi was not asked (a launch whose hosts select no GPUs)."""
    if "gpus" not in hf.facts and "gpus" not in hf.errors:
        return []
    smi = hf.get("gpus")
    selected = selection(host) if host is not None else None
    if hf.errors.get("gpus"):
        unchecked = f" (gpus = {show(selected)} not checked)" if selected is not None else ""
        return [warn(GPU, name, "nvidia-smi failed" + unchecked, hf.errors["gpus"],
                     f"run nvidia-smi on {name}; reinstall or reload the NVIDIA driver")]
    if host is not None and selected is not None:
        out = selection_findings(host, selected, hf, job_env or {})
    elif not smi or not smi.get("gpus"):
        if wants_gpu:
            return [fail(GPU, name, 'nproc_per_node = "gpu" but no NVIDIA GPU was found',
                         "nvidia-smi: " + ("not installed" if smi is None else "no GPUs"),
                         "set an integer nproc_per_node, or remove this host from the job")]
        return [info(GPU, name, "no NVIDIA GPU: CPU training (gloo) only")]
    else:
        out = _all_gpus(name, smi)
    t = torch_of(hf)
    if smi and smi.get("gpus") and t.get("importable") and not t.get("cuda_available"):
        out.append(warn(GPU, name, f"torch {t.get('version')} cannot use the GPUs "
                        "(CPU build or CUDA unavailable)", str(t.get("cuda_error", "")),
                        "install a CUDA build of torch that matches the driver"))
    return out


def _all_gpus(name: str, smi: Mapping[str, Any]) -> list[Finding]:
    gpus = smi["gpus"]
    models = sorted({f"{g.get('name')} ({g.get('memory_total_mib') or 0:.0f} MiB)" for g in gpus})
    out = [ok(GPU, name, f"{len(gpus)} GPU(s): {listing(models)}")]
    busy = busy_apps(smi)
    if busy:
        out.append(warn(GPU, name, f"{len(busy)} process(es) already use GPUs on {name}",
                        "; ".join(busy), "stop them, or select free GPUs with "
                        f"gpus = [...] for {name} in the inventory"))
    return out


def check_python(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    for name, hf in obs.facts.items():
        out += python_findings(name, hf, obs.ctx)
    return out


def check_gpu(obs: Observations) -> list[Finding]:
    wants_gpu = obs.ctx.nproc_per_node == "gpu"
    hosts = {h.name: h for h in obs.ctx.hosts}
    out: list[Finding] = []
    for name, hf in obs.facts.items():
        out += gpu_findings(name, hf, wants_gpu, hosts.get(name), obs.ctx.env)
    return out


NPROC = "nproc"
OVERSUBSCRIBED = 4  # more CPU ranks than this many per CPU is a typo, not a plan


def nproc_findings(name: str, hf: HostFacts, spec: object, host: Host | None = None,
                   given: str = "nproc_per_node") -> list[Finding]:
    """nproc_per_node (or what `given` names: a host's slots) against the host's CPUs and GPUs
    ("gpu"/"cpu"/"auto" resolve to them; where the host selects GPUs, its ranks see only those)."""
    if "cpu_count" not in hf.facts:
        return []
    cpus = hf.cpu_count
    gpus = hf.gpu_count if "gpu_count" in hf.facts else len((hf.get("gpus") or {}).get("gpus") or [])
    selected = selection(host) if host is not None else None
    gpus = len(selected) if selected is not None else gpus
    evidence = f"{cpus} CPU(s), {gpus} GPU(s)" + (f" (gpus = {show(selected)})" if selected else "")
    if not isinstance(spec, int):
        n = {"gpu": gpus, "cpu": cpus}.get(str(spec), gpus or cpus)
        return [ok(NPROC, name, f"{n} rank(s) (nproc_per_node = {spec}) on {evidence}")] if n else []
    if gpus == 0 and spec > OVERSUBSCRIBED * cpus:
        return [fail(NPROC, name, f"{given} = {spec} would start {spec} ranks on {name}, "
                     f"which has {cpus} CPU(s) and no GPU", evidence,
                     f'set nproc_per_node = {cpus} (or "cpu") in [job], or pass --nproc-per-node {cpus}')]
    if gpus == 0 and spec > cpus:
        return [warn(NPROC, name, f"{given} = {spec} is more than the {cpus} CPU(s) of {name}: "
                     "ranks will share CPUs", evidence, f'set nproc_per_node = {cpus} (or "cpu")')]
    if gpus and spec > gpus:
        return [warn(NPROC, name, f"{given} = {spec} is more than the {gpus} GPU(s) of {name}: "
                     "NCCL refuses two ranks on one GPU", evidence, 'set nproc_per_node = "gpu"')]
    by = f" ({given} = {spec})" if given.endswith("slots") else ""
    return [ok(NPROC, name, f"{spec} rank(s){by} on {evidence}")]


def check_nproc(obs: Observations) -> list[Finding]:
    hosts = {h.name: h for h in obs.ctx.hosts}
    out: list[Finding] = []
    for name, hf in obs.facts.items():
        rule = obs.ctx.nprocs.get(name)  # a host's slots decide where the job sets no nproc_per_node
        if rule is not None and rule.source.endswith("slots"):
            out += nproc_findings(name, hf, rule.spec, hosts.get(name), rule.source)
        else:
            out += nproc_findings(name, hf, obs.ctx.nproc_per_node, hosts.get(name))
    return out
