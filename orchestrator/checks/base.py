"""Helpers shared by the checks: finding constructors, majority vote, fact access."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TypeVar

from orchestrator.checks.model import Basis, CheckStatus, Finding, Observations
from orchestrator.remote.wire import HostFacts, TorchFact

K = TypeVar("K", bound=Hashable)

Check = Callable[[Observations], list[Finding]]


def ok(check: str, host: str | None, message: str, evidence: str = "", basis: Basis | None = None) -> Finding:
    return Finding(check, CheckStatus.OK, host, message, evidence, basis=basis)


def info(check: str, host: str | None, message: str, evidence: str = "", fix: str = "",
         basis: Basis | None = None) -> Finding:
    return Finding(check, CheckStatus.INFO, host, message, evidence, fix, basis)


def warn(check: str, host: str | None, message: str, evidence: str = "", fix: str = "",
         basis: Basis | None = None) -> Finding:
    return Finding(check, CheckStatus.WARN, host, message, evidence, fix, basis)


def fail(check: str, host: str | None, message: str, evidence: str = "", fix: str = "",
         basis: Basis | None = None) -> Finding:
    return Finding(check, CheckStatus.FAIL, host, message, evidence, fix, basis)


def skip(check: str, host: str | None, message: str) -> Finding:
    return Finding(check, CheckStatus.SKIP, host, message)


def majority(values: Mapping[str, K]) -> tuple[K | None, list[str]]:
    """The most common value and the hosts that differ from it (ties: first host's value)."""
    if not values:
        return None, []
    counts = Counter(values.values())
    first = next(iter(values.values()))
    top = max(counts.items(), key=lambda kv: (kv[1], kv[0] == first))[0]
    return top, [h for h, v in values.items() if v != top]


def torch_of(hf: HostFacts) -> TorchFact:
    """The host's torch fact (an empty one, not importable, where it sent none)."""
    return hf.facts.torch or TorchFact()


def fact_error(hf: HostFacts, name: str) -> str | None:
    return hf.errors.get(name)


def listing(items: Iterable[str], limit: int = 8) -> str:
    items = list(items)
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more
