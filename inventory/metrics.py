"""The job file's `[metrics]` table: Prometheus series while the job runs (docs/metrics.md), and
`ddpctl up --metrics-port`, which replaces its port."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from inventory.fields import check_keys, expect_duration, expect_port, expect_table
from inventory.model import MetricsSpec
from inventory.tomlsource import FlagReporter, Reporter

METRICS_KEYS = ("port", "every", "keep_ended")
MIN_EVERY, MAX_EVERY = 0.5, 3600.0  # seconds between two writes of a host's textfile
MAX_KEEP_ENDED = 7 * 24 * 3600.0  # an ended job's textfile stays at most a week
FLAG_METRICS_PORT = "--metrics-port"


def read_metrics(doc: Reporter, value: object) -> MetricsSpec:
    table: dict[str, Any] = expect_table(doc, "metrics", value)
    check_keys(doc, "metrics", table, METRICS_KEYS)
    default = MetricsSpec()
    return MetricsSpec(
        port=int(expect_port(doc, "metrics.port", table["port"])) if "port" in table else None,
        every=expect_duration(doc, "metrics.every", table["every"], MIN_EVERY, MAX_EVERY)
        if "every" in table else default.every,
        keep_ended=expect_duration(doc, "metrics.keep_ended", table["keep_ended"], 0.0, MAX_KEEP_ENDED)
        if "keep_ended" in table else default.keep_ended,
    )


def with_port(spec: MetricsSpec, port: object) -> MetricsSpec:
    """`spec` with --metrics-port's value (None: the file's), checked and blamed on the flag."""
    if port is None:
        return spec
    return replace(spec, port=int(expect_port(FlagReporter(FLAG_METRICS_PORT), FLAG_METRICS_PORT, port)))
