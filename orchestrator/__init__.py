"""ddpctl's control plane: the CLI (commands/), the remote layer (remote/), the launch pipeline
(launch/), doctor (doctor/) and host operations (hostops/).

The Python entry points are `orchestrator.up`, `orchestrator.plan` and `orchestrator.doctor` (see
orchestrator/api.py); they are imported on first use, so `import orchestrator` stays cheap for the
CLI. `orchestrator.doctor` is also the package of doctor's runner: called, it runs doctor
(orchestrator/doctor/__init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "doctor", "plan", "up"]

if TYPE_CHECKING:
    from orchestrator.api import doctor as doctor
    from orchestrator.api import plan, up


def __getattr__(name: str) -> Any:
    if name in ("up", "plan"):
        from orchestrator import api

        return getattr(api, name)
    if name == "doctor":  # the package, callable (its __init__); importing it sets this attribute
        import importlib

        return importlib.import_module("orchestrator.doctor")
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
