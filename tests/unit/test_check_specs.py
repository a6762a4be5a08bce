"""A doctor check is declared once, by its spec in its own module: the registry, the columns,
--explain and the pre-launch, Slurm and --deep lists are built from the specs (orchestrator/checks/
catalog.py), so a check added (or moved) by its spec alone shows up in each of them."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
from doctor_fixtures import context, observe

from orchestrator.checks import catalog, explain, slurm_nodes
from orchestrator.checks.base import ok
from orchestrator.checks.model import Finding, Observations
from orchestrator.checks.registry import checks, run_checks
from orchestrator.checks.spec import CheckSpec, Runs, implements
from orchestrator.doctor import columns, deep


def declaring(*specs: CheckSpec) -> ModuleType:
    """A check module declaring `specs`, each check of the facts with its function."""
    module = ModuleType("extra_checks")
    for i, spec in enumerate(specs):
        setattr(module, f"SPEC{i}", spec)
        if Runs.NODE in spec.runs:
            def check(obs: Observations, name: str = spec.name) -> list[Finding]:
                return [ok(name, None, "fine")]
            setattr(module, f"check{i}", implements(spec)(check))
    return module


@pytest.fixture
def extra(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ModuleType]]:
    """Modules added to those catalog.py finds checks in."""
    added: list[ModuleType] = []
    real = catalog.modules()
    monkeypatch.setattr(catalog, "modules", lambda: [*real, *added])
    catalog.catalog.cache_clear()
    yield added
    catalog.catalog.cache_clear()


def test_each_check_has_a_name_an_order_and_a_header_of_its_own() -> None:
    specs = catalog.specs()
    assert len({s.order for s in specs}) == len(specs)
    words = [s.name for s in specs] + [s.column for s in specs if s.column]
    assert len(set(words)) == len(words), "a column header that is another check's name or header"


def test_a_check_run_before_a_launch_is_a_check_of_the_facts() -> None:
    assert [s.name for s in catalog.specs(Runs.LAUNCH) if Runs.NODE not in s.runs] == []


@pytest.mark.parametrize(("runs", "launch"), [(Runs.NODE | Runs.LAUNCH, True), (Runs.NODE, False)])
def test_a_specs_runs_decides_whether_the_launch_runs_it(extra: list[ModuleType], runs: Runs, launch: bool) -> None:
    extra.append(declaring(CheckSpec("extra", order=135, runs=runs, column="xtr")))
    assert [name for name, _ in checks()][-3:] == ["dns", "extra", "clock"]  # in order
    assert ("extra" in dict(checks(Runs.LAUNCH))) is launch
    assert ("extra" in {f.check for f in run_checks(observe(), Runs.LAUNCH)}) is launch
    assert "extra" in {f.check for f in run_checks(observe())}
    assert "extra" not in slurm_nodes.check_order()


def test_a_spec_gives_its_column_its_explain_name_and_its_place_on_slurm(extra: list[ModuleType]) -> None:
    extra.append(declaring(CheckSpec("extra", order=135, runs=Runs.NODE | Runs.SLURM, column="xtr"),
                           CheckSpec("quota", order=225, runs=Runs.SLURM)))
    assert catalog.header("extra") == "xtr" and explain.resolve("XTR") == "extra"
    assert catalog.names()[-5:] == ("slurm", "partition", "proctrack", "quota", "alloc")
    assert slurm_nodes.node_checks()[-3:] == ("dns", "extra", "clock")
    assert slurm_nodes.check_order()[:5] == ("slurm", "partition", "proctrack", "quota", "alloc")
    assert columns(context())[-3:] == ["dns", "extra", "clock"]


def test_a_check_only_some_jobs_have_has_a_column_only_for_them(extra: list[ModuleType]) -> None:
    extra.append(declaring(CheckSpec("extra", order=135, runs=Runs.NODE, shown=lambda ctx: ctx.max_restarts > 0)))
    assert "extra" not in columns(context()) and "restarts" not in columns(context())
    assert {"extra", "restarts"} <= set(columns(context(max_restarts=2)))
    assert "checkpoint" in columns(context(checkpoint_dir="ckpt"))


def test_deep_lists_the_checks_read_meanwhile_first_then_the_host_check_jobs(extra: list[ModuleType]) -> None:
    extra.append(declaring(CheckSpec("memory", order=175, runs=Runs.DEEP),
                           CheckSpec("disk", order=185, runs=Runs.DEEP | Runs.JOB)))
    assert deep.job_checks() == ("compute", "links", "disk")
    assert deep.checks() == ("memory", "gpu_health", "compute", "links", "disk")
    assert "memory" in catalog.names(Runs.DEEP)  # the host ledger's deep checks


def test_a_check_of_the_facts_needs_its_function_and_a_name_of_its_own() -> None:
    spec = CheckSpec("extra", order=135, runs=Runs.NODE)
    lone = ModuleType("lone")
    lone.SPEC = spec  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="without their function: \\['extra'\\]"):
        catalog.collect([lone])
    with pytest.raises(ValueError, match="two checks are named 'extra'"):
        catalog.collect([declaring(spec), declaring(CheckSpec("extra", order=136, runs=Runs.SLURM))])
