"""The specs of doctor's checks that are a job through the real launch path: `smoke` (--smoke: a gloo
all_reduce across the hosts) and `bandwidth` (--bandwidth: the all_reduce table). The jobs and their
findings are orchestrator/doctor/collective.py's, above the launch they go through."""

from __future__ import annotations

from orchestrator.checks.spec import CheckSpec, Runs

SMOKE = CheckSpec("smoke", order=150, runs=Runs.JOB)
BANDWIDTH = CheckSpec("bandwidth", order=160, runs=Runs.JOB)
