"""The rank wrapper, run as torchrun runs it (`python rankwrap.py script ARGS`): the user's program
behaves as under plain `python`, and its milestones and exception land in DDPCTL_RANK_DIR."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import node_agent.rank.rankwrap as rankwrap

WRAPPER = Path(rankwrap.__file__)


Records = dict[str, dict[str, Any]]


def run(tmp_path: Path, *argv: str, cwd: Path | None = None) -> tuple[subprocess.CompletedProcess[str], Records]:
    ranks = tmp_path / "ranks"
    ranks.mkdir(exist_ok=True)
    env = {**os.environ, "DDPCTL_RANK_DIR": str(ranks), "LOCAL_RANK": "1", "RANK": "3"}
    out = subprocess.run([sys.executable, str(WRAPPER), *argv], env=env, cwd=cwd or tmp_path,
                         capture_output=True, text=True, timeout=120)
    return out, {p.name: json.loads(p.read_text()) for p in ranks.iterdir()}


def test_the_script_sees_its_own_argv_path_and_main(tmp_path: Path) -> None:
    (tmp_path / "helper_mod.py").write_text("VALUE = 'imported from the script dir'\n")
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""\
        import sys, helper_mod
        if __name__ == "__main__":
            print(sys.argv, helper_mod.VALUE)
        """))
    out, records = run(tmp_path, str(script), "a b", "$(id)", ";'")
    assert out.returncode == 0, out.stderr
    expected = [str(script), "a b", "$(id)", ";'"]
    assert out.stdout.strip() == f"{expected} imported from the script dir"
    assert set(records) == {"1.started"} and records["1.started"]["rank"] == 3


def test_an_exception_is_recorded_with_the_users_traceback_and_still_raised(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text("def f():\n    raise ValueError('no good')\nf()\n")
    out, records = run(tmp_path, str(script))
    assert out.returncode == 1
    assert "ValueError: no good" in out.stderr  # Python's own report is unchanged
    err = records["1.error"]
    assert (err["type"], err["message"], err["rank"], err["local_rank"]) == ("ValueError", "no good", 3, 1)
    first_frame = err["traceback"].splitlines()[1]
    assert first_frame.startswith(f'  File "{script}", line 3'), err["traceback"]
    assert "rankwrap" not in err["traceback"] and "runpy" not in err["traceback"]


@pytest.mark.parametrize(("body", "code", "recorded"), [
    ("import sys; sys.exit(0)", 0, None),
    ("import sys; sys.exit(3)", 3, "exit code 3"),
    ("import sys; sys.exit('bad config')", 1, "bad config"),
])
def test_sys_exit(tmp_path: Path, body: str, code: int, recorded: str | None) -> None:
    script = tmp_path / "ex.py"
    script.write_text(body + "\n")
    out, records = run(tmp_path, str(script))
    assert out.returncode == code
    assert (records.get("1.error") or {}).get("message") == recorded


@pytest.mark.parametrize(("source", "shown", "carets"), [
    ("x = 1\nprint 'hi'\n", "print 'hi'", "^^^^^^^^^^"),  # on one line
    ("d = {\n 'a': 1\n 'b': 2}\n", "'a': 1", "     ^"),  # spans lines: the comma missing after 1
    ("x = (a +\n   b) = 3\n", "x = (a +", "     ^^^"),  # spans lines: an assignment to (a + b)
])
def test_a_syntax_errors_caret_line_is_recorded_as_python_prints_it(tmp_path: Path, source: str, shown: str,
                                                                    carets: str) -> None:
    script = tmp_path / "bad.py"
    script.write_text(source)
    out, records = run(tmp_path, str(script))
    assert out.returncode == 1
    err = records["1.error"]
    assert err["type"] == "SyntaxError"
    lines = err["traceback"].splitlines()
    at = lines.index(f"    {shown}")
    assert lines[at + 1] == f"    {carets}", err["traceback"]  # 3.10-3.12's traceback module: blank
    assert f"\n    {shown}\n    {carets}\n" in out.stderr  # as Python's own report shows it


def test_a_missing_script_reads_as_python_says_it(tmp_path: Path) -> None:
    out, records = run(tmp_path, "nope.py")
    assert out.returncode == 2
    assert f"can't open file '{tmp_path / 'nope.py'}'" in out.stderr
    assert f"can't open file '{tmp_path / 'nope.py'}'" in records["1.error"]["message"]


def test_a_module_runs_as_python_dash_m(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import sys\nif __name__ == '__main__':\n    print('module', sys.argv[1:])\n")
    out, records = run(tmp_path, "-m", "pkg.train", "--lr", "0.1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "module ['--lr', '0.1']"
    assert "1.started" in records


def test_init_process_group_entry_and_return_are_recorded_without_importing_torch_first(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "ddp.py"
    script.write_text(textwrap.dedent(f"""\
        import sys
        assert "torch" not in sys.modules, "the wrapper imported torch"
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
        print("initialized", dist.get_world_size())
        dist.destroy_process_group()
        """))
    out, records = run(tmp_path, str(script))
    assert out.returncode == 0, out.stderr
    assert "initialized 1" in out.stdout
    assert {"1.started", "1.init", "1.joined"} <= set(records)
    assert records["1.init"]["time"] <= records["1.joined"]["time"]


STEPPING = textwrap.dedent("""\
    import sys
    import torch
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(int(sys.argv[1])):
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
    if sys.argv[2] == "raise":
        raise RuntimeError("after the steps")
    if sys.argv[2] == "exit":
        sys.exit(75)
    """)


@pytest.mark.parametrize(("end", "code"), [("ok", 0), ("raise", 1), ("exit", 75)])
def test_optimizer_steps_are_counted_with_no_change_to_the_script(tmp_path: Path, end: str, code: int) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "steps.py"
    script.write_text(STEPPING)
    out, records = run(tmp_path, str(script), "7", end)
    assert out.returncode == code, out.stderr
    assert records["1.step"]["step"] == 7  # the last steps are written at exit, whatever the interval
    if end == "ok":
        assert "1.error" not in records
    else:
        assert records["1.error"]["step"] == 7
        assert records["1.error"].get("exit_code") == (75 if end == "exit" else None)


def test_a_script_without_an_optimizer_writes_no_step_record(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "plain.py"
    script.write_text("import torch.optim\nprint('no steps')\n")
    out, records = run(tmp_path, str(script))
    assert out.returncode == 0 and out.stdout.strip() == "no steps"
    assert set(records) == {"1.started"}
