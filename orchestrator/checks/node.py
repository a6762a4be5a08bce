"""Check 2: the inventory's interpreter, torch on it, and the GPUs (busy ones, and a host's selection)."""

from __future__ import annotations

from collections.abc import Mapping

from inventory.gpus import selection, show
from inventory.model import Host
from orchestrator.checks.base import fail, info, listing, ok, torch_of, warn
from orchestrator.checks.model import DoctorContext, Finding, Observations
from orchestrator.checks.selection import busy_apps, selection_findings
from orchestrator.checks.spec import CheckSpec, Runs, implements
from orchestrator.remote.wire import HostFacts, NvidiaSmiFact, PythonFact

PYTHON = "python"
GPU = "gpu"
PYTHON_SPEC = CheckSpec(PYTHON, order=20, runs=Runs.NODE | Runs.LAUNCH | Runs.SLURM, column="py")
GPU_SPEC = CheckSpec(GPU, order=30, runs=Runs.NODE | Runs.LAUNCH | Runs.SLURM)
TORCH_LOOKUP = "torch_lookup"  # the launch's sub-fact: is torch there (node_agent/ops/torch_facts.py)


def python_findings(name: str, hf: HostFacts, ctx: DoctorContext) -> list[Finding]:
    """The interpreter, and torch in it: imported (doctor's torch fact) or only looked up (the
    launch's torch_lookup fact, which costs no torch import). One judgement for both."""
    py = hf.facts.python or PythonFact()
    wanted = py.requested
    if hf.errors.get("python"):
        return [fail(PYTHON, name, "could not inspect the interpreter", hf.errors["python"])]
    if not py.found:
        return [fail(PYTHON, name, f"interpreter {wanted} not found in the {ctx.session} (the context "
                     "the launch uses)", f"PATH={py.path_env}",
                     f"install it on {name}, or set {ctx.python_key.format(host=name)}")]
    for fact, doing in (("torch", "import torch"), (TORCH_LOOKUP, "look torch up")):
        if hf.errors.get(fact):
            return [fail(PYTHON, name, f"running {wanted} to {doing} failed",
                         hf.errors[fact], f"run `{wanted} -c 'import torch'` on {name}")]
    lookup = hf.facts.torch_lookup
    if hf.facts.torch is None and lookup is not None:
        if not lookup.found:
            return [no_torch(name, py, ctx, "no module named torch on its path (looked up, not imported)")]
        return [ok(PYTHON, name, f"torch found by {py.found}", str(lookup.origin))]
    t = torch_of(hf)
    if not t.importable:
        return [no_torch(name, py, ctx, t.error or "")]
    return [ok(PYTHON, name, f"python {t.python}, torch {t.version}, "
               f"CUDA {t.cuda or '-'}, NCCL {t.nccl or '-'}",
               f"interpreter {py.found}")]


def no_torch(name: str, py: PythonFact, ctx: DoctorContext, evidence: str) -> Finding:
    """The host's interpreter has no torch: every rank would fail to start."""
    return fail(PYTHON, name, f"torch is not importable by {py.found}", evidence,
                f"on {name}: {py.found} -m pip install torch (the version the other "
                f"hosts have), or set {ctx.python_key.format(host=name)} (an interpreter with torch)")


def gpu_findings(name: str, hf: HostFacts, wants_gpu: bool, host: Host | None = None,
                 job_env: Mapping[str, str] | None = None) -> list[Finding]:
    """nvidia-smi's GPUs, and the host's selection where it has one (`gpus = [0, 2]`). Nothing
    where nvidia-smi was not asked (a launch whose hosts select no GPUs)."""
    if not hf.ran("gpus"):
        return []
    smi = hf.facts.gpus
    selected = selection(host) if host is not None else None
    if hf.errors.get("gpus"):
        unchecked = f" (gpus = {show(selected)} not checked)" if selected is not None else ""
        return [warn(GPU, name, "nvidia-smi failed" + unchecked, hf.errors["gpus"],
                     f"run nvidia-smi on {name}; reinstall or reload the NVIDIA driver")]
    if host is not None and selected is not None:
        out = selection_findings(host, selected, hf, job_env or {})
    elif smi is None or not smi.gpus:
        if wants_gpu:
            return [fail(GPU, name, 'nproc_per_node = "gpu" but no NVIDIA GPU was found',
                         "nvidia-smi: " + ("not installed" if smi is None else "no GPUs"),
                         "set an integer nproc_per_node, or remove this host from the job")]
        return [info(GPU, name, "no NVIDIA GPU: CPU training (gloo) only")]
    else:
        out = _all_gpus(name, smi)
    t = torch_of(hf)
    if smi is not None and smi.gpus and t.importable and not t.cuda_available:
        out.append(warn(GPU, name, f"torch {t.version} cannot use the GPUs "
                        "(CPU build or CUDA unavailable)", t.cuda_error or "",
                        "install a CUDA build of torch that matches the driver"))
    return out


def _all_gpus(name: str, smi: NvidiaSmiFact) -> list[Finding]:
    gpus = smi.gpus
    models = sorted({f"{g.name} ({g.memory_total_mib or 0:.0f} MiB)" for g in gpus})
    out = [ok(GPU, name, f"{len(gpus)} GPU(s): {listing(models)}")]
    busy = busy_apps(smi)
    if busy:
        out.append(warn(GPU, name, f"{len(busy)} process(es) already use GPUs on {name}",
                        "; ".join(busy), "stop them, or select free GPUs with "
                        f"gpus = [...] for {name} in the inventory"))
    return out


@implements(PYTHON_SPEC)
def check_python(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    for name, hf in obs.facts.items():
        out += python_findings(name, hf, obs.ctx)
    return out


@implements(GPU_SPEC)
def check_gpu(obs: Observations) -> list[Finding]:
    wants_gpu = obs.ctx.nproc_per_node == "gpu"
    hosts = {h.name: h for h in obs.ctx.hosts}
    out: list[Finding] = []
    for name, hf in obs.facts.items():
        out += gpu_findings(name, hf, wants_gpu, hosts.get(name), obs.ctx.env)
    return out


NPROC = "nproc"
NPROC_SPEC = CheckSpec(NPROC, order=40, runs=Runs.NODE | Runs.LAUNCH | Runs.SLURM)
OVERSUBSCRIBED = 4  # more CPU ranks than this many per CPU is a typo, not a plan


def nproc_findings(name: str, hf: HostFacts, spec: object, host: Host | None = None,
                   given: str = "nproc_per_node") -> list[Finding]:
    """nproc_per_node (or what `given` names: a host's slots) against the host's CPUs and GPUs
    ("gpu"/"cpu"/"auto" resolve to them; where the host selects GPUs, its ranks see only those)."""
    if hf.facts.cpu_count is None:
        return []
    cpus = hf.cpu_count
    smi = hf.facts.gpus
    gpus = hf.gpu_count if hf.facts.gpu_count is not None else len(smi.gpus) if smi is not None else 0
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


@implements(NPROC_SPEC)
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
