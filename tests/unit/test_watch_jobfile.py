"""The job file's [watch] table (inventory/watch.py): its defaults, each key, the located error of
each bad value, and total_steps reaching every rank as DDPCTL_TOTAL_STEPS
(orchestrator/launch/plan.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from job_dir import write_job

from inventory import ConfigError, load_job
from inventory.model import WatchSpec
from inventory.watch import MAX_SECONDS, WATCH_KEYS
from orchestrator.launch.plan import TOTAL_STEPS_ENV, build_plan, host_env

JOB = 'inventory = "hosts.toml"\n[job]\nscript = "train.py"\n'


def load_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_job(path)
    return info.value


def line_of(path: Path, text: str) -> int:
    return path.read_text().splitlines().index(text) + 1


@pytest.mark.parametrize("extra", ["", "[watch]\n"], ids=["no-table", "empty-table"])
def test_without_watch_values_the_defaults_hold(cluster: Path, extra: str) -> None:
    spec = load_job(write_job(cluster, JOB + extra)).watch
    assert spec == WatchSpec()
    assert (spec.total_steps, spec.hang_after, spec.pulse, spec.straggler_threshold) == (None, 60.0, 30.0, 0.10)
    assert (spec.straggler_warmup, spec.straggler_recovery) == (30.0, 15.0)


def test_a_full_watch_table_loads_every_value(cluster: Path) -> None:
    spec = load_job(write_job(cluster, JOB + "[watch]\ntotal_steps = 5000\nhang_after = 120\npulse = 2.5\n"
                              "straggler_threshold = 0.25\n")).watch
    assert spec == WatchSpec(total_steps=5000, hang_after=120.0, pulse=2.5, straggler_threshold=0.25)
    assert isinstance(spec.hang_after, float) and isinstance(spec.total_steps, int)


@pytest.mark.parametrize(("body", "field", "value"), [
    ("total_steps = 1", "total_steps", 1),
    ("hang_after = 1", "hang_after", 1.0),
    (f"hang_after = {MAX_SECONDS}", "hang_after", float(MAX_SECONDS)),
    ("pulse = 1", "pulse", 1.0),
    ("pulse = 0.5e2", "pulse", 50.0),
    ("straggler_threshold = 0.01", "straggler_threshold", 0.01),
    ("straggler_threshold = 10", "straggler_threshold", 10.0),
    ("straggler_warmup = 0", "straggler_warmup", 0.0),
    ("straggler_warmup = 120", "straggler_warmup", 120.0),
    ("straggler_recovery = 0", "straggler_recovery", 0.0),
    ("straggler_recovery = 1.5", "straggler_recovery", 1.5),
], ids=["total-one", "hang-low", "hang-high", "pulse-low", "pulse-float", "threshold-low", "threshold-high",
        "warmup-none", "warmup", "recovery-none", "recovery-float"])
def test_each_key_alone_and_at_its_limits(cluster: Path, body: str, field: str, value: float) -> None:
    spec = load_job(write_job(cluster, JOB + "[watch]\n" + body + "\n")).watch
    assert getattr(spec, field) == value
    others = {k: v for k, v in vars(WatchSpec()).items() if k != field}
    assert {k: v for k, v in vars(spec).items() if k != field} == others


# (case id, [watch] line, key, message part, hint part (None: not checked))
BAD_WATCH = [
    ("unknown-key", "hang_afer = 30", "watch.hang_afer", 'unknown key "hang_afer" in [watch]',
     'did you mean "hang_after"?'),
    ("total-quoted", 'total_steps = "100"', "watch.total_steps", 'expected an integer, got string "100"',
     "total_steps = 100"),
    ("total-float", "total_steps = 100.5", "watch.total_steps", "expected an integer", None),
    ("total-bool", "total_steps = true", "watch.total_steps", "expected an integer", None),
    ("total-zero", "total_steps = 0", "watch.total_steps", "0 is out of range", None),
    ("hang-string", 'hang_after = "60"', "watch.hang_after", "expected a number, got str", "from 1 to 604800"),
    ("hang-bool", "hang_after = true", "watch.hang_after", "expected a number, got bool", None),
    ("hang-zero", "hang_after = 0", "watch.hang_after", "0 is out of range", "from 1 to 604800"),
    ("hang-past-a-week", "hang_after = 604801", "watch.hang_after", "604801 is out of range", None),
    ("pulse-string", 'pulse = "30s"', "watch.pulse", "expected a number, got str", None),
    ("pulse-bool", "pulse = false", "watch.pulse", "expected a number, got bool", None),
    ("pulse-below-a-second", "pulse = 0.5", "watch.pulse", "0.5 is out of range", "from 1 to"),
    ("pulse-negative", "pulse = -30", "watch.pulse", "-30 is out of range", None),
    ("threshold-string", 'straggler_threshold = "10%"', "watch.straggler_threshold",
     "expected a number, got str", "from 0.01 to 10"),
    ("threshold-bool", "straggler_threshold = true", "watch.straggler_threshold", "expected a number, got bool",
     None),
    ("threshold-zero", "straggler_threshold = 0", "watch.straggler_threshold", "0 is out of range", None),
    ("threshold-too-high", "straggler_threshold = 11", "watch.straggler_threshold", "11 is out of range", None),
    ("threshold-nan", "straggler_threshold = nan", "watch.straggler_threshold", "out of range", None),
    ("hang-inf", "hang_after = inf", "watch.hang_after", "out of range", None),
    ("warmup-string", 'straggler_warmup = "30s"', "watch.straggler_warmup", "expected a number, got str",
     "from 0 to 604800"),
    ("warmup-negative", "straggler_warmup = -1", "watch.straggler_warmup", "-1 is out of range", None),
    ("recovery-bool", "straggler_recovery = true", "watch.straggler_recovery", "expected a number, got bool", None),
    ("recovery-past-a-week", "straggler_recovery = 604801", "watch.straggler_recovery", "604801 is out of range",
     None),
]


@pytest.mark.parametrize(("line", "key", "message", "hint"), [c[1:] for c in BAD_WATCH],
                         ids=[c[0] for c in BAD_WATCH])
def test_a_bad_watch_value_is_a_located_error(cluster: Path, line: str, key: str, message: str,
                                              hint: str | None) -> None:
    body = "total_steps = 10\n" if not line.startswith("total_steps") else "hang_after = 10\n"  # a good key first
    path = write_job(cluster, JOB + "[watch]\n" + body + line + "\n")
    err = load_error(path)
    assert (err.file, err.key, err.line) == (path, key, line_of(path, line))
    assert message in err.message
    if hint is not None:
        assert err.hint is not None and hint in err.hint


def test_the_unknown_key_hint_lists_the_keys_when_nothing_is_close(cluster: Path) -> None:
    err = load_error(write_job(cluster, JOB + "[watch]\nzzz = 1\n"))
    assert err.key == "watch.zzz"
    assert err.hint is not None and all(k in err.hint for k in WATCH_KEYS)


def test_watch_that_is_not_a_table_is_an_error(cluster: Path) -> None:
    err = load_error(write_job(cluster, "watch = 3\n" + JOB))
    assert err.key == "watch" and "expected a table" in err.message


# -- DDPCTL_TOTAL_STEPS -----------------------------------------------------------------------------


def test_total_steps_reaches_every_hosts_rank_env(cluster: Path) -> None:
    job = load_job(write_job(cluster, JOB + "[watch]\ntotal_steps = 2500\n"))
    plan = build_plan(job, "train-1", {h.name: 2 for h in job.hosts}, 29500)
    assert [hl.env[TOTAL_STEPS_ENV] for hl in plan.hosts] == ["2500"] * len(job.hosts)
    assert TOTAL_STEPS_ENV == "DDPCTL_TOTAL_STEPS"


def test_without_total_steps_the_env_has_none(cluster: Path) -> None:
    job = load_job(write_job(cluster, JOB + "[watch]\nhang_after = 30\n"))
    assert TOTAL_STEPS_ENV not in host_env(job, job.hosts[0], "train-1")


def test_the_jobs_own_total_steps_wins(cluster: Path) -> None:
    job = load_job(write_job(cluster, JOB + '[env]\nDDPCTL_TOTAL_STEPS = "777"\n[watch]\ntotal_steps = 2500\n'))
    assert host_env(job, job.hosts[0], "train-1")[TOTAL_STEPS_ENV] == "777"
    job = load_job(write_job(cluster, JOB + '[env]\nDDPCTL_TOTAL_STEPS = "777"\n'))
    assert host_env(job, job.hosts[0], "train-1")[TOTAL_STEPS_ENV] == "777"
