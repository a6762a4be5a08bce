"""The layout's one-way arrows, checked on the source: commands never reach into node_agent, nothing
imports orchestrator, inventory stays pure, node_agent stays standard-library only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def top_level(folder: str) -> dict[Path, set[str]]:
    return {p: {name.split(".")[0] for name in imports(p)} for p in sorted((ROOT / folder).rglob("*.py"))}


def test_nothing_under_commands_imports_node_agent() -> None:
    offenders = [str(p.relative_to(ROOT)) for p, mods in top_level("orchestrator/commands").items()
                 if "node_agent" in mods]
    assert offenders == []


@pytest.mark.parametrize("folder", ["inventory", "node_agent", "train_jobs"])
def test_nothing_imports_orchestrator(folder: str) -> None:
    offenders = [str(p.relative_to(ROOT)) for p, mods in top_level(folder).items() if "orchestrator" in mods]
    assert offenders == []


def test_inventory_is_pure() -> None:
    banned = {"subprocess", "socket", "paramiko", "fabric", "node_agent"}
    offenders = {str(p.relative_to(ROOT)): mods & banned for p, mods in top_level("inventory").items() if mods & banned}
    assert offenders == {}


def test_node_agent_needs_only_the_standard_library_and_optional_psutil() -> None:
    allowed = set(sys.stdlib_module_names) | {"node_agent", "psutil", "__future__"}
    offenders = {str(p.relative_to(ROOT)): mods - allowed for p, mods in top_level("node_agent").items()
                 if mods - allowed}
    assert offenders == {}


def test_the_agent_wire_is_decoded_only_in_the_remote_layer() -> None:
    users = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "orchestrator").rglob("*.py"))
             if "node_agent.protocol" in imports(p)]
    assert users == ["orchestrator/remote/agent.py"]
