"""Bad input through the real CLI: one located error on stderr, exit code 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app

CASES = {
    "malformed": ('[job\nscript = "t.py"\n', "job.toml:1:5: invalid TOML"),
    "unknown key": ('[job]\nscript = "t.py"\nnproc_per_nod = 2\n',
                    'job.toml:3:1, key job.nproc_per_nod: unknown key "nproc_per_nod" in [job]'),
    "wrong type": ('[job]\nscript = "t.py"\nnproc_per_node = "two"\n', "key job.nproc_per_node"),
    "port range": ('[job]\nscript = "t.py"\n[rendezvous]\nmaster_port = 70000\n',
                   "job.toml:4:15, key rendezvous.master_port: port 70000 is outside 1-65535"),
    "nproc zero": ('[job]\nscript = "t.py"\nnproc_per_node = 0\n', "key job.nproc_per_node"),
    "missing script": ('[job]\nscript = "nope.py"\n', "key job.script"),
    "host not in inventory": ('inventory = "hosts.toml"\n[job]\nscript = "t.py"\nhosts = ["node9"]\n',
                              "key job.hosts[0]"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_job_file_is_one_located_error_with_exit_2(tmp_path: Path, case: str) -> None:
    text, expected = CASES[case]
    (tmp_path / "t.py").write_text("")
    (tmp_path / "hosts.toml").write_text('[[hosts]]\nname = "node0"\n')
    job = tmp_path / "job.toml"
    job.write_text(text)
    result = CliRunner().invoke(app, ["up", str(job), "--dry-run"])
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output
    assert "fix:" in result.output


def test_empty_inventory_is_an_error_naming_the_inventory(tmp_path: Path) -> None:
    (tmp_path / "hosts.toml").write_text("[defaults]\nuser = \"x\"\n")
    result = CliRunner().invoke(app, ["ps", "-i", str(tmp_path / "hosts.toml")])
    assert result.exit_code == 2
    assert "hosts.toml" in result.output and "Traceback" not in result.output


def test_version_and_help_list_every_command() -> None:
    assert CliRunner().invoke(app, ["--version"]).output.startswith("ddpctl ")
    help_text = CliRunner().invoke(app, ["--help"]).output
    for command in ("up", "doctor", "kill-port", "ps", "down", "logs", "stacks"):
        assert command in help_text
