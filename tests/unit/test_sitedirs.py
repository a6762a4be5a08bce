"""node_agent/host/sitedirs.py: the site-packages a `python -S` agent would have had, found without site."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The site-packages directories on sys.path after a normal start (.pth additions are not among them).
NORMAL = ("import json, sys; print(json.dumps([p for p in sys.path "
          "if p.endswith(('site-packages', 'dist-packages'))]))")
BARE = (f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); from node_agent.host.sitedirs import site_packages; "
        "print(json.dumps(site_packages()))")


def dirs(python: str, *flags: str, code: str) -> list[str]:
    out = subprocess.run([python, *flags, "-c", code], capture_output=True, text=True, check=True).stdout
    return list(json.loads(out))


def test_without_site_it_finds_what_site_puts_on_the_path() -> None:
    assert dirs(sys.executable, "-S", code=BARE) == dirs(sys.executable, code=NORMAL)
    assert dirs(sys.executable, code=BARE) == [], "site ran: nothing to add"


@pytest.mark.parametrize("system", [False, True])
def test_a_virtualenv_gets_its_own_and_the_base_ones_only_when_it_includes_them(tmp_path: Path,
                                                                                system: bool) -> None:
    venv.create(tmp_path / "env", system_site_packages=system, with_pip=False, symlinks=True)
    python = str(tmp_path / "env" / "bin" / "python")
    found = dirs(python, "-S", code=BARE)
    assert found == dirs(python, code=NORMAL)
    assert found[0].startswith(str(tmp_path / "env")), "the virtualenv's own site-packages comes first"
    assert len(found) > 1 if system else len(found) == 1


def test_an_agent_without_site_still_finds_psutil_where_the_interpreter_has_it() -> None:
    """The agent runs as `python -S` (orchestrator/remote/agent.py); ports.py reads owners from
    psutil when the interpreter has it installed."""
    has = subprocess.run([sys.executable, "-c", "import psutil"], capture_output=True).returncode == 0
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import node_agent.ops.ports as p; "
            "print(p.psutil is not None)")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(has)
