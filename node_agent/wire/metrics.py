"""Every Prometheus series ddpctl writes, declared once: its name, type, help and labels, and who
writes it (docs/metrics.md is the same table for readers; tests/unit/test_metrics_names.py keeps
the two equal).

- "host": each host of a running job, into `[metrics] textfile_dir` for node_exporter's textfile
  collector (node_agent/runtime/metrics_file.py; the agent has only the standard library, so it
  writes the exposition format itself, through `exposition` below, checked against
  prometheus-client's parser and `promtool check metrics`).
- "up": `ddpctl up --metrics-port` while the run goes (orchestrator/watch/metrics.py, through
  prometheus-client).
- "ledger": `ddpctl hosts --prom FILE`, the host ledger on this machine (prometheus-client too).

Labels follow NVIDIA's DCGM exporter where they name the same thing (`Hostname`, `gpu`, `UUID`), so
a dashboard joins ddpctl's series with DCGM's on them (DCGM's `modelName` is `model_name` here:
`promtool check metrics` wants label names in snake_case). `job_name` is the job's name (not `job`:
Prometheus gives every scraped series the `job` of its scrape config, and would rename ours
`exported_job`), `run` its run id (the same for every attempt of a restarted run), `attempt` which
attempt of the run a host's series are of (an ended attempt's file, kept a while, and the next
attempt's on the same host are two sets of series, never one series collected twice).
"""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Dict, Iterable, List, Sequence, Tuple

    Sample = Tuple[Dict[str, str], float]  # labels, value

GAUGE = "gauge"
COUNTER = "counter"
JOB = ("Hostname", "job_name", "run", "attempt")  # a host's series of one job (one attempt of its run)
RANK = (*JOB, "rank", "local_rank")
GPU = (*JOB, "gpu", "UUID")
RUN = ("job_name", "run")  # `up`'s series of one run


@dataclass(frozen=True)
class MetricName:
    name: str  # a counter's without its _total: prometheus-client adds it, and so does `exposition`
    kind: str
    help: str
    labels: Tuple[str, ...]
    source: str  # "host", "up" or "ledger"

    @property
    def sample_name(self) -> str:
        return self.name + "_total" if self.kind == COUNTER else self.name


METRICS = (
    # -- each host of a running job: node_exporter's textfile collector -------------------------
    MetricName("ddpctl_job_info", GAUGE, "A job this host serves (1), with its job id and node rank.",
               (*JOB, "job_id", "node_rank"), "host"),
    MetricName("ddpctl_job_running", GAUGE, "1 while the job runs on this host; 0 once it has ended here.",
               JOB, "host"),
    MetricName("ddpctl_job_start_timestamp_seconds", GAUGE, "When the job started on this host (Unix time).",
               JOB, "host"),
    MetricName("ddpctl_job_end_timestamp_seconds", GAUGE, "When the job ended on this host (Unix time).",
               JOB, "host"),
    MetricName("ddpctl_job_exit_code", GAUGE, "The exit code of the job's torchrun on this host, once it ended.",
               JOB, "host"),
    MetricName("ddpctl_rank_steps", COUNTER, "Optimizer steps this rank's process has taken.", RANK, "host"),
    MetricName("ddpctl_rank_last_step_timestamp_seconds", GAUGE, "When this rank last took an optimizer step "
               "(Unix time).", RANK, "host"),
    MetricName("ddpctl_rank_step_median_seconds", GAUGE, "Median optimizer step time over the rank's last "
               "window of steps.", RANK, "host"),
    MetricName("ddpctl_rank_step_part_seconds", GAUGE, "Median time per step the rank spent in each part: "
               "compute (forward and backward), wait (in the gradient all-reduce, for the others), input "
               "(before its forward pass).", (*RANK, "part"), "host"),
    MetricName("ddpctl_rank_straggler", GAUGE, "1 while `ddpctl up` names this rank a straggler.", RANK, "host"),
    MetricName("ddpctl_gpu_info", GAUGE, "A GPU this job uses on this host (1), by DCGM's gpu and UUID, and its "
               "model.", (*GPU, "model_name"), "host"),
    MetricName("ddpctl_gpu_utilization_ratio", GAUGE, "The GPU's utilization as nvidia-smi reports it "
               "(0 to 1).", GPU, "host"),
    MetricName("ddpctl_gpu_memory_used_bytes", GAUGE, "GPU memory in use as nvidia-smi reports it.", GPU, "host"),
    # -- `ddpctl up --metrics-port`: the run ----------------------------------------------------
    MetricName("ddpctl_run_info", GAUGE, "A run `ddpctl up` serves these series for (1).", (*RUN, "backend"),
               "up"),
    MetricName("ddpctl_run_running", GAUGE, "1 while the run goes; 0 once it has ended.", RUN, "up"),
    MetricName("ddpctl_run_attempt", GAUGE, "The run's current attempt (0: the first).", RUN, "up"),
    MetricName("ddpctl_run_steps", GAUGE, "The most optimizer steps any rank has taken in this attempt.", RUN, "up"),
    MetricName("ddpctl_run_last_step_timestamp_seconds", GAUGE, "When a rank of the run last took an optimizer "
               "step (Unix time).", RUN, "up"),
    MetricName("ddpctl_run_wall_seconds", GAUGE, "The run's wall time so far.", RUN, "up"),
    MetricName("ddpctl_run_productive_seconds", GAUGE, "The run's productive time so far (training that was not "
               "re-done or held back).", RUN, "up"),
    MetricName("ddpctl_run_goodput_ratio", GAUGE, "Productive time over wall time so far (0 to 1).", RUN, "up"),
    MetricName("ddpctl_run_lost_seconds", GAUGE, "Time lost so far, by kind of loss, cause and the host charged "
               "(Hostname empty: no host).", (*RUN, "kind", "cause", "Hostname"), "up"),
    MetricName("ddpctl_run_restarts", COUNTER, "Restarts of the run, by what each restart is charged to.",
               (*RUN, "reason"), "up"),
    MetricName("ddpctl_run_hosts", GAUGE, "The run's hosts in each state: running or lost (in this attempt), "
               "out (left out of it), spare (waiting), and the ledger's suspect and quarantined.",
               (*RUN, "state"), "up"),
    MetricName("ddpctl_run_host_lost", GAUGE, "1 for a host the run has lost in this attempt.",
               (*RUN, "Hostname"), "up"),
    MetricName("ddpctl_run_straggler", GAUGE, "1 while a rank is named a straggler.", (*RUN, "Hostname", "rank"),
               "up"),
    # -- the host ledger: `ddpctl hosts --prom FILE` (and `up`, for its hosts) -------------------
    MetricName("ddpctl_host_state", GAUGE, "1 for the host's state in the ledger: ok, suspect or quarantined.",
               ("Hostname", "state"), "ledger"),
    MetricName("ddpctl_host_faults", GAUGE, "Host faults the ledger counts against the host in its quarantine "
               "window.", ("Hostname",), "ledger"),
    MetricName("ddpctl_host_cost_seconds", GAUGE, "Run time the ledger charges to the host within the window.",
               ("Hostname", "window"), "ledger"),
)

BY_NAME = {m.name: m for m in METRICS}  # type: Dict[str, MetricName]


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _value(value: float) -> str:
    if value != value:  # NaN
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def exposition(series: Iterable[Tuple[str, Sequence[Sample]]]) -> str:
    """Prometheus' text format (0.0.4) for (name, samples) pairs, each name from METRICS: its HELP
    and TYPE once, then each sample with its labels in the declared order (a name without
    samples is left out; a name given twice has its samples together, under one HELP and TYPE)."""
    grouped: Dict[str, List[Sample]] = {}
    for name, samples in series:
        grouped.setdefault(BY_NAME[name].name, []).extend(samples)
    lines: List[str] = []
    for name, samples in grouped.items():
        metric = BY_NAME[name]
        if not samples:
            continue
        lines.append("# HELP %s %s" % (metric.sample_name, _escape_help(metric.help)))
        lines.append("# TYPE %s %s" % (metric.sample_name, metric.kind))
        for labels, value in samples:
            unknown = set(labels) - set(metric.labels)
            if unknown:
                raise ValueError("%s has no label %s" % (name, ", ".join(sorted(unknown))))
            text = ",".join('%s="%s"' % (key, escape_label(str(labels[key]))) for key in metric.labels
                            if key in labels)
            lines.append("%s{%s} %s" % (metric.sample_name, text, _value(value)) if text
                         else "%s %s" % (metric.sample_name, _value(value)))
    return "".join(line + "\n" for line in lines)
