"""The gpu check's part for a host that selects GPUs (`gpus = [0, 2]`): every selected index exists
(an error: the ranks would fail at their first CUDA call) and no other process already uses a
selected GPU (a warning naming the process, its user or ddpctl job, and free GPUs to pick)."""

from __future__ import annotations

from collections.abc import Mapping

from inventory.gpus import env_conflict, show, visible_devices
from inventory.model import Host
from orchestrator.checks.base import fail, listing, ok, torch_of, warn
from orchestrator.checks.model import Finding
from orchestrator.remote.wire import HostFacts, NvidiaSmiFact, SmiApp

GPU = "gpu"


def app_text(app: SmiApp, index: object, me: str | None) -> str:
    """`GPU 1: pid 4242 python (1200 MiB), user alice` (or `ddpctl job X`, or `owner not visible`)."""
    job, user = app.ddpctl_job_id, app.user
    if job:
        owner = f"ddpctl job {job}" + (f" of user {user}" if user and user != me else "")
    elif user:
        owner = f"user {user}" + (" (the login user)" if user == me else "")
    else:
        owner = "owner not visible on the host"
    return (f"GPU {index}: pid {app.pid} {app.name} ({app.used_memory_mib or 0:.0f} MiB), "
            f"{owner}")


def busy_apps(smi: NvidiaSmiFact, only: tuple[int, ...] | None = None) -> list[str]:
    """Every compute process nvidia-smi lists (on the GPUs in `only`, when given), described."""
    index = gpu_indices(smi)
    return [app_text(a, index.get(a.gpu_uuid, "?"), smi.user)
            for a in smi.apps
            if only is None or index.get(a.gpu_uuid) in only]


def gpu_indices(smi: NvidiaSmiFact) -> dict[str, int]:
    """Each GPU's index by its uuid (how nvidia-smi names a process's GPU)."""
    return {g.uuid: g.index for g in smi.gpus}


def present_indices(hf: HostFacts) -> tuple[list[int], str]:
    """The host's GPU indices and where they come from: nvidia-smi's list; where nvidia-smi is not
    installed, the driver's GPU count (the launch's gpu_count) or torch's device count (doctor's)."""
    smi = hf.facts.gpus
    if smi is not None:
        listed = [g.index for g in smi.gpus]
        return listed, "nvidia-smi indices: " + (listing(map(str, listed), 16) if listed else "no GPUs")
    if hf.facts.gpu_count is not None:
        return list(range(hf.gpu_count)), f"nvidia-smi is not installed; the driver lists {hf.gpu_count} GPU(s)"
    count = torch_of(hf).device_count or 0
    return list(range(count)), f"nvidia-smi is not installed; torch sees {count} GPU(s)"


def selection_findings(host: Host, selected: tuple[int, ...], hf: HostFacts,
                       job_env: Mapping[str, str]) -> list[Finding]:
    """The selection against the host's GPUs (nvidia-smi's fact {"gpus", "apps", "user"}, where
    nvidia-smi is installed) and against an explicit CUDA_VISIBLE_DEVICES in the job env."""
    name = host.name
    out: list[Finding] = []
    clash = env_conflict(host, job_env)
    if clash is not None:
        out.append(fail(GPU, name, f'CUDA_VISIBLE_DEVICES = "{clash}" in the job env contradicts '
                        f"gpus = {show(selected)} of {name}", "",
                        "drop CUDA_VISIBLE_DEVICES from the job's [env]: ddpctl sets it from gpus"))
    present, evidence = present_indices(hf)
    missing = [i for i in selected if i not in present]
    if missing:
        return [*out, _missing(name, selected, missing, present, evidence)]
    smi = hf.facts.gpus or NvidiaSmiFact()
    models = sorted({g.name for g in smi.gpus if g.index in selected})
    out.append(ok(GPU, name, f"gpus = {show(selected)} of {len(present)} GPU(s): "
                  f"CUDA_VISIBLE_DEVICES={visible_devices(selected)}", listing(models) or evidence))
    busy = busy_apps(smi, selected)
    if busy:
        out.append(warn(GPU, name, f"{len(busy)} process(es) already use the GPUs selected on {name}",
                        "; ".join(busy), _busy_fix(name, selected, smi, present)))
    return out


def _missing(name: str, selected: tuple[int, ...], missing: list[int], present: list[int],
             evidence: str) -> Finding:
    which = f"GPU {missing[0]}" if len(missing) == 1 else f"GPUs {', '.join(map(str, missing))}"
    if not present:
        return fail(GPU, name, f"gpus = {show(selected)} selects {which}, but {name} has no NVIDIA GPU",
                    evidence, f"remove gpus from {name}'s entry in the inventory (it has no GPU), or fix "
                    "its NVIDIA driver")
    keep = [i for i in selected if i in present]
    pick = (keep + [i for i in present if i not in keep])[:len(selected)]
    return fail(GPU, name, f"gpus = {show(selected)} selects {which}, which {name} does not have "
                f"(it has {len(present)} GPU(s))", evidence,
                f"set gpus = {show(tuple(pick))} for {name} in the inventory (nvidia-smi's indices), "
                'or gpus = "auto" for all of them')


def _busy_fix(name: str, selected: tuple[int, ...], smi: NvidiaSmiFact, present: list[int]) -> str:
    index = gpu_indices(smi)
    used = {index.get(a.gpu_uuid) for a in smi.apps}
    jobs = sorted({a.ddpctl_job_id for a in smi.apps  # the login user's jobs only
                   if a.ddpctl_job_id and index.get(a.gpu_uuid) in selected
                   and a.user in (None, smi.user)})
    free = [i for i in present if i not in used]
    fixes = [f"ddpctl down {job}" for job in jobs]
    if len(free) >= len(selected):
        fixes.append(f"select free GPUs: gpus = {show(tuple(free[:len(selected)]))} for {name} in the inventory")
    else:
        fixes.append("wait for those processes to end, or ask their owners")
    return "; or ".join(fixes)
