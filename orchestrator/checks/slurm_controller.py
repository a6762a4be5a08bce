"""Pure checks of a Slurm job against its controller: does the request fit the partition (nodes,
time, GPUs), is the partition up, and does `scancel` find every process (ProctrackType). Input:
parsed `scontrol show config` and `scontrol -o show partition`; output: doctor's findings."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

from inventory.specs import SlurmSpec, time_seconds
from orchestrator.checks.base import fail, info, listing, ok, warn
from orchestrator.checks.model import CheckStatus, Finding
from orchestrator.checks.spec import CheckSpec, Runs
from orchestrator.errors import HostError
from orchestrator.remote.slurm_client import parse_key_values

SLURM, PARTITION, PROCTRACK = "slurm", "partition", "proctrack"
SLURM_SPEC = CheckSpec(SLURM, order=200, runs=Runs.SLURM)
PARTITION_SPEC = CheckSpec(PARTITION, order=210, runs=Runs.SLURM)
PROCTRACK_SPEC = CheckSpec(PROCTRACK, order=220, runs=Runs.SLURM)
UNLIMITED = ("UNLIMITED", "INFINITE")
WEAK_PROCTRACK = {
    "proctrack/linuxproc": "finds a job's processes by parent pid: ones that double-fork (daemonize) escape it",
    "proctrack/pgid": "finds a job's processes by process group: ones that start their own group escape it",
}
NOT_UP = {"DOWN": "jobs queue but none starts", "DRAIN": "it takes no new jobs",
          "INACTIVE": "it takes no jobs"}

@dataclass(frozen=True)
class Controller:
    """What the controller says: its config and every partition (hidden ones too)."""

    config: Mapping[str, str]
    partitions: tuple[Mapping[str, str], ...]


def parse_partitions(text: str) -> tuple[dict[str, str], ...]:
    """`scontrol -o show partition`: one partition per line."""
    return tuple(f for line in text.splitlines() if (f := parse_key_values(line)).get("PartitionName"))


def time_limit_s(text: str | None) -> float | None:
    """Seconds of a Slurm time limit; inf for UNLIMITED/INFINITE; None for NONE or no limit given."""
    if text is None:
        return None
    word = text.strip().upper()
    if word in UNLIMITED:
        return math.inf
    seconds = time_seconds(word)
    return None if seconds is None else float(seconds)


def _count(text: str | None) -> int | None:
    """A count as scontrol prints it; None for UNLIMITED or nothing."""
    return int(text) if text is not None and text.isdigit() else None


def controller_host(spec: SlurmSpec) -> str:
    """The report's row for the controller's findings: the login node, else "slurm"."""
    return spec.login or SLURM




def client_finding(ctrl: Controller, where: str, reached: str) -> Finding:
    c = ctrl.config
    return ok(SLURM, where, f"Slurm {c.get('SLURM_VERSION', '?')} answers on {reached}: cluster "
              f"{c.get('ClusterName', '?')}, controller {c.get('SlurmctldHost[0]', '?')}")


def unreachable_finding(err: HostError, where: str, reached: str) -> Finding:
    return fail(SLURM, where, f"the Slurm client does not answer on {reached}: {err.message}", err.kind.value,
                err.fix or "check that slurmctld runs (`scontrol ping`) and that this machine has the "
                "cluster's slurm.conf (SLURM_CONF), or set [slurm] login = \"<login node>\"")


def proctrack_findings(config: Mapping[str, str], where: str) -> list[Finding]:
    kind = config.get("ProctrackType")
    if kind is None:
        return []
    why = WEAK_PROCTRACK.get(kind)
    if why is None:
        return [ok(PROCTRACK, where, f"ProctrackType={kind}: scancel ends every process of a job")]
    return [warn(PROCTRACK, where, f"ProctrackType={kind} {why}: after scancel or a time limit they stay "
                 "alive on the nodes, holding GPUs and ports", f"ProctrackType = {kind}",
                 "ask the cluster admins for ProctrackType=proctrack/cgroup; until then check the nodes "
                 "after a job ends (ddpctl kill-port on its ports)")]


def pick_partition(partitions: Sequence[Mapping[str, str]], name: str | None) -> Mapping[str, str] | None:
    """The named partition, or (name None) the default one."""
    for part in partitions:
        if (part.get("PartitionName") == name) if name is not None else part.get("Default") == "YES":
            return part
    return None


def missing_partition(partitions: Sequence[Mapping[str, str]], name: str | None, where: str) -> Finding:
    shown = [p["PartitionName"] for p in partitions if p.get("Hidden") != "YES"]
    evidence = f"partitions: {listing(shown, 20) or '(none)'}"
    if name is None:
        return fail(PARTITION, where, "no partition is set and the cluster has no default partition", evidence,
                    f'set [slurm] partition to one of: {listing(shown, 20)}')
    close = difflib.get_close_matches(name, shown, 1)
    return fail(PARTITION, where, f"partition {name} does not exist" + (f" (did you mean {close[0]}?)" if close
                                                                        else ""), evidence,
                f"set [slurm] partition to one of: {listing(shown, 20)}")


def node_fit(part: Mapping[str, str], spec: SlurmSpec, where: str) -> list[Finding]:
    name, n = part["PartitionName"], spec.nodes
    total, most, least = (_count(part.get(k)) for k in ("TotalNodes", "MaxNodes", "MinNodes"))
    out = []
    if total is not None and n > total:
        out.append(fail(PARTITION, where, f"nodes = {n} but partition {name} has {total} node(s) (TotalNodes="
                        f"{total}): sbatch refuses the job", f"Nodes={part.get('Nodes')}",
                        f"set [slurm] nodes = {total} or fewer, or pick a partition with {n} nodes"))
    if most is not None and n > most:
        out.append(fail(PARTITION, where, f"nodes = {n} exceeds partition {name}'s MaxNodes={most}: the job "
                        "would wait in the queue forever (PartitionNodeLimit)", f"MaxNodes={most}",
                        f"set [slurm] nodes = {most} or fewer, or pick a partition that allows {n} nodes"))
    if least and n < least:
        out.append(fail(PARTITION, where, f"nodes = {n} is below partition {name}'s MinNodes={least}",
                        f"MinNodes={least}", f"set [slurm] nodes = {least} or more, or pick another partition"))
    return out


def time_fit(part: Mapping[str, str], spec: SlurmSpec, where: str) -> list[Finding]:
    name, limit = part["PartitionName"], part.get("MaxTime", "UNLIMITED")
    if spec.time is None:
        default = part.get("DefaultTime", "NONE")
        if default.upper() in ("NONE", *UNLIMITED):
            return []
        return [info(PARTITION, where, f"no [slurm] time: Slurm ends the job after partition {name}'s "
                     f"DefaultTime={default}", f"DefaultTime={default}, MaxTime={limit}",
                     f'set [slurm] time (at most "{limit}")')]
    wanted, most = time_limit_s(spec.time), time_limit_s(limit)
    if wanted is None or most is None or wanted <= most:
        return []
    asked = "UNLIMITED" if wanted == math.inf else str(timedelta(seconds=wanted))
    return [fail(PARTITION, where, f'time = "{spec.time}" ({asked}) exceeds partition {name}\'s MaxTime={limit}: '
                 "the job would wait in the queue forever (PartitionTimeLimit)", f"MaxTime={limit}",
                 f'set [slurm] time = "{limit}" or less (requeue = true goes on in a new job), or pick a '
                 "partition with a longer MaxTime")]


def tres_gpus(part: Mapping[str, str]) -> int | None:
    """The partition's GPUs in all, when its TRES counts them (gres/gpu=N)."""
    tres = dict(item.partition("=")[::2] for item in part.get("TRES", "").split(",") if "=" in item)
    return _count(tres.get("gres/gpu"))


def gpu_fit(part: Mapping[str, str], config: Mapping[str, str], spec: SlurmSpec, where: str) -> list[Finding]:
    """gpus_per_node against what the controller says, only where it says it."""
    want = spec.gpus_per_node
    if not want:
        return []
    types = config.get("GresTypes")
    if types is not None and "gpu" not in [t.strip() for t in types.split(",")]:
        return [fail(PARTITION, where, f"gpus_per_node = {want} but the cluster defines no GPUs (GresTypes="
                     f"{types}): sbatch refuses the job", f"GresTypes = {types}",
                     "remove gpus_per_node (a CPU job), or run on a cluster with GPU nodes")]
    total = tres_gpus(part)
    if total is not None and want * spec.nodes > total:
        return [fail(PARTITION, where, f"the job asks for {spec.nodes} x {want} GPU(s) but partition "
                     f"{part['PartitionName']} has {total} in all", f"TRES={part.get('TRES')}",
                     "lower nodes or gpus_per_node in [slurm], or pick a partition with more GPUs")]
    return []


def one_partition(ctrl: Controller, name: str | None, spec: SlurmSpec, where: str) -> list[Finding]:
    part = pick_partition(ctrl.partitions, name)
    if part is None:
        return [missing_partition(ctrl.partitions, name, where)]
    pname, state = part["PartitionName"], part.get("State", "UP")
    out = []
    if state != "UP":
        out.append(fail(PARTITION, where, f"partition {pname} is {state}: {NOT_UP.get(state, 'jobs do not start')}",
                        f"State={state}", "pick another partition, or ask the cluster admins "
                        f"(scontrol update PartitionName={pname} State=UP)"))
    out += node_fit(part, spec, where) + time_fit(part, spec, where) + gpu_fit(part, ctrl.config, spec, where)
    if not any(f.status.rank >= CheckStatus.WARN.rank for f in out):
        out.append(ok(PARTITION, where, f"partition {pname} takes {spec.nodes} node(s)"
                      + (f" x {spec.gpus_per_node} GPU(s)" if spec.gpus_per_node else "")
                      + (f" for {spec.time}" if spec.time else ""),
                      f"TotalNodes={part.get('TotalNodes')} MaxNodes={part.get('MaxNodes')} "
                      f"MaxTime={part.get('MaxTime')} State={state}"))
    return out


def partition_findings(ctrl: Controller, spec: SlurmSpec, where: str) -> list[Finding]:
    """The job's partition (or each of a comma-separated list: it starts in whichever fits)."""
    names: list[str | None] = list(spec.partition.split(",")) if spec.partition else [None]
    each = [one_partition(ctrl, name, spec, where) for name in names]
    if len(each) > 1 and any(not any(f.status == CheckStatus.FAIL for f in fs) for fs in each):
        each = [[replace(f, status=CheckStatus.WARN) if f.status == CheckStatus.FAIL else f for f in fs]
                for fs in each]
    return [f for fs in each for f in fs]


def controller_checks(ctrl: Controller, spec: SlurmSpec, where: str, reached: str = "this machine") -> list[Finding]:
    """Pure: the client answered, the request fits its partition, and how scancel finds processes."""
    return [client_finding(ctrl, where, reached), *partition_findings(ctrl, spec, where),
            *proctrack_findings(ctrl.config, where)]
