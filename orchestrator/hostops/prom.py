"""ddpctl's Prometheus families on this machine, through prometheus-client: `family`, the one way to
make any of them from its declaration (node_agent/wire/metrics.py), the host ledger's for
`ddpctl hosts --prom FILE` and `up` (`ledger_families`), and a textfile for node_exporter."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from node_agent.wire.metrics import BY_NAME, COUNTER
from orchestrator.hostops.hostbook import HostRow, HostsView
from orchestrator.hostops.quarantine import LedgerState, duration

Family = GaugeMetricFamily | CounterMetricFamily
Sample = tuple[Mapping[str, str], float]  # its labels by name, its value


def family(name: str, samples: Iterable[Sample] = ()) -> Family:
    """The family of the series declared as `name` (a counter's without its _total: prometheus-client
    adds it), with its help and labels from the declaration and `samples` added; add more with
    `add_metric(values, value)`, the label values in the declared order. KeyError for a name not
    declared; ValueError for a sample whose labels are not the declared ones."""
    declared = BY_NAME[name]
    kind = CounterMetricFamily if declared.kind == COUNTER else GaugeMetricFamily
    out = kind(declared.name, declared.help, labels=declared.labels)
    for labels, value in samples:
        if set(labels) != set(declared.labels):
            given = ", ".join(sorted(labels)) or "none"
            raise ValueError(f"{name} has the labels {', '.join(declared.labels)}, not {given}")
        out.add_metric([labels[key] for key in declared.labels], value)
    return out


def ledger_families(view: HostsView, names: Collection[str] | None = None) -> list[Family]:
    """The ledger's series of the hosts in `view` (`hosts_view`'s, which `ddpctl hosts` shows), or of
    those named in `names` only: each host's state (1 for its own, 0 for the others), its host faults
    counted in the quarantine window, and the run time charged to it within that window. `Hostname`
    is the host's name in the ledger; its name and address where two hosts in the view share a name."""
    rows = [row for row in view.rows if names is None or row.record.name in names]
    window = duration(view.policy.window).replace(" ", "")  # "24h", "7d": as --since and the inventory take it
    state, faults, cost = family("ddpctl_host_state"), family("ddpctl_host_faults"), family("ddpctl_host_cost_seconds")
    for row in rows:
        host = _hostname(row, rows)
        for each in LedgerState:
            state.add_metric([host, each.value], 1.0 if row.judgement.state is each else 0.0)
        faults.add_metric([host], len(row.judgement.counted))
        cost.add_metric([host, window], row.cost.seconds)
    return [state, faults, cost]


def _hostname(row: HostRow, rows: Sequence[HostRow]) -> str:
    shared = sum(1 for other in rows if other.record.name == row.record.name) > 1
    return row.record.key if shared else row.record.name


@dataclass(frozen=True, eq=False)  # a registry keys its collectors by identity
class _Families:
    """A fixed set of families, as a registry takes them (a Collector)."""

    families: Sequence[Metric]

    def collect(self) -> Iterable[Metric]:
        return self.families


def write_textfile(path: Path, families: Sequence[Metric]) -> None:
    """`families` in Prometheus' text format to `path`, atomically (written beside it, then renamed),
    for node_exporter's textfile collector; OSError where it cannot be written."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    write_to_textfile(str(path), registry)
