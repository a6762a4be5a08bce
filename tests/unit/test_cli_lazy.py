"""`ddpctl COMMAND` imports that command's module only (start-up time is part of every command)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.cli import COMMANDS, command_named

PROBE = """
import json, sys
from orchestrator import cli
sys.argv = ["ddpctl", *sys.argv[1:]]
try:
    cli.main()
except SystemExit:
    pass
print("MODULES " + json.dumps(sorted(m for m in sys.modules if m.startswith("orchestrator.commands."))))
"""


def loaded(*argv: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60,
                         check=False)
    line = next(x for x in out.stdout.splitlines() if x.startswith("MODULES "))
    return json.loads(line[len("MODULES "):])


@pytest.mark.parametrize(("argv", "module"), [(("doctor", "--help"), "doctor"), (("kill-port", "--help"), "kill_port"),
                                              (("ps", "--help"), "lifecycle")])
def test_a_named_command_loads_its_own_module_only(argv: tuple[str, ...], module: str) -> None:
    assert [m for m in loaded(*argv) if m != "orchestrator.commands.common"] == [f"orchestrator.commands.{module}"]


def test_help_and_unknown_commands_get_the_whole_app() -> None:
    every = {f"orchestrator.commands.{m}" for m, _ in COMMANDS.values()}
    assert every <= set(loaded("--help"))
    assert every <= set(loaded("doctr"))  # click's "did you mean" needs every name


def test_the_command_is_the_first_word_that_is_not_an_option() -> None:
    assert command_named(["--version"]) is None
    assert command_named(["up", "job.toml", "--dry-run"]) == "up"
    assert command_named(["job.toml", "up"]) is None


def test_prometheus_client_is_imported_only_where_a_series_is_served_or_written() -> None:
    """It takes ~0.1 s to import: `up` without a metrics port, and `hosts` without --prom, go without it."""
    probe = PROBE.replace('m.startswith("orchestrator.commands.")', 'm == "prometheus_client"')
    for argv in (("--help",), ("up", "--help"), ("hosts", "--help")):
        out = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60,
                             check=False)
        assert "MODULES []" in out.stdout, (argv, out.stdout[-500:])
