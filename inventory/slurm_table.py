"""The job file's `[slurm]` table: what to ask Slurm for, and how to start torchrun on its nodes."""

from __future__ import annotations

import re
from typing import Any

from inventory.fields import (
    check_keys,
    expect_bool,
    expect_int,
    expect_str,
    expect_str_list,
    expect_token,
)
from inventory.metrics import read_metrics_dir
from inventory.model import Host, Job
from inventory.sbatch import check_extra_option
from inventory.specs import DEFAULT_SIGNAL, SIGNAL_FORM, SlurmSpec, time_seconds
from inventory.tomlsource import Reporter

SLURM_KEYS = ("nodes", "partition", "account", "qos", "time", "gpus_per_node", "cpus_per_task", "mem",
              "constraint", "python", "extra_sbatch", "setup", "requeue", "signal", "login", "workdir", "metrics")
MAX_NODES = 100_000
MAX_SIGNAL_LEAD_S = 65535  # Slurm's own bound on --signal's time
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "URG")
DEFAULT_BASE_PORT = 29500  # the rendezvous port's search starts here (+ job id mod 1000)

# sbatch --mem (Slurm 22.05 str_to_mbytes): a whole number of MB, or with a K/M/G/T suffix in either
# case, optionally followed by B ("1g", "64GB", "500Mb"); strtoll's leading sign is taken too
_MEM = re.compile(r"\+?(?P<n>\d+)(?:(?P<unit>[KMGT])B?)?\Z", re.IGNORECASE)
_MEM_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
MAX_MEM_MB = 2**63 - 1  # Slurm counts megabytes in an int64; more wraps round to nonsense


def read_slurm(src: Reporter, key: str, table: dict[str, Any]) -> SlurmSpec:
    """Validate a [slurm] table; every bad value is a located error naming its key."""
    check_keys(src, key, table, SLURM_KEYS)

    def k(name: str) -> str:
        return f"{key}.{name}"

    def token(name: str) -> str | None:
        return expect_token(src, k(name), table[name]) if name in table else None

    def number(name: str, lo: int, hi: int) -> int | None:
        return expect_int(src, k(name), table[name], lo, hi) if name in table else None

    spec = SlurmSpec(
        nodes=number("nodes", 1, MAX_NODES) or 1,
        partition=token("partition"), account=token("account"), qos=token("qos"),
        time=_time(src, k("time"), table["time"]) if "time" in table else None,
        gpus_per_node=number("gpus_per_node", 0, 1024),
        cpus_per_task=number("cpus_per_task", 1, 100_000),
        mem=_mem(src, k("mem"), table["mem"]) if "mem" in table else None,
        constraint=token("constraint"),
        python=expect_str(src, k("python"), table["python"]) if "python" in table else "python3",
        extra_sbatch=tuple(_sbatch_option(src, f"{k('extra_sbatch')}[{i}]", line, frozenset(table)) for i, line in
                           enumerate(expect_str_list(src, k("extra_sbatch"), table.get("extra_sbatch", [])))),
        setup=tuple(_one_line(src, f"{k('setup')}[{i}]", line) for i, line in
                    enumerate(expect_str_list(src, k("setup"), table.get("setup", [])))),
        requeue=expect_bool(src, k("requeue"), table.get("requeue", False)),
        signal=_signal(src, k("signal"), table["signal"]) if "signal" in table else DEFAULT_SIGNAL,
        login=token("login"),
        workdir=expect_str(src, k("workdir"), table["workdir"]) if "workdir" in table else None,
        metrics_dir=read_metrics_dir(src, k("metrics"), table["metrics"]) if "metrics" in table else None,
    )
    if spec.python != spec.python.strip() or "\n" in spec.python:
        raise src.error(k("python"), "python has surrounding whitespace or a newline", value=spec.python)
    return spec


def _time(src: Reporter, key: str, value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)  # minutes, as sbatch takes it
    text = expect_str(src, key, value)
    if text.strip().upper() in ("UNLIMITED", "INFINITE") or time_seconds(text):
        return text.strip()
    raise src.error(key, f'"{text}" is not a Slurm time limit',
                    'write minutes ("30"), "HH:MM:SS" ("01:30:00") or "D-HH:MM:SS" ("2-00:00:00")',
                    value=text)


def _mem(src: Reporter, key: str, value: object) -> str:
    """What sbatch --mem takes, written the one way: "64GB" and "64g" -> "64G", "0512" -> "512"
    (a bare number stays bare: megabytes)."""
    text = expect_str(src, key, value).strip()
    m = _MEM.match(text)
    if m is None:
        raise src.error(key, f'"{text}" is not a Slurm memory size', 'write a whole number with K, M, G or T, '
                        'e.g. "64G" or "500M" (per node; a bare number is megabytes)', value=value)
    n, unit = int(m.group("n")), (m.group("unit") or "").upper()
    if n * _MEM_MB[unit or "M"] > MAX_MEM_MB:
        raise src.error(key, f'"{text}" is more memory than Slurm can count', 'write e.g. "64G" (per node)',
                        value=value)
    return f"{n}{unit}"


def _one_line(src: Reporter, key: str, text: str) -> str:
    if "\n" in text or "\r" in text:
        raise src.error(key, "a line must not contain a newline", "give one shell line per list item",
                        value=text)
    return text


def _sbatch_option(src: Reporter, key: str, text: str, set_keys: frozenset[str]) -> str:
    """An sbatch option for one `#SBATCH` line: "--exclusive" (a leading "#SBATCH " is dropped);
    none that ddpctl sets itself (inventory/sbatch.py). `set_keys`: the [slurm] keys given."""
    option = _one_line(src, key, text).strip().removeprefix("#SBATCH").strip()
    if not option.startswith("-"):
        raise src.error(key, f'"{text}" is not an sbatch option', 'write e.g. "--exclusive" or '
                        '"--mail-type=END"', value=text)
    check_extra_option(src, key, option, set_keys)
    return option


def _signal(src: Reporter, key: str, value: object) -> str:
    text = expect_str(src, key, value).strip()
    m = SIGNAL_FORM.match(text.upper())
    if m is None or m.group("name") not in SIGNALS or int(m.group("lead") or 0) > MAX_SIGNAL_LEAD_S:
        raise src.error(key, f'"{text}" is not a signal and a lead time',
                        f'write NAME@SECONDS with NAME one of {", ".join(SIGNALS)}, e.g. "{DEFAULT_SIGNAL}"',
                        value=value)
    return f"{m.group('name')}@{int(m.group('lead') or 60)}"


def node_hosts(job: Job, spec: SlurmSpec) -> tuple[Host, ...]:
    """The plan's nodes: node0..node<N-1> in Slurm's task order; their names come at run time."""
    workdir = spec.workdir or str(job.base_dir)
    return tuple(Host(name=f"node{i}", address=f"node{i}", python=spec.python, workdir=workdir,
                      metrics_dir=spec.metrics_dir) for i in range(spec.nodes))


def nproc_for(job: Job, spec: SlurmSpec) -> int:
    n = job.nproc_or_one  # Slurm's nodes have no slots
    if isinstance(n, int):
        return n
    if n == "cpu":
        return spec.cpus_per_task or 1
    return spec.gpus_per_node or 1  # "gpu" (the loader insists on gpus_per_node) and "auto"
