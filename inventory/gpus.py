"""A host's GPU selection (`gpus = [0, 2]`): the environment that applies it, the GPU count its
ranks see, and the located error when an explicit CUDA_VISIBLE_DEVICES says otherwise."""

from __future__ import annotations

from collections.abc import Mapping

from inventory.errors import ConfigError
from inventory.model import Host, Job
from inventory.tomlsource import read_toml

VISIBLE = "CUDA_VISIBLE_DEVICES"
ORDER = "CUDA_DEVICE_ORDER"
PCI_ORDER = "PCI_BUS_ID"  # CUDA then numbers the GPUs as nvidia-smi does (its default differs)
JOB_ENV_FLAG = "--env"


def selection(host: Host) -> tuple[int, ...] | None:
    """The GPU indices the host's ranks use, or None: all of them."""
    return host.gpus if isinstance(host.gpus, tuple) else None


def visible_devices(indices: tuple[int, ...]) -> str:
    """`(0, 2)` -> "0,2", the CUDA_VISIBLE_DEVICES value."""
    return ",".join(str(i) for i in indices)


def show(indices: tuple[int, ...]) -> str:
    """`(0, 2)` -> "[0, 2]", as the inventory writes it."""
    return "[" + ", ".join(str(i) for i in indices) + "]"


def declared_gpus(host: Host) -> int | None:
    """The GPUs the host's ranks use as the inventory says (the selection's length, or a count);
    None: detect them on the host."""
    sel = selection(host)
    if sel is not None:
        return len(sel)
    return host.gpus if isinstance(host.gpus, int) else None


def selection_env(host: Host, env: Mapping[str, str]) -> dict[str, str]:
    """What a selection adds to the env a host's torchrun gets (`env`: the rest of it):
    CUDA_VISIBLE_DEVICES, and CUDA_DEVICE_ORDER=PCI_BUS_ID unless `env` sets an order, so that
    index 2 is the GPU nvidia-smi (and doctor) calls 2."""
    sel = selection(host)
    if sel is None:
        return {}
    return {VISIBLE: visible_devices(sel), ORDER: env.get(ORDER) or PCI_ORDER}


def same_devices(value: str, indices: tuple[int, ...]) -> bool:
    """An explicit CUDA_VISIBLE_DEVICES that names exactly the selected GPUs, in order."""
    return [p.strip() for p in value.split(",")] == [str(i) for i in indices]


def env_conflict(host: Host, env: Mapping[str, str]) -> str | None:
    """The explicit CUDA_VISIBLE_DEVICES in `env` that contradicts the host's selection, or None."""
    sel = selection(host)
    value = env.get(VISIBLE)
    if sel is None or value is None or same_devices(value, sel):
        return None
    return value


def check_job_env(job: Job) -> None:
    """A job env (its [env] or -e) with a CUDA_VISIBLE_DEVICES other than a selected host's
    `gpus` is an error located at its key: ddpctl will not guess which one was meant."""
    clashes = [h for h in job.hosts if env_conflict(h, job.env) is not None]
    if not clashes:
        return
    value = job.env[VISIBLE]
    names = ", ".join(f"{h.name} (gpus = {show(selection(h) or ())})" for h in clashes)
    where = f" in {job.inventory.source}" if job.inventory.source is not None else ""
    message = (f'CUDA_VISIBLE_DEVICES = "{value}" in the job env contradicts the GPU selection of '
               f"{names}{where}")
    hint = ("drop CUDA_VISIBLE_DEVICES from the job: ddpctl sets it on each host from its gpus "
            "selection (or drop gpus from those hosts in the inventory to choose GPUs yourself)")
    if job.source is not None and job.source.is_file():
        doc = read_toml(job.source, "job file")
        written = doc.data.get("env")
        if isinstance(written, dict) and written.get(VISIBLE) == value:
            raise doc.error(f"env.{VISIBLE}", message, hint, value=value)
    raise ConfigError(message, key=JOB_ENV_FLAG, hint=hint)
