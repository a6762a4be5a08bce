"""Load a job file (what to run, on which hosts, how to rendezvous) and apply CLI overrides."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from inventory.errors import ConfigError
from inventory.fields import (
    check_keys,
    describe,
    expect_bool,
    expect_env,
    expect_env_name,
    expect_int,
    expect_no_nul,
    expect_nproc,
    expect_port,
    expect_str,
    expect_str_list,
    expect_table,
    is_ascii_digits,
    is_ip_address,
    suggest,
)
from inventory.hostrange import expand_hostnames
from inventory.loading import load_inventory
from inventory.metrics import read_metrics, with_port
from inventory.model import (
    LOCALHOST,
    Host,
    Inventory,
    Job,
    JobOverrides,
    MetricsSpec,
    NprocSpec,
    Rendezvous,
    RestartSpec,
    WatchSpec,
    local_inventory,
)
from inventory.restart import read_restart
from inventory.slurm_table import read_slurm
from inventory.specs import SlurmSpec, SyncSpec
from inventory.sync import read_sync
from inventory.tomlsource import FlagReporter, Reporter, TomlFile, read_toml, toml_files_in
from inventory.watch import read_watch

JOB_FILE_KEYS = ("inventory", "job", "rendezvous", "env", "slurm", "sync", "supervise", "restart", "watch",
                 "metrics")
SUPERVISE_KEYS = ("lost_after",)
MIN_LOST_AFTER_S = 10  # orchestrator/launch/faults.py MIN_LOST_AFTER: silent_after + one retry
JOB_KEYS = ("name", "script", "module", "args", "nproc_per_node", "hosts")
RENDEZVOUS_KEYS = ("master_addr", "master_port", "backend", "join_timeout", "pick_interfaces")
MAX_JOIN_TIMEOUT_S = 86400
BACKENDS = ("static", "c10d")
DEFAULT_MASTER_PORT = 29500

FLAG_NPROC = "--nproc-per-node"
FLAG_MASTER_PORT = "--master-port"
FLAG_ENV = "--env"
FLAG_HOSTS = "--hosts"

_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")  # \Z: "$" would let a trailing newline through
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")


@dataclass(frozen=True)
class _Spec:
    """Everything read from the job file, before overrides and cross-checks."""

    nproc: NprocSpec | None  # None: not set (each host's slots, else 1)
    master_addr: str | None
    master_port: int | Literal["auto"]
    backend: Literal["static", "c10d"]
    env: dict[str, str]
    hosts: tuple[Host, ...]
    hosts_from_flag: bool = False


@dataclass(frozen=True)
class _Entrypoint:
    """Exactly one of script / module."""

    script: str | None = None
    module: str | None = None


@dataclass(frozen=True)
class _Problem:
    message: str
    hint: str


def parse_env_assignment(text: str) -> tuple[str, str]:
    """Split a `-e KEY=VALUE` argument; the value may be empty and may contain '='."""
    name, sep, value = text.partition("=")
    if not sep:
        raise ConfigError(
            f'"{text}" is not KEY=VALUE',
            key=FLAG_ENV,
            hint="write -e NAME=value, e.g. -e NCCL_DEBUG=INFO",
        )
    expect_env_name(FlagReporter(FLAG_ENV), FLAG_ENV, name)
    return name, value


def load_job(path: Path, overrides: JobOverrides | None = None) -> Job:
    """Read the job file at `path`, load its inventory, apply `overrides`, validate the result."""
    path = Path(path)
    doc = read_toml(path, "job file")
    base_dir = path.resolve().parent
    check_keys(doc, "", doc.data, JOB_FILE_KEYS)
    inventory = _job_inventory(doc, base_dir)
    section = _job_section(doc)
    entry = _entrypoint(doc, section)
    name = _job_name(doc, section, path)
    args = section.get("args")
    arg_list = tuple(expect_str_list(doc, "job.args", args)) if args is not None else ()
    spec = _read_spec(doc, section, inventory)
    if overrides is not None:
        spec = _apply_overrides(spec, overrides, inventory)
    slurm = _slurm(doc, overrides.backend if overrides is not None else None)
    if slurm is None:
        _check_master(doc, spec, inventory)
    elif spec.master_addr is not None:
        raise doc.error("rendezvous.master_addr", "master_addr does not apply to a Slurm job: the "
                        "rendezvous runs on the first node of the allocation",
                        "remove master_addr (or run it over SSH with --backend ssh)", value=spec.master_addr)
    if slurm is not None:
        _check_slurm_nproc(doc, spec.nproc, slurm)
    sync = _sync(doc, base_dir)
    if entry.script is not None and sync is not None:
        _check_script(doc, entry.script, base_dir, (LOCALHOST,))  # it goes to the hosts from here
    elif entry.script is not None and (slurm is None or (slurm.login is None and slurm.workdir is None)):
        _check_script(doc, entry.script, base_dir, spec.hosts if slurm is None else (LOCALHOST,))
    return Job(
        name=name,
        inventory=inventory,
        hosts=spec.hosts,
        script=entry.script,
        module=entry.module,
        args=arg_list,
        nproc_per_node=spec.nproc,
        rendezvous=Rendezvous(spec.master_addr, spec.master_port, spec.backend, _join_timeout(doc),
                              _pick_interfaces(doc)),
        env=MappingProxyType(dict(spec.env)),
        source=path,
        base_dir=base_dir,
        slurm=slurm,
        sync=sync,
        lost_after=_lost_after(doc),
        restart=_restart(doc, slurm.nodes if slurm is not None else len(spec.hosts), slurm),
        watch=read_watch(doc, doc.data["watch"]) if "watch" in doc.data else WatchSpec(),
        metrics=with_port(read_metrics(doc, doc.data["metrics"]) if "metrics" in doc.data else MetricsSpec(),
                          overrides.metrics_port if overrides is not None else None),
    )


def _restart(doc: TomlFile, nodes: int, slurm: SlurmSpec | None) -> RestartSpec:
    if "restart" not in doc.data:
        return RestartSpec()
    spec = read_restart(doc, doc.data["restart"], nodes)
    if slurm is not None and spec.min_nodes is not None:
        raise doc.error("restart.min_nodes", "min_nodes does not apply on Slurm: a restart asks Slurm for "
                        f"{nodes} other node(s) (the faulty ones excluded), and waits in the queue for them",
                        "remove min_nodes (or lower [slurm] nodes)", value=spec.min_nodes)
    return spec


def _lost_after(doc: TomlFile) -> float | None:
    """[supervise] lost_after: whole seconds a silent host may stay out of reach."""
    if "supervise" not in doc.data:
        return None
    table = expect_table(doc, "supervise", doc.data["supervise"])
    check_keys(doc, "supervise", table, SUPERVISE_KEYS)
    if "lost_after" not in table:
        return None
    return float(expect_int(doc, "supervise.lost_after", table["lost_after"], MIN_LOST_AFTER_S, MAX_JOIN_TIMEOUT_S))


def _check_slurm_nproc(doc: Reporter, nproc: NprocSpec | None, slurm: SlurmSpec) -> None:
    """On Slurm, "gpu" and "cpu" are read from what the job asks for, not from a host."""
    if nproc == "gpu" and not slurm.gpus_per_node:
        raise doc.error("job.nproc_per_node", 'nproc_per_node = "gpu" on Slurm needs slurm.gpus_per_node',
                        "set [slurm] gpus_per_node = N (one rank per GPU), or give nproc_per_node a number")
    if nproc == "cpu" and not slurm.cpus_per_task:
        raise doc.error("job.nproc_per_node", 'nproc_per_node = "cpu" on Slurm needs slurm.cpus_per_task',
                        "set [slurm] cpus_per_task = N, or give nproc_per_node a number")


def _slurm(doc: TomlFile, backend: str | None) -> SlurmSpec | None:
    """The [slurm] table selects Slurm; --backend overrides it either way."""
    if backend == "ssh":
        return None
    if "slurm" in doc.data:
        return read_slurm(doc, "slurm", expect_table(doc, "slurm", doc.data["slurm"]))
    return SlurmSpec() if backend == "slurm" else None


def _sync(doc: TomlFile, base_dir: Path) -> SyncSpec | None:
    if "sync" not in doc.data:
        return None
    return read_sync(doc, "sync", expect_table(doc, "sync", doc.data["sync"]), base_dir)


def _job_inventory(doc: TomlFile, base_dir: Path) -> Inventory:
    if "inventory" not in doc.data:
        return local_inventory()
    text = expect_str(doc, "inventory", doc.data["inventory"])
    inv_path = base_dir / Path(text).expanduser()
    if inv_path.is_dir():
        raise _inventory_is_directory(doc, text, inv_path, base_dir)
    if not inv_path.is_file():
        raise doc.error(
            "inventory",
            f"inventory file not found: {inv_path}",
            f"the path is relative to the job file's directory ({base_dir}); "
            "omit inventory to run on this machine only",
        )
    return load_inventory(inv_path)


def _inventory_is_directory(
    doc: TomlFile, text: str, inv_path: Path, base_dir: Path
) -> ConfigError:
    """The job file's inventory names a directory: point at a TOML file inside it, if any."""
    inside = [
        p.relative_to(base_dir) if p.is_relative_to(base_dir) else p
        for p in toml_files_in(inv_path)
    ]
    example = f'inventory = "{inside[0]}"' if inside else 'inventory = "hosts.toml"'
    return doc.error(
        "inventory",
        f"inventory {inv_path} is a directory, not a file",
        f"name the inventory file itself, relative to the job file's directory: {example}",
        value=text,
    )


def _job_section(doc: TomlFile) -> dict[str, Any]:
    if "job" not in doc.data:
        raise ConfigError(
            "job file has no [job] table",
            file=doc.path,
            key="job",
            hint='add:  [job]  script = "train.py"',
        )
    section = expect_table(doc, "job", doc.data["job"])
    check_keys(doc, "job", section, JOB_KEYS)
    return section


def _job_name(doc: TomlFile, section: dict[str, Any], path: Path) -> str:
    if "name" not in section:
        return re.sub(r"[^A-Za-z0-9._-]", "-", path.stem).lstrip("._-") or "job"
    name = expect_str(doc, "job.name", section["name"])
    if not _JOB_NAME.match(name):
        raise doc.error(
            "job.name",
            f'job name "{name}" has characters other than letters, digits, ".", "_", "-"',
            'it is used as the rendezvous id and in log paths; use e.g. "toy-run"',
            value=name,
        )
    return name


def _entrypoint(doc: TomlFile, section: dict[str, Any]) -> _Entrypoint:
    has_script, has_module = "script" in section, "module" in section
    if has_script and has_module:
        raise doc.key_error(
            "job.module", "job sets both script and module", "keep exactly one of them"
        )
    if not (has_script or has_module):
        raise doc.key_error(
            "job",
            "job has neither script nor module",
            'add script = "train.py" or module = "pkg.train"',
        )
    if has_script:
        return _Entrypoint(script=expect_str(doc, "job.script", section["script"]))
    module = expect_str(doc, "job.module", section["module"])
    if not _MODULE.match(module):
        raise doc.error(
            "job.module",
            f'"{module}" is not a Python module path',
            'write e.g. "pkg.train"',
            value=module,
        )
    return _Entrypoint(module=module)


def _join_timeout(doc: TomlFile) -> float:
    """[rendezvous] join_timeout: whole seconds, 0 turns the rendezvous watchdog off."""
    rdzv = doc.data.get("rendezvous") or {}
    if "join_timeout" not in rdzv:
        return Rendezvous.join_timeout
    return float(expect_int(doc, "rendezvous.join_timeout", rdzv["join_timeout"], 0, MAX_JOIN_TIMEOUT_S))


def _pick_interfaces(doc: TomlFile) -> bool:
    """[rendezvous] pick_interfaces: false leaves GLOO/NCCL_SOCKET_IFNAME to the libraries."""
    rdzv = doc.data.get("rendezvous") or {}
    if "pick_interfaces" not in rdzv:
        return Rendezvous.pick_interfaces
    return expect_bool(doc, "rendezvous.pick_interfaces", rdzv["pick_interfaces"])


def _read_spec(doc: TomlFile, section: dict[str, Any], inventory: Inventory) -> _Spec:
    rdzv: dict[str, Any] = {}
    if "rendezvous" in doc.data:
        rdzv = expect_table(doc, "rendezvous", doc.data["rendezvous"])
        check_keys(doc, "rendezvous", rdzv, RENDEZVOUS_KEYS)
    backend = rdzv.get("backend", "static")
    if backend not in BACKENDS:
        raise doc.error(
            "rendezvous.backend",
            f'backend must be "static" or "c10d", got {describe(backend)}',
            suggest(str(backend), BACKENDS) or 'use "static" (fixed hosts) or "c10d"',
            value=backend,
        )
    master_addr = rdzv.get("master_addr")
    hosts = section.get("hosts")
    return _Spec(
        nproc=expect_nproc(doc, "job.nproc_per_node", section["nproc_per_node"])
        if "nproc_per_node" in section
        else None,
        master_addr=expect_str(doc, "rendezvous.master_addr", master_addr)
        if master_addr is not None
        else None,
        master_port=expect_port(  # type: ignore[arg-type]
            doc, "rendezvous.master_port", rdzv.get("master_port", DEFAULT_MASTER_PORT), True
        ),
        backend=backend,
        env=expect_env(doc, "env", doc.data["env"]) if "env" in doc.data else {},
        hosts=select_hosts(doc, "job.hosts", hosts, inventory)
        if hosts is not None
        else _working_hosts(doc, inventory),
    )


def _working_hosts(doc: TomlFile, inventory: Inventory) -> tuple[Host, ...]:
    """Every inventory host but the spares (they wait for a restart to leave a host out)."""
    hosts = tuple(h for h in inventory.hosts if not h.spare)
    if not hosts:
        raise doc.error("inventory", "every host of the inventory is a spare (spare = true)",
                        "leave spare out on the hosts the job starts on, or list them in [job] hosts")
    return hosts


def apply_overrides(job: Job, overrides: JobOverrides) -> Job:
    """`job` (loaded or built in code) with command-line style overrides applied and checked, as
    `load_job(path, overrides)` would: each bad value is blamed on its flag."""
    spec = _Spec(job.nproc_per_node, job.rendezvous.master_addr, job.rendezvous.master_port,
                 job.rendezvous.backend, dict(job.env), job.hosts)
    spec = _apply_overrides(spec, overrides, job.inventory)
    slurm = {"ssh": None, "slurm": job.slurm or SlurmSpec(), None: job.slurm}[overrides.backend]
    if slurm is None:
        _check_master(_JobReporter(job.source), spec, job.inventory)
    return replace(job, hosts=spec.hosts, nproc_per_node=spec.nproc, env=MappingProxyType(dict(spec.env)),
                   rendezvous=replace(job.rendezvous, master_addr=spec.master_addr,
                                      master_port=spec.master_port, backend=spec.backend), slurm=slurm,
                   metrics=with_port(job.metrics, overrides.metrics_port))


@dataclass(frozen=True)
class _JobReporter:
    """Blames a key of a job that has no TOML document at hand (built in code, or overridden)."""

    source: Path | None

    def error(self, key: str, message: str, hint: str | None = None, *, value: object = None) -> ConfigError:
        return ConfigError(message, file=self.source, key=key, hint=hint)

    def key_error(self, key: str, message: str, hint: str | None = None) -> ConfigError:
        return ConfigError(message, file=self.source, key=key, hint=hint)


def _apply_overrides(spec: _Spec, overrides: JobOverrides, inventory: Inventory) -> _Spec:
    """Command-line values replace file values; each is validated and blamed on its flag."""
    if overrides.nproc_per_node is not None:
        value = _digits_to_int(overrides.nproc_per_node)
        spec = replace(spec, nproc=expect_nproc(FlagReporter(FLAG_NPROC), FLAG_NPROC, value))
    if overrides.master_port is not None:
        value = _digits_to_int(overrides.master_port)
        port = expect_port(FlagReporter(FLAG_MASTER_PORT), FLAG_MASTER_PORT, value, True)
        spec = replace(spec, master_port=port)  # type: ignore[arg-type]
    if overrides.env:
        env = dict(spec.env)
        flag = FlagReporter(FLAG_ENV)
        for name, value in overrides.env:
            env[expect_env_name(flag, FLAG_ENV, name)] = expect_no_nul(flag, FLAG_ENV, str(value))
        spec = replace(spec, env=env)
    if overrides.hosts is not None:
        entries = [part for item in overrides.hosts for part in split_host_list(item)]
        hosts = select_hosts(FlagReporter(FLAG_HOSTS), FLAG_HOSTS, entries, inventory)
        spec = replace(spec, hosts=hosts, hosts_from_flag=True)
    return spec


def split_host_list(text: str) -> list[str]:
    """Split "a,b,n[1,3-4]" on the commas outside brackets."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def select_hosts(
    rep: Reporter, key: str, entries: object, inventory: Inventory
) -> tuple[Host, ...]:
    """Resolve host names/addresses (ranges allowed) to inventory hosts, keeping their order."""
    names = expect_str_list(rep, key, entries)
    if not names:
        raise rep.error(key, "host list is empty", "list at least one host, or omit it to use all")
    chosen: list[Host] = []
    for i, entry in enumerate(names):
        item_key = key if key.startswith("-") else f"{key}[{i}]"
        try:
            expanded = expand_hostnames(entry)
        except ValueError as exc:
            raise rep.error(item_key, str(exc), value=entry) from None
        for name in expanded:
            host = inventory.get(name)
            if host is None:
                problem = _unknown_host(name, inventory)
                raise rep.error(item_key, problem.message, problem.hint, value=entry)
            if host in chosen:
                raise rep.error(
                    item_key,
                    f'host "{host.name}" is selected twice',
                    "list each host once",
                    value=entry,
                )
            chosen.append(host)
    return tuple(chosen)


def _unknown_host(name: str, inventory: Inventory) -> _Problem:
    where = str(inventory.source) if inventory.source else "the built-in localhost inventory"
    known = inventory.names() + [h.address for h in inventory.hosts]
    hint = suggest(name, known)
    if hint is None:
        shown = ", ".join(inventory.names()[:8]) + (", ..." if len(inventory.hosts) > 8 else "")
        hint = f"known hosts: {shown}"
    return _Problem(f'host "{name}" is not in the inventory ({where})', hint)


def _check_master(doc: Reporter, spec: _Spec, inventory: Inventory) -> None:
    """master_addr must name a selected host (node_rank 0 for static), or be an IP literal."""
    addr = spec.master_addr
    if addr is None:
        return
    key = "rendezvous.master_addr"
    via = " (the hosts chosen with --hosts)" if spec.hosts_from_flag else ""
    host = inventory.get(addr)
    if host is None:
        if is_ip_address(addr):
            return  # another interface of the master, outside the inventory
        problem = _unknown_host(addr, inventory)
        raise doc.error(
            key,
            f"master_addr: {problem.message}",
            problem.hint + " (or give an IP address)",
            value=addr,
        )
    if host not in spec.hosts:
        raise doc.error(
            key,
            f'master_addr "{addr}" is not one of the selected hosts{via}',
            "select it (first) in job.hosts, or omit master_addr to use the first host",
            value=addr,
        )
    if spec.backend == "static" and host != spec.hosts[0]:
        raise doc.error(
            key,
            f'with backend "static" torchrun hosts the rendezvous store on node_rank 0, '
            f'but master_addr "{addr}" is node_rank {spec.hosts.index(host)}{via}',
            f'list "{host.name}" first in the host list, omit master_addr, or use backend = "c10d"',
            value=addr,
        )


def _check_script(doc: TomlFile, script: str, base_dir: Path, hosts: tuple[Host, ...]) -> None:
    """The script must exist where a host without its own workdir (or a local host) runs it."""
    for looked_at in _script_paths(script, base_dir, hosts):
        if not looked_at.is_file():
            raise doc.error(
                "job.script",
                f"script not found: {looked_at}",
                "job.script is relative to the job file's directory (or to the workdir of a "
                "local host that sets one); fix the path or create the file",
                value=script,
            )


def _script_paths(script: str, base_dir: Path, hosts: tuple[Host, ...]) -> list[Path]:
    """Paths this machine can check: the job dir (hosts without workdir), local workdirs."""
    paths: list[Path] = []
    for host in hosts:
        if host.workdir is None:
            path = base_dir / script
        elif host.is_local and Path(host.workdir).expanduser().is_absolute():
            path = Path(host.workdir).expanduser() / script
        else:
            continue  # a remote workdir: only the host itself can tell
        if path not in paths:
            paths.append(path)
    return paths


def _digits_to_int(value: object) -> object:
    if isinstance(value, str) and is_ascii_digits(value.strip()):
        return int(value)
    return value
