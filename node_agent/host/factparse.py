"""Pure parsers for the outputs facts.py collects (ip, iptables, nft, ufw, nvidia-smi, torch)."""

from __future__ import annotations

import json
import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, List, Optional, Tuple

BLOCKING_TARGETS = ("DROP", "REJECT")


def parse_ip_addr(text: str) -> List[Dict[str, Any]]:
    """`ip -j addr` -> [{name, up, addresses: [{family, address, prefixlen}]}]."""
    out = []
    for link in json.loads(text or "[]"):
        flags = link.get("flags") or []
        addrs = []
        for a in link.get("addr_info") or []:
            if a.get("family") in ("inet", "inet6") and a.get("local"):
                addrs.append({"family": a["family"], "address": a["local"],
                              "prefixlen": a.get("prefixlen"), "scope": a.get("scope")})
        out.append({"name": link.get("ifname"), "up": "UP" in flags or link.get("operstate") == "UP",
                    "operstate": link.get("operstate"), "loopback": "LOOPBACK" in flags,
                    "addresses": addrs})
    return out


def parse_route_get(text: str) -> Dict[str, Any]:
    """`ip -j route get ADDR` -> {dev, src, gateway}."""
    routes = json.loads(text or "[]")
    if not routes:
        raise ValueError("ip route get printed no route")
    r = routes[0]
    return {"dev": r.get("dev"), "src": r.get("prefsrc"), "gateway": r.get("gateway"),
            "type": r.get("type")}


def parse_proc_net_route(text: str) -> List[Dict[str, Any]]:
    """/proc/net/route (the kernel's IPv4 main table, hex little-endian) -> [{dst, dev, src,
    gateway, metric}], dst "default" or a CIDR; no source address (a route's src is then its
    device's address: addressing.HostNet.route). Read without starting `ip`, which costs each
    host a fork and exec."""
    import socket
    import struct

    out = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 8:
            continue
        flags = int(f[3], 16)
        if not flags & 0x1 or flags & 0x200:  # RTF_UP; RTF_REJECT (unreachable, blackhole)
            continue
        dst, gateway = (socket.inet_ntoa(struct.pack("<I", int(x, 16))) for x in (f[1], f[2]))
        prefix = bin(int(f[7], 16)).count("1")
        out.append({"dst": "default" if prefix == 0 else "%s/%d" % (dst, prefix), "dev": f[0], "src": None,
                    "gateway": gateway if flags & 0x2 else None, "metric": int(f[6])})
    return out


def port_ranges(spec: str) -> List[Tuple[int, int]]:
    """'22,80:90' or '29500-29510' or '{ 22, 29500 }' -> [(22, 22), (80, 90)]."""
    out = []
    for part in re.split(r"[,\s{}]+", spec):
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:[:-](\d+))?", part)
        if m:
            lo = int(m.group(1))
            out.append((lo, int(m.group(2) or lo)))
    return out


def _in_ranges(port: int, ranges: List[Tuple[int, int]]) -> bool:
    return any(lo <= port <= hi for lo, hi in ranges)


def parse_iptables_input(text: str, port: int) -> Dict[str, Any]:
    """`iptables -S INPUT` -> {policy, rules, blocking: rules that can drop `port`}."""
    policy = None
    rules: List[Dict[str, Any]] = []
    for line in text.splitlines():
        words = line.split()
        if words[:2] == ["-P", "INPUT"] and len(words) > 2:
            policy = words[2]
        elif words[:2] == ["-A", "INPUT"]:
            target = words[words.index("-j") + 1] if "-j" in words[:-1] else None
            dports: List[Tuple[int, int]] = []
            for flag in ("--dport", "--dports", "--destination-port"):
                if flag in words[:-1]:
                    dports += port_ranges(words[words.index(flag) + 1])
            rules.append({"rule": line.strip(), "target": target, "dports": dports,
                          "udp_only": "-p" in words and words[words.index("-p") + 1] == "udp",
                          "source": words[words.index("-s") + 1] if "-s" in words[:-1] else None})
    touching = [r["rule"] for r in rules if r["dports"] and _in_ranges(port, r["dports"])]
    blocking = [r["rule"] for r in rules if r["target"] in BLOCKING_TARGETS and not r["udp_only"]
                and "INVALID" not in r["rule"]
                and (not r["dports"] or _in_ranges(port, r["dports"]))]
    return {"policy": policy, "rules": [r["rule"] for r in rules], "touching_port": touching,
            "blocking": blocking}


def parse_nft_ruleset(text: str, port: int) -> Dict[str, Any]:
    """`nft list ruleset` -> input-hook chains' policies and rules that drop/reject `port`."""
    chains: List[Dict[str, Any]] = []
    current: Optional[Dict[str, Any]] = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("chain "):
            current = {"name": line.split()[1], "input": False, "policy": None, "blocking": []}
            chains.append(current)
        elif current is None or not line or line == "}":
            continue
        elif line.startswith("type ") and "hook input" in line:
            current["input"] = True
            m = re.search(r"policy (\w+)", line)
            current["policy"] = m.group(1) if m else "accept"
        elif re.search(r"\b(drop|reject)\b", line) and "invalid" not in line:
            m = re.search(r"dport\s+(\{[^}]*\}|\S+)", line)
            hits = m is None or _in_ranges(port, port_ranges(m.group(1)))
            if hits and "udp dport" not in line:
                current["blocking"].append(line)
    inputs = [c for c in chains if c["input"]]
    return {"input_chains": [{"name": c["name"], "policy": c["policy"]} for c in inputs],
            "blocking": [r for c in inputs for r in c["blocking"]],
            "policy_drop": any(c["policy"] == "drop" for c in inputs)}


def parse_ufw_status(text: str) -> Dict[str, Any]:
    """`ufw status verbose` -> {active, default_incoming, rules: [{to, action, from}]}."""
    active = False
    default_in = None
    rules = []
    in_table = False
    for line in text.splitlines():
        s = line.strip()
        if s.lower().startswith("status:"):
            active = s.split(":", 1)[1].strip().lower() == "active"
        elif s.lower().startswith("default:"):
            m = re.search(r"(\w+) \(incoming\)", s)
            default_in = m.group(1) if m else None
        elif s.startswith("--"):
            in_table = True
        elif in_table and s:
            parts = re.split(r"\s{2,}", s)
            if len(parts) >= 3:
                rules.append({"to": parts[0], "action": parts[1], "from": parts[2]})
    return {"active": active, "default_incoming": default_in, "rules": rules}


def _num(text: str) -> Optional[float]:
    try:
        return float(text)
    except ValueError:
        return None


def parse_nvidia_gpus(text: str) -> List[Dict[str, Any]]:
    """`nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        gpus.append({"index": int(parts[0]), "uuid": parts[1], "name": ", ".join(parts[2:-2]),
                     "memory_total_mib": _num(parts[-2]), "memory_used_mib": _num(parts[-1])})
    return gpus


def parse_nvidia_apps(text: str) -> List[Dict[str, Any]]:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits`."""
    apps = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[1].isdigit():
            continue
        apps.append({"gpu_uuid": parts[0], "pid": int(parts[1]), "name": ", ".join(parts[2:-1]),
                     "used_memory_mib": _num(parts[-1])})
    return apps


def count_nvidia_list(text: str) -> int:
    """`nvidia-smi -L` -> the number of GPUs ("GPU 0: ..." lines; indented MIG lines are not GPUs)."""
    return sum(1 for line in text.splitlines() if line.startswith("GPU "))


TORCH_MARK = "@@TORCH@@"


def parse_torch_output(returncode: int, stdout: str, stderr: str) -> Dict[str, Any]:
    """The torch snippet's JSON line, or why there is none (no torch, crashed interpreter)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(TORCH_MARK):
            data: Dict[str, Any] = json.loads(line[len(TORCH_MARK):])
            return data
    err = (stderr or stdout).strip().splitlines()
    last = err[-1] if err else "no output"
    if "No module named 'torch'" in (stderr or "") or "No module named torch" in (stderr or ""):
        return {"importable": False, "error": last}
    raise ValueError("torch probe exited %d: %s" % (returncode, last))


# `nvidia-smi --query-gpu=<GPU_STATS_QUERY> --format=csv,noheader,nounits`: what `ddpctl top` samples.
GPU_STATS_QUERY = "index,uuid,name,utilization.gpu,memory.used,memory.total,power.draw"
# A GPU the driver lists but cannot reach (after an Xid 79 "fallen off the bus": "GPU is lost"):
# nvidia-smi prints this line instead of its row (`GPU 0000:3B:00.0` or `GPU0000:3B:00.0`).
_GPU_HANDLE = re.compile(r"^Unable to determine the device handle for GPU\s*([0-9A-Fa-f:.]+):\s*(.*)$")
# Values that mean "this GPU does not say", not an error: the field is then None.
_NO_VALUE = ("[N/A]", "[Not Supported]", "N/A", "")


def _gpu_value(text: str) -> Tuple[Optional[float], Optional[str]]:
    """(number, None), (None, None) for a value the GPU does not report, or (None, error) for a
    bracketed complaint such as `[GPU is lost]` or `[Unknown Error]`."""
    if text in _NO_VALUE:
        return None, None
    number = _num(text)
    if number is not None:
        return number, None
    return None, text.strip("[]") or text


def _gpu_row(parts: List[str]) -> Dict[str, Any]:
    util, used, total, power = (_gpu_value(p) for p in parts[-4:])
    errors = [e for _, e in (util, used, total, power) if e]
    return {"index": int(parts[0]), "uuid": parts[1], "name": ", ".join(parts[2:-4]),
            "util_pct": util[0], "memory_used_mib": used[0], "memory_total_mib": total[0],
            "power_w": power[0], "error": errors[0] if errors else None}


def parse_nvidia_gpu_stats(text: str, returncode: int = 0) -> Dict[str, Any]:
    """`nvidia-smi --query-gpu=GPU_STATS_QUERY ...` (stdout and stderr together) -> {"gpus": [...],
    "error": None or the host's}. Each GPU: index, uuid, name, util_pct, memory_used_mib,
    memory_total_mib, power_w (None where it says [N/A] or [Not Supported]) and error (a GPU the
    driver cannot reach is an entry of its own: bus_id and error, index None). A run that lists
    no GPU and fails ("Failed to initialize NVML: ...", "NVIDIA-SMI has failed ...") is the host's
    error; "No devices were found" is a host without GPUs."""
    gpus: List[Dict[str, Any]] = []
    other: List[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        lost = _GPU_HANDLE.match(line)
        parts = [p.strip() for p in line.split(",")]
        if lost:
            gpus.append({"index": None, "bus_id": lost.group(1), "uuid": None, "name": None, "util_pct": None,
                         "memory_used_mib": None, "memory_total_mib": None, "power_w": None,
                         "error": lost.group(2).strip() or "unknown error"})
        elif len(parts) >= 7 and parts[0].isdigit():
            gpus.append(_gpu_row(parts))
        else:
            other.append(line)
    error = None
    if not gpus and (returncode != 0 or other) and not any(line.startswith("No devices were found") for line in other):
        error = other[0] if other else "nvidia-smi exited %d with no output" % returncode
    return {"gpus": gpus, "error": error}


def parse_proc_net_dev(text: str) -> Dict[str, Tuple[int, int]]:
    """/proc/net/dev -> {interface: (rx bytes, tx bytes)}."""
    out: Dict[str, Tuple[int, int]] = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and len(fields) >= 9:
            try:
                out[name.strip()] = (int(fields[0]), int(fields[8]))
            except ValueError:
                continue
    return out
