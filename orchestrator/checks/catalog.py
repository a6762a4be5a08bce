"""Every doctor check, found where it is declared: each module of this package may declare checks
(spec.py's `CheckSpec`, with `implements` on the function of a check of the facts), and every list
the others read is built here from those declarations: the registry's checks, the columns and
--explain's order, the pre-launch checks, the Slurm doctor's and --deep's. None is kept by hand.

Call it at run time, never while a module of this package is being imported (it imports them all)."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType

from orchestrator.checks.base import Check
from orchestrator.checks.spec import CheckSpec, Runs, implemented

PACKAGE = __name__.rpartition(".")[0]


@dataclass(frozen=True)
class Catalog:
    """The declared checks in order, and the function of each check of the facts (Runs.NODE)."""

    specs: tuple[CheckSpec, ...]
    bodies: Mapping[str, Check]


def modules() -> list[ModuleType]:
    """Every module of this package (subpackages' own modules aside), imported."""
    found = pkgutil.iter_modules(importlib.import_module(PACKAGE).__path__)
    return [importlib.import_module(f"{PACKAGE}.{m.name}") for m in found]


def collect(modules: list[ModuleType]) -> Catalog:
    """The checks `modules` declare; two checks of one name, or a check of the facts without its
    function (or a function marked for a check that is none), raise ValueError."""
    specs: dict[str, CheckSpec] = {}
    bodies: dict[str, Check] = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, CheckSpec) and specs.setdefault(value.name, value) is not value:
                raise ValueError(f"two checks are named {value.name!r} ({module.__name__} declares one)")
            if (spec := implemented(value)) is not None:
                bodies[spec.name] = value
    facts = {s.name for s in specs.values() if Runs.NODE in s.runs}
    if facts != set(bodies):
        raise ValueError(f"checks of the facts without their function: {sorted(facts - set(bodies))}; "
                         f"functions marked for no such check: {sorted(set(bodies) - facts)}")
    return Catalog(tuple(sorted(specs.values(), key=lambda s: s.order)), bodies)


@functools.cache
def catalog() -> Catalog:
    return collect(modules())


def specs(where: Runs | None = None) -> tuple[CheckSpec, ...]:
    """Every check (or those that run in all of `where`), in order."""
    return tuple(s for s in catalog().specs if where is None or where in s.runs)


def names(where: Runs | None = None) -> tuple[str, ...]:
    return tuple(s.name for s in specs(where))


def named(name: str) -> CheckSpec | None:
    return next((s for s in catalog().specs if s.name == name), None)


def header(check: str) -> str:
    """The table's column header of `check`."""
    spec = named(check)
    return spec.header if spec is not None else check


def body(spec: CheckSpec) -> Check:
    """The function that runs `spec`, a check of the facts."""
    return catalog().bodies[spec.name]
