"""ddpctl's control plane: the CLI (commands/), the remote layer (remote/), the launch pipeline
(launch/), doctor (doctor/) and host operations (hostops/).

The Python entry point is `orchestrator.up` (see orchestrator/api.py); it is imported on first
use, so `import orchestrator` stays cheap for the CLI."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "plan", "up"]

if TYPE_CHECKING:
    from orchestrator.api import plan, up


def __getattr__(name: str) -> Any:
    if name in ("up", "plan"):
        from orchestrator import api

        return getattr(api, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
