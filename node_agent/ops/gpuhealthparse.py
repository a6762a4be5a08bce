"""Pure parsers for the gpu_health op (node_agent/ops/gpuhealth.py): nvidia-smi's health query, its
refusal of a field this driver does not know, and the kernel log's `NVRM: Xid` lines.

nvidia-smi refuses a whole query for one unknown field (`Field "x" is not a valid field to query.`),
so the op asks the fields in groups when the full query is refused; each group starts with `index`
so that its rows join the base group's. Standard library only, Python >= 3.8."""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# The base group: fields every driver knows. `index` first: the other groups join on it.
BASE_FIELDS = ("index", "uuid", "name", "pci.bus_id")
THROTTLE_FIELD = "clocks_throttle_reasons.active"
THROTTLE_RENAMED = "clocks_event_reasons.active"  # its name since driver 535 (the old one stays an alias)
# The groups asked one by one when the full query is refused; each is a unit a driver knows or not.
FIELD_GROUPS = (
    ("ecc.errors.uncorrected.volatile.total",),
    ("retired_pages.pending",),
    ("remapped_rows.pending", "remapped_rows.failure"),
    (THROTTLE_FIELD,),
    ("pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max"),
    ("temperature.gpu",),
)
HEALTH_FIELDS = BASE_FIELDS + tuple(f for group in FIELD_GROUPS for f in group)

# The reply's field for each query field (node_agent/wire/replies_gpu.py GpuHealth), and how to read it.
KEYS = {
    "index": "index", "uuid": "uuid", "name": "name", "pci.bus_id": "bus_id",
    "ecc.errors.uncorrected.volatile.total": "ecc_uncorrected",
    "retired_pages.pending": "retired_pages_pending",
    "remapped_rows.pending": "remap_pending", "remapped_rows.failure": "remap_failure",
    THROTTLE_FIELD: "throttle_mask", THROTTLE_RENAMED: "throttle_mask",
    "pcie.link.gen.current": "pcie_gen", "pcie.link.gen.max": "pcie_gen_max",
    "pcie.link.width.current": "pcie_width", "pcie.link.width.max": "pcie_width_max",
    "temperature.gpu": "temperature_c",
}
XID_KEEP = 20  # the last Xid lines a reply carries

_REFUSED = re.compile(r'Field "([^"]+)" is not a valid field to query')
# A GPU the driver lists but cannot reach: nvidia-smi prints this instead of its row.
_LOST = re.compile(r"^Unable to determine the device handle for GPU\s*([0-9A-Fa-f:.]+):\s*(.*)$")
_NO_VALUE = ("[N/A]", "[Not Supported]", "N/A", "Not Supported", "")
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),?\s*(.*)$")
_STAMP = re.compile(r"^\s*\[\s*([^\]]*?)\s*\]")


def query_argv(fields: Sequence[str]) -> List[str]:
    return ["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]


def refused_field(text: str) -> Optional[str]:
    """The field nvidia-smi names when it refuses a query (None: it did not refuse one)."""
    found = _REFUSED.search(text)
    return found.group(1) if found else None


def _int(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(float(text))


def _bool(text: str) -> bool:
    if text.lower() in ("yes", "true", "1"):
        return True
    if text.lower() in ("no", "false", "0"):
        return False
    raise ValueError(text)


_CONVERT: Dict[str, Callable[[str], Any]] = {
    "index": int, "uuid": str, "name": str, "bus_id": str, "temperature_c": float,
    "retired_pages_pending": _bool, "remap_pending": _bool, "remap_failure": _bool}


def health_value(key: str, text: str) -> Tuple[Any, Optional[str]]:
    """(value, None); (None, None) for a value the GPU does not report; (None, error) for a
    bracketed complaint such as `[GPU is lost]` or `[Unknown Error]`."""
    text = text.strip()
    if text in _NO_VALUE:
        return None, None
    try:
        return _CONVERT.get(key, _int)(text), None
    except ValueError:
        return None, "%s: %s" % (key, text.strip("[]") or text)


def _row(fields: Sequence[str], parts: List[str]) -> Dict[str, Any]:
    if len(parts) > len(fields) and "name" in fields:  # a name with commas in it
        at = list(fields).index("name")
        extra = len(parts) - len(fields)
        parts = [*parts[:at], ", ".join(parts[at:at + extra + 1]), *parts[at + extra + 1:]]
    row: Dict[str, Any] = {}
    errors = []
    for i, field in enumerate(fields):  # zip's strict= is python >= 3.10
        value, error = health_value(KEYS[field], parts[i] if i < len(parts) else "")
        row[KEYS[field]] = value
        if error:
            errors.append(error)
    row["error"] = "; ".join(errors) or None
    return row


def parse_health(text: str, fields: Sequence[str], returncode: int = 0) -> Dict[str, Any]:
    """`nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits` (stdout and stderr together)
    -> {"gpus": [{reply key: value}], "lost": [{"bus_id", "error"}], "error": the host's or None,
    "refused": the field nvidia-smi refused, or None}. A run that lists no GPU and fails is the
    host's error; "No devices were found" is a host without GPUs."""
    refused = refused_field(text)
    if refused is not None:
        return {"gpus": [], "lost": [], "error": None, "refused": refused}
    gpus: List[Dict[str, Any]] = []
    lost: List[Dict[str, Any]] = []
    other: List[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        parts = [p.strip() for p in line.split(",")]
        found = _LOST.match(line)
        if found:
            lost.append({"bus_id": found.group(1), "error": found.group(2).strip() or "unknown error"})
        elif len(parts) >= len(fields) and parts[0].isdigit():
            gpus.append(_row(fields, parts))
        elif line:
            other.append(line)
    error = None
    if not gpus and not lost and (returncode != 0 or other) and not any(
            o.startswith("No devices were found") for o in other):
        error = other[0] if other else "nvidia-smi exited %d with no output" % returncode
    return {"gpus": gpus, "lost": lost, "error": error, "refused": None}


def merge_rows(base: List[Dict[str, Any]], extra: List[Dict[str, Any]]) -> None:
    """Add a group's values (rows keyed by index) to the base rows, in place."""
    by_index = {row.get("index"): row for row in extra}
    for row in base:
        more = by_index.get(row.get("index"))
        if more is None:
            continue
        errors = [e for e in (row.get("error"), more.get("error")) if e]
        row.update({k: v for k, v in more.items() if k not in ("index", "error")})
        row["error"] = "; ".join(errors) or None


def parse_xids(text: str, keep: int = XID_KEEP) -> List[Dict[str, Any]]:
    """The last `keep` `NVRM: Xid` lines of a kernel log (dmesg, dmesg --ctime or journalctl -k
    -o short-iso), oldest first: {"pci", "xid", "text", "when"}."""
    events = []
    for line in text.splitlines():
        at = line.find("NVRM: Xid")
        found = _XID.search(line, at) if at >= 0 else None
        if found is None:
            continue
        events.append({"pci": found.group(1).lower(), "xid": int(found.group(2)),
                       "text": found.group(3).strip(), "when": _when(line[:at])})
    return events[-keep:] if keep > 0 else []


def _when(prefix: str) -> Optional[str]:
    """The time stamp before `NVRM:`: dmesg's `[ 1843.308145]` or `[Fri Aug 30 11:43:09 2024]`,
    journalctl's `2024-08-30T11:43:09+0000 host kernel:` (its first word)."""
    stamp = _STAMP.match(prefix)
    if stamp:
        return stamp.group(1) or None
    words = prefix.split()
    return words[0] if words and words[0][:1].isdigit() else None
