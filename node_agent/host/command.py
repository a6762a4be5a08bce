"""One short command on this host, its output read whole: what the ops that ask a tool (nvidia-smi,
the kernel log) run. Standard library only, Python 3.8 and newer."""

from __future__ import annotations

import subprocess

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Callable, List, Tuple

    Runner = Callable[[List[str], float], Tuple[int, str]]  # run_command, or a test's recorded outputs


def run_command(argv: List[str], timeout: float) -> Tuple[int, str]:
    """(exit code, stdout and stderr together); FileNotFoundError when the program is missing."""
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                          check=False, text=True, errors="replace")
    return proc.returncode, proc.stdout or ""
