"""`ddpctl doctor`: one agent session per host (facts, then the TCP probe), pure checks, a report
(core.py); its runner, below the CLI (runner.py); the jobs it launches (smoke, bandwidth, deep).

Called, this package is the Python API's doctor: `orchestrator.doctor(job, ...)` (runner.doctor)."""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from orchestrator.checks.model import CheckStatus, DoctorContext, Finding, Report
from orchestrator.doctor.core import columns, remember, run_doctor
from orchestrator.remote.wire import HostFacts

if TYPE_CHECKING:
    from orchestrator.doctor.runner import DoctorReport

__all__ = ["CheckStatus", "DoctorContext", "Finding", "HostFacts", "Report", "columns", "remember", "run_doctor"]


class CallableDoctor(types.ModuleType):
    """This package, called: `orchestrator.doctor(job, ...)` is the Python API's doctor
    (runner.doctor). The package and the function share the name the API promises; a module
    cannot be called, so this one's class is this."""

    def __call__(self, *args: Any, **kwargs: Any) -> DoctorReport:
        from orchestrator.doctor.runner import doctor

        return doctor(*args, **kwargs)


sys.modules[__name__].__class__ = CallableDoctor
