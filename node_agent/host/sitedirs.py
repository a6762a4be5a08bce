"""The interpreter's site-packages, for a node agent that starts without them.

The agent runs as `python -S` (orchestrator/remote/agent.py): the site module's start-up, above
all the .pth files of a virtualenv or conda environment, cost each call 4 to 20 ms of CPU on the
host (an editable install's finder, setuptools' distutils shim), most of the agent's own start-up
on a host that doctor asks with every other at once, and the agent imports nothing from
site-packages itself. Two things look there all the same: psutil, when present
(node_agent/ops/ports.py), and the key of the torch facts' cache (node_agent/ops/torch_facts.py).
`site_packages()` names the directories site would add, reading pyvenv.cfg as site does, and runs
no .pth file. Standard library only, Python 3.8 and newer.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import List


def site_packages() -> List[str]:
    """The site-packages directories site would have put on sys.path (none when it ran)."""
    if not sys.flags.no_site:
        return []
    import site

    prefixes = [sys.prefix, sys.exec_prefix]
    user = not sys.flags.no_user_site and not os.environ.get("PYTHONNOUSERSITE")
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    for conf in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(os.path.dirname(exe_dir), "pyvenv.cfg")):
        if not os.path.isfile(conf):
            continue
        system = False
        try:
            with open(conf, encoding="utf-8") as f:
                for line in f:
                    key, sep, value = line.partition("=")
                    if sep and key.strip().lower() == "include-system-site-packages":
                        system = value.strip().lower() == "true"
        except OSError:
            pass
        prefixes = [os.path.dirname(conf)] + (prefixes if system else [])
        user = user and system
        break
    dirs = list(site.getsitepackages(prefixes))
    if user:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def add_site_packages() -> None:
    """Put them at the end of sys.path, once (an import that wants psutil)."""
    for d in site_packages():
        if d not in sys.path:
            sys.path.append(d)
