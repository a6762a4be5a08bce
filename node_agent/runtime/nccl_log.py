"""Parse NCCL_DEBUG=INFO logs: which network, interfaces and transports NCCL actually chose."""

from __future__ import annotations

import re
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, Iterable, List

NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
USING_IF = re.compile(r"NCCL INFO (NET/\S+|Bootstrap)\s*: Using (.+)$")
IF_ITEM = re.compile(r"\[\d+\]([\w.:-]+?):([0-9a-fA-F.:]+)<\d+>|([\w.-]+):([0-9a-fA-F.:]+)<\d+>")
VIA = re.compile(r"NCCL INFO Channel \S+ : .* via (\S+)")


def parse_lines(lines: Iterable[str]) -> Dict[str, Any]:
    networks: List[str] = []
    interfaces: List[str] = []
    bootstrap: List[str] = []
    transports: List[str] = []
    for line in lines:
        m = NETWORK.search(line)
        if m and m.group(1) not in networks:
            networks.append(m.group(1))
        m = USING_IF.search(line)
        if m:
            names = ["%s (%s)" % (i[0] or i[2], i[1] or i[3]) for i in IF_ITEM.findall(m.group(2))]
            target = bootstrap if m.group(1) == "Bootstrap" else interfaces
            target += [n for n in names if n not in target]
        m = VIA.search(line)
        if m:
            kind = m.group(1).split("/")[0] + ("/" + m.group(1).split("/")[1] if "/" in m.group(1) else "")
            if kind not in transports:
                transports.append(kind)
    return {"networks": networks, "interfaces": interfaces, "bootstrap": bootstrap,
            "transports": transports}


def parse_files(paths: Iterable[Path]) -> Dict[str, Any]:
    lines: List[str] = []
    files = []
    for p in paths:
        try:
            lines += p.read_text(errors="replace").splitlines()
            files.append(str(p))
        except OSError:
            continue
    result = parse_lines(lines)
    result["files"] = files
    return result
