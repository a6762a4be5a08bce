"""Load an inventory: a TOML file with [defaults] and [[hosts]], or a plain hostfile."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from inventory.errors import ConfigError
from inventory.fields import (
    MAX_NPROC_PER_NODE,
    check_keys,
    expect_bool,
    expect_duration,
    expect_env,
    expect_gpus,
    expect_int,
    expect_port,
    expect_str,
    expect_table,
    expect_token,
)
from inventory.gpus import VISIBLE, same_devices, show, visible_devices
from inventory.hostfile import load_hostfile
from inventory.hostrange import expand_hostnames, is_range_pattern
from inventory.metrics import read_metrics_dir
from inventory.model import (
    MAX_KEEP_RUNS,
    MAX_QUARANTINE_WINDOW,
    GpuSpec,
    Host,
    Inventory,
)
from inventory.tomlsource import TomlFile, directory_error, join_key, read_toml

INVENTORY_KEYS = ("defaults", "hosts")
SHARED_KEYS = ("user", "port", "python", "workdir", "gpus", "env", "metrics")  # [defaults] and each [[hosts]]
# the inventory's own, not a host's: runs kept, and the quarantine of faulty hosts
INVENTORY_DEFAULTS = ("keep_runs", "quarantine", "quarantine_after", "quarantine_window")
DEFAULT_KEYS = (*SHARED_KEYS, *INVENTORY_DEFAULTS)
MAX_QUARANTINE_AFTER = 1000
HOST_KEYS = ("name", "address", *SHARED_KEYS, "slots", "spare")


@dataclass(frozen=True)
class HostSettings:
    """Settings shared by [defaults] and one [[hosts]] entry; None means 'not given'."""

    user: str | None = None
    port: int | None = None
    python: str | None = None
    workdir: str | None = None
    gpus: GpuSpec | None = None
    slots: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    metrics_dir: str | None = None

    def over(self, base: HostSettings) -> HostSettings:
        """These settings with gaps filled from `base`; env tables are merged (self wins)."""
        return HostSettings(
            user=_first(self.user, base.user),
            port=_first(self.port, base.port),
            python=_first(self.python, base.python),
            workdir=_first(self.workdir, base.workdir),
            gpus=_first(self.gpus, base.gpus),
            slots=_first(self.slots, base.slots),
            env={**base.env, **self.env},
            metrics_dir=_first(self.metrics_dir, base.metrics_dir),
        )


def _first(value: Any, fallback: Any) -> Any:
    return value if value is not None else fallback


def load_inventory(path: Path) -> Inventory:
    """Load `path`: TOML when it ends in .toml, else a DeepSpeed/MPI-style hostfile."""
    path = Path(path)
    if path.is_dir():
        raise directory_error(path, "inventory")
    if path.suffix.lower() != ".toml":
        return load_hostfile(path)
    doc = read_toml(path, "inventory file")
    check_keys(doc, "", doc.data, INVENTORY_KEYS)
    defaults = HostSettings()
    own = Inventory(hosts=())
    if "defaults" in doc.data:
        table = expect_table(doc, "defaults", doc.data["defaults"])
        check_keys(doc, "defaults", table, DEFAULT_KEYS)
        defaults = read_settings(doc, "defaults", {k: v for k, v in table.items() if k not in INVENTORY_DEFAULTS},
                                 SHARED_KEYS)
        own = _inventory_defaults(doc, table)
    entries = _host_entries(doc)
    hosts: list[Host] = []
    origins: dict[str, str] = {}
    for i, entry in enumerate(entries):
        for host in _hosts_of_entry(doc, f"hosts[{i}]", entry, defaults):
            _check_unique(doc, origins, host.name, f"hosts[{i}].name")
            hosts.append(host)
    return replace(own, hosts=tuple(hosts), source=path)


def _inventory_defaults(doc: TomlFile, table: dict[str, Any]) -> Inventory:
    """[defaults]' keys of the inventory itself (keep_runs, the quarantine's), on a host-less one."""
    own = Inventory(hosts=())
    if "keep_runs" in table:
        own = replace(own, keep_runs=expect_int(doc, "defaults.keep_runs", table["keep_runs"], 1, MAX_KEEP_RUNS))
    if "quarantine" in table:
        own = replace(own, quarantine=expect_bool(doc, "defaults.quarantine", table["quarantine"]))
    if "quarantine_after" in table:
        own = replace(own, quarantine_after=expect_int(doc, "defaults.quarantine_after", table["quarantine_after"],
                                                       1, MAX_QUARANTINE_AFTER))
    if "quarantine_window" in table:
        own = replace(own, quarantine_window=expect_duration(doc, "defaults.quarantine_window",
                                                             table["quarantine_window"], 1.0, MAX_QUARANTINE_WINDOW))
    return own


def _host_entries(doc: TomlFile) -> list[dict[str, Any]]:
    raw = doc.data.get("hosts")
    if raw is None or raw == []:
        raise ConfigError(
            "inventory has no hosts",
            file=doc.path,
            key="hosts",
            line=doc.line_of("hosts"),
            hint='add a host:  [[hosts]]  name = "node0"  address = "198.18.0.10"',
        )
    if not isinstance(raw, list):
        raise doc.error("hosts", "expected [[hosts]] tables", 'write [[hosts]] then name = "..."')
    for i, entry in enumerate(raw):
        expect_table(doc, f"hosts[{i}]", entry)
    return raw


def read_settings(
    doc: TomlFile, prefix: str, table: dict[str, Any], allowed: tuple[str, ...]
) -> HostSettings:
    """Validate the per-host settings found in `table` (name/address handled by the caller)."""
    check_keys(doc, prefix, table, allowed)

    def key(name: str) -> str:
        return join_key(prefix, name)

    return HostSettings(
        user=expect_token(doc, key("user"), table["user"]) if "user" in table else None,
        port=int(expect_port(doc, key("port"), table["port"])) if "port" in table else None,
        python=expect_str(doc, key("python"), table["python"]) if "python" in table else None,
        workdir=expect_str(doc, key("workdir"), table["workdir"]) if "workdir" in table else None,
        gpus=expect_gpus(doc, key("gpus"), table["gpus"]) if "gpus" in table else None,
        slots=expect_int(doc, key("slots"), table["slots"], 1, MAX_NPROC_PER_NODE)
        if "slots" in table
        else None,
        env=expect_env(doc, key("env"), table["env"]) if "env" in table else {},
        metrics_dir=read_metrics_dir(doc, key("metrics"), table["metrics"]) if "metrics" in table else None,
    )


def _hosts_of_entry(
    doc: TomlFile, prefix: str, entry: dict[str, Any], defaults: HostSettings
) -> list[Host]:
    settings = read_settings(doc, prefix, entry, HOST_KEYS).over(defaults)
    _check_gpu_env(doc, prefix, entry, settings)
    if "name" not in entry:
        raise doc.key_error(
            prefix, "host entry has no name", 'add name = "node0" (a range like "node[0-3]" works)'
        )
    names = _expand(doc, join_key(prefix, "name"), entry["name"])
    addresses = _addresses(doc, prefix, entry, names)
    # spare = true: not in the job until a restart leaves a host out (orchestrator/restarts/loop.py)
    spare = expect_bool(doc, join_key(prefix, "spare"), entry["spare"]) if "spare" in entry else False
    return [
        replace(_make_host(name, address, settings), spare=spare)
        for name, address in zip(names, addresses, strict=True)
    ]


def _check_gpu_env(doc: TomlFile, prefix: str, entry: dict[str, Any], settings: HostSettings) -> None:
    """`gpus = [0, 2]` and an env CUDA_VISIBLE_DEVICES naming other GPUs, given at one level (the
    host's entry, or [defaults]), or the env the more specific: an error at the selection. A host's
    own selection wins over a CUDA_VISIBLE_DEVICES in [defaults].env, as its keys do."""
    value = settings.env.get(VISIBLE)
    if not isinstance(settings.gpus, tuple) or value is None or same_devices(value, settings.gpus):
        return
    own_env = entry.get("env")
    env_here = isinstance(own_env, dict) and VISIBLE in own_env
    if "gpus" in entry and not env_here:
        return
    env_key = join_key(prefix if env_here else "defaults", f"env.{VISIBLE}")
    raise doc.error(
        join_key(prefix if "gpus" in entry else "defaults", "gpus"),
        f'gpus = {show(settings.gpus)} selects other GPUs than {env_key} = "{value}"',
        f"remove {env_key}: ddpctl sets CUDA_VISIBLE_DEVICES={visible_devices(settings.gpus)} "
        "from gpus (or remove gpus to set it yourself)",
    )


def _expand(doc: TomlFile, key: str, value: object) -> list[str]:
    text = expect_token(doc, key, value)
    try:
        names = expand_hostnames(text)
    except ValueError as exc:
        raise doc.error(
            key, str(exc), "ranges look like node[1-4], gpu[01-16], n[1,3,5-6]"
        ) from None
    for name in names:
        expect_token(doc, key, name)
    return names


def _addresses(doc: TomlFile, prefix: str, entry: dict[str, Any], names: list[str]) -> list[str]:
    """One address per name: the names themselves, or an address range of the same length."""
    if "address" not in entry:
        return names
    key = join_key(prefix, "address")
    if len(names) == 1:
        return [expect_token(doc, key, entry["address"])]
    text = expect_token(doc, key, entry["address"])
    if not is_range_pattern(text):
        raise doc.error(
            key,
            f"name is a range of {len(names)} hosts but address {text!r} is a single address",
            'give an address range of the same length, e.g. "198.18.0.[10-13]", '
            "or drop address to use the names",
            value=text,
        )
    addresses = _expand(doc, key, text)
    if len(addresses) != len(names):
        raise doc.error(
            key,
            f"address range has {len(addresses)} entries but the name range has {len(names)}",
            "make both ranges the same length",
            value=text,
        )
    return addresses


def _make_host(name: str, address: str, settings: HostSettings) -> Host:
    return Host(
        name=name,
        address=address,
        user=settings.user,
        port=settings.port,
        python=settings.python if settings.python is not None else "python3",
        workdir=settings.workdir,
        gpus=settings.gpus if settings.gpus is not None else "auto",
        slots=settings.slots,
        env=MappingProxyType(dict(settings.env)),
        metrics_dir=settings.metrics_dir,
    )


def _check_unique(doc: TomlFile, origins: dict[str, str], name: str, key: str) -> None:
    if name not in origins:
        origins[name] = key
        return
    first_key = origins[name]
    first_line, line = doc.line_of(first_key), doc.line_of(key)
    raise ConfigError(
        f'duplicate host "{name}": defined at line {first_line} ({first_key}) '
        f"and again at line {line} ({key})",
        file=doc.path,
        line=line,
        key=key,
        hint="host names must be unique; rename or remove one of them",
    )
