"""The CLI stays a function call plus rendering (STYLE.md practice 2): no function under
orchestrator/commands/ is longer than a screen, and `up` is one call into orchestrator/run_up.py."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ROOT / "orchestrator" / "commands"
MAX_LINES = 60  # a function, its signature and docstring included, reads in one screen


def function_lengths(source: str, filename: str = "<source>") -> list[tuple[str, int]]:
    """Every function of the source (methods and nested ones too): its name, and its length in
    lines from its `def` to its last line."""
    return [(node.name, (node.end_lineno or node.lineno) - node.lineno + 1)
            for node in ast.walk(ast.parse(source, filename))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def too_long(folder: Path) -> list[str]:
    return sorted(f"{path.relative_to(ROOT)}:{name} ({lines} lines)" for path in sorted(folder.glob("*.py"))
                  for name, lines in function_lengths(path.read_text(), str(path)) if lines > MAX_LINES)


def test_no_command_function_is_longer_than_a_screen() -> None:
    assert too_long(COMMANDS) == []


def test_the_length_check_counts_from_def_to_the_last_line() -> None:
    long_body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    source = f"def short() -> None:\n    pass\n\n\ndef long() -> None:\n{long_body}\n"
    assert function_lengths(source) == [("short", 2), ("long", MAX_LINES + 1)]


def test_up_calls_run_up_once_and_renders() -> None:
    tree = ast.parse((COMMANDS / "up.py").read_text())
    command = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "up_command")
    calls = [n.func.id for n in ast.walk(command) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert calls.count("run_up") == 1
    assert not {"make_pool", "backend_for"} & set(calls)
