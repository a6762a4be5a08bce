"""The job file's `[metrics]` table: Prometheus series while the job runs (docs/metrics.md), and
`ddpctl up --metrics-port`, which replaces its port; and a `metrics` table naming node_exporter's
textfile directory (the inventory's [defaults] and [[hosts]], the job file's [slurm])."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from inventory.fields import check_keys, describe, expect_duration, expect_port, expect_str, expect_table
from inventory.model import MetricsSpec
from inventory.tomlsource import FlagReporter, Reporter, join_key

METRICS_KEYS = ("port", "every", "keep_ended")
MIN_EVERY, MAX_EVERY = 0.5, 3600.0  # seconds between two writes of a host's textfile
MAX_KEEP_ENDED = 7 * 24 * 3600.0  # an ended job's textfile stays at most a week
FLAG_METRICS_PORT = "--metrics-port"
TEXTFILE_KEYS = ("textfile_dir",)  # a host's metrics table ([defaults.metrics], its own, [slurm.metrics])
TEXTFILE_EXAMPLE = 'metrics = { textfile_dir = "/var/lib/prometheus/node-exporter" }'


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


def read_metrics_dir(doc: Reporter, key: str, value: object) -> str | None:
    """A metrics table's textfile_dir: node_exporter's textfile directory on the host, absolute or
    under the login's home ("~/..."; the host expands it). An empty table gives none."""
    if not isinstance(value, dict):
        raise doc.error(key, f"expected a table, got {describe(value)}", f"write {TEXTFILE_EXAMPLE}", value=value)
    check_keys(doc, key, value, TEXTFILE_KEYS)
    if "textfile_dir" not in value:
        return None
    path_key = join_key(key, "textfile_dir")
    text = expect_str(doc, path_key, value["textfile_dir"])
    if not text.startswith(("/", "~/")):
        raise doc.error(path_key, f'textfile_dir must be an absolute path or start with "~/", got "{text}"',
                        "give the directory node_exporter's --collector.textfile.directory names, e.g. "
                        '"/var/lib/prometheus/node-exporter"', value=text)
    return text
