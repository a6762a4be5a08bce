"""Every command's `--help` ends with real examples: `ddpctl <command> ...` lines, each flag one of its own."""

from __future__ import annotations

import re

import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

from orchestrator.cli import COMMANDS, build

# An 80-column terminal (rich's width where CI forces a terminal): an example line must not wrap there.
ENV = {"COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"}
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def help_lines(name: str) -> list[str]:
    result = CliRunner().invoke(build(), [name, "--help"], env=ENV)
    assert result.exit_code == 0, result.output
    return [ANSI.sub("", line).strip().strip("│").strip() for line in result.output.splitlines()]


def own_flags(name: str) -> set[str]:
    group = typer.main.get_command(build())
    assert isinstance(group, TyperGroup)
    command = group.commands[name]
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts) if opt.startswith("--")}


def example_lines(name: str, lines: list[str]) -> list[str]:
    """The `ddpctl <name>` lines after the last panel (the options): what the help ends with."""
    last_panel = max(i for i, line in enumerate(lines) if line.startswith("╰"))
    out: list[str] = []
    for line in reversed([line for line in lines[last_panel + 1:] if line]):
        if not line.startswith(f"ddpctl {name} "):
            break
        out.insert(0, line)
    return out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_ends_with_examples_of_the_command(name: str) -> None:
    examples = example_lines(name, help_lines(name))
    assert 1 <= len(examples) <= 2, f"`ddpctl {name} --help` does not end with 1-2 `ddpctl {name} ...` lines"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_flag_in_an_example_is_the_commands_own(name: str) -> None:
    flags = own_flags(name)
    for line in example_lines(name, help_lines(name)):
        unknown = set(FLAG.findall(line)) - flags
        assert not unknown, f"{line!r}: {sorted(unknown)} not options of `ddpctl {name}`"


def test_every_command_has_a_one_line_summary_in_ddpctls_help() -> None:
    """`ddpctl --help` on an 80-column terminal: each command's summary fits its one row."""
    result = CliRunner().invoke(build(), ["--help"], env=ENV)
    assert result.exit_code == 0, result.output
    lines = [ANSI.sub("", line).strip().strip("│").rstrip() for line in result.output.splitlines()]
    start = next(i for i, line in enumerate(lines) if "Commands" in line) + 1
    rows = lines[start:next(i for i in range(start, len(lines)) if lines[i].startswith("╰"))]
    named = [row.split()[0] for row in rows if row[1:2] != " "]  # a row cut in two goes on indented
    assert named == list(COMMANDS)  # every row names a command: no summary spills onto a row of its own
    for row in rows:
        assert row.rstrip().endswith("."), f"a summary cut in two: {row!r}"
