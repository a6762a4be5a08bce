"""Job files that got through before (issue 27): nesting too deep for the TOML parser, and NUL
bytes in strings that end up in an argv, an environment or a path. Each is one located error,
exit code 2 from the CLI, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from job_dir import write_job
from typer.testing import CliRunner

from inventory import ConfigError, JobOverrides, load_inventory, load_job, tomlsource
from inventory.tomlsource import MAX_NESTING
from orchestrator.cli import app

RUN = '[job]\nscript = "train.py"\n'
runner = CliRunner()


def error_of(path: Path, overrides: JobOverrides | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_job(path, overrides)
    return info.value


# --- 1. nesting ------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 3000, 100_000])
def test_args_nested_past_the_limit_is_located_at_the_bracket_that_crosses_it(cluster: Path, depth: int) -> None:
    path = write_job(cluster, RUN + "args = " + "[" * depth + "]" * depth + "\n")
    err = error_of(path)
    assert (err.file, err.line, err.column, err.key) == (path, 3, 8 + MAX_NESTING, "job.args")
    assert err.message == f"the value of job.args nests arrays or inline tables more than {MAX_NESTING} levels deep"
    assert err.hint is not None and 'args = ["--lr", "0.1"]' in err.hint


def test_nesting_up_to_the_limit_reaches_the_type_checks(cluster: Path) -> None:
    path = write_job(cluster, RUN + "args = " + "[" * MAX_NESTING + "]" * MAX_NESTING + "\n")
    assert error_of(path).message == "expected a string, got an array"


def test_a_deep_value_over_many_lines_is_located_on_the_line_that_crosses_the_limit(cluster: Path) -> None:
    path = write_job(cluster, RUN + "args = [\n" + "[\n" * 3000 + "]\n" * 3001)
    err = error_of(path)
    assert (err.line, err.column, err.key) == (3 + MAX_NESTING, 1, "job.args")


@pytest.mark.parametrize(("text", "line", "column", "key", "message"), [
    ("[env]\nA = " + "{a=" * 3000 + "1" + "}" * 3000 + "\n", 4, 5 + 3 * MAX_NESTING, "env.A",
     f"the value of env.A nests arrays or inline tables more than {MAX_NESTING} levels deep"),
    ("[env]\n" + ".".join(["a"] * 100_000) + ' = "1"\n', 4, 1, "env",
     f"a dotted key in [env] has more than {MAX_NESTING} parts"),
    ("[" + ".".join(["a"] * 100_000) + "]\n", 3, 2, None, f"a table header has more than {MAX_NESTING} parts"),
    ("[[" + ".".join(["a"] * 3000) + "]]\n", 3, 3, None, f"a table header has more than {MAX_NESTING} parts"),
    ("args = [{" + ".".join(["a"] * 3000) + " = 1}]\n", 3, 9 + 2 * MAX_NESTING, "job.args",
     f"a dotted key in the value of job.args has more than {MAX_NESTING} parts"),
])
def test_deep_tables_and_long_dotted_keys_are_refused_before_the_parser_sees_them(
        cluster: Path, text: str, line: int, column: int, key: str | None, message: str) -> None:
    # a 100,000-part dotted key costs tomllib minutes and gigabytes: refused from the text alone
    err = error_of(write_job(cluster, RUN + text))
    assert (err.line, err.column, err.key, err.message) == (line, column, key, message)


def test_floats_dates_and_dotted_keys_of_sane_length_are_not_nesting(cluster: Path) -> None:
    keys = ".".join(["k"] * MAX_NESTING)
    path = write_job(cluster, RUN + f'[env]\nA = "1.2.3.4.5.6.7.8.9.0.1.2.3.4.5.6.7.8.9.0.1.2.3.4.5.6.7.8.9.0.1.2.3"\n'
                              f'[rendezvous]\nx = [1.5, 2.5, 1979-05-27T07:32:00.999, {{{keys} = 0.5}}]\n')
    assert error_of(path).message == 'unknown key "x" in [rendezvous]'  # got past the scan and the parser


def test_a_recursion_error_of_the_parser_is_still_a_config_error(cluster: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tomlsource, "MAX_NESTING", 10**9)  # as if the scan had missed it
    path = write_job(cluster, RUN + "args = " + "[" * 3000 + "]" * 3000 + "\n")
    err = error_of(path)
    assert (err.file, err.line, err.message) == (path, None, "job file nests too deeply for the TOML parser")


def test_an_inventory_nested_too_deep_names_the_inventory(cluster: Path) -> None:
    (cluster / "hosts.toml").write_text('[[hosts]]\nname = "n0"\nenv = ' + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(cluster / "hosts.toml")
    assert (info.value.file, info.value.line, info.value.key) == (cluster / "hosts.toml", 3, "hosts[0].env")
    err = error_of(write_job(cluster, 'inventory = "hosts.toml"\n' + RUN))
    assert err.file == cluster / "hosts.toml"


@pytest.mark.parametrize("command", [["up", "--dry-run"], ["doctor"]])
def test_the_cli_prints_one_located_error_and_exits_2(cluster: Path, command: list[str]) -> None:
    path = write_job(cluster, RUN + "args = " + "[" * 100_000 + "]" * 100_000 + "\n")
    result = runner.invoke(app, [command[0], str(path), *command[1:]])
    assert result.exit_code == 2, result.output
    assert f"error: {path}:3:{8 + MAX_NESTING}, key job.args: the value of job.args nests" in result.stderr
    assert "Traceback" not in result.output and "RecursionError" not in result.output


# --- 2. NUL bytes ----------------------------------------------------------------------------------

NUL = "\\u0000"  # as TOML writes it


@pytest.mark.parametrize(("text", "key"), [
    (RUN + f'[env]\nA = "x{NUL}y"\n', "env.A"),
    (RUN + f'args = ["--lr", "0.1{NUL}"]\n', "job.args[1]"),
    (f'[job]\nscript = "train.py{NUL}"\n', "job.script"),
    (RUN + f'[slurm]\npython = "python3{NUL}"\n', "slurm.python"),
    (RUN + f'[slurm]\nsetup = ["module load cuda{NUL}"]\n', "slurm.setup[0]"),
    (RUN + f'[slurm]\nworkdir = "/data{NUL}"\n', "slurm.workdir"),
    (RUN + f'[slurm]\nextra_sbatch = ["--exclusive{NUL}"]\n', "slurm.extra_sbatch[0]"),
    (RUN + f'[sync]\nsrc = "."\nexclude = ["*.pt{NUL}"]\n', "sync.exclude[0]"),
])
def test_a_nul_in_any_string_of_the_job_file_is_an_error_naming_its_key(cluster: Path, text: str, key: str) -> None:
    path = write_job(cluster, text)
    err = error_of(path)
    assert (err.file, err.key) == (path, key)
    assert err.line == text.count("\n", 0, text.index(NUL)) + 1
    assert err.message.startswith('the value contains a NUL byte ("\\u0000" in TOML)')


def test_a_nul_in_an_env_name_is_refused_as_a_name(cluster: Path) -> None:
    err = error_of(write_job(cluster, RUN + f'[env]\n"A{NUL}" = "1"\n'))
    assert err.key == "env.A\0" and "is not a valid environment variable name" in err.message


@pytest.mark.parametrize(("host_line", "key"), [
    (f'python = "/opt/py{NUL}/bin/python"', "hosts[0].python"),
    (f'workdir = "/srv{NUL}"', "hosts[0].workdir"),
    (f'env = {{ NCCL_DEBUG = "INFO{NUL}" }}', "hosts[0].env.NCCL_DEBUG"),
])
def test_a_nul_in_the_inventory_names_its_key_and_file(cluster: Path, host_line: str, key: str) -> None:
    (cluster / "hosts.toml").write_text(f'[[hosts]]\nname = "n0"\n{host_line}\n')
    err = error_of(write_job(cluster, 'inventory = "hosts.toml"\n' + RUN))
    assert (err.file, err.line, err.key) == (cluster / "hosts.toml", 3, key)
    assert "NUL byte" in err.message


def test_a_nul_in_an_env_override_names_the_flag(cluster: Path) -> None:
    err = error_of(write_job(cluster, RUN), JobOverrides(env=(("A", "x\0"),)))
    assert err.key == "--env" and "NUL byte" in err.message


@pytest.mark.parametrize(("key", "text"), [("job.name", 'script = "train.py"\nname = "toy\\n"'),
                                          ("job.module", 'module = "pkg.train\\n"')])
def test_a_trailing_newline_is_not_let_through_by_a_pattern(cluster: Path, key: str, text: str) -> None:
    err = error_of(write_job(cluster, f"[job]\n{text}\n"))
    assert err.key == key


@pytest.mark.parametrize("command", [["up", "--dry-run"], ["doctor"]])
def test_the_cli_refuses_a_nul_before_any_host_is_asked(cluster: Path, command: list[str]) -> None:
    path = write_job(cluster, 'inventory = "hosts.toml"\n' + RUN + f'[env]\nA = "x{NUL}"\n')
    result = runner.invoke(app, [command[0], str(path), *command[1:], "--connect-timeout", "1"])
    assert result.exit_code == 2, result.output
    assert f"error: {path}:5:5, key env.A: the value contains a NUL byte" in result.stderr
    assert "Traceback" not in result.output and "embedded null byte" not in result.output
