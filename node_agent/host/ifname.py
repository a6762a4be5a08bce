"""NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME matching, exactly as NCCL and Gloo read them."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import List, Optional, Sequence


# NCCL's automatic choice when NCCL_SOCKET_IFNAME is unset (ncclFindInterfaces): IB first,
# then anything but docker/lo, then docker, then lo.
NCCL_DEFAULT_ORDER = ("ib", "^docker,lo", "docker", "lo")
# Interfaces that are rarely the right one for cross-host traffic.
SUSPICIOUS_PREFIXES = ("docker", "virbr", "lo", "veth", "br-", "cni", "flannel", "tailscale")


class IfSpec(object):
    """A parsed NCCL interface list: `^` excludes, `=` means exact names, else prefixes."""

    def __init__(self, names: Sequence[str], exclude: bool, exact: bool) -> None:
        self.names = tuple(names)
        self.exclude = exclude
        self.exact = exact

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IfSpec) and (self.names, self.exclude, self.exact) == (
            other.names, other.exclude, other.exact)

    def __repr__(self) -> str:
        return "IfSpec(names=%r, exclude=%r, exact=%r)" % (self.names, self.exclude, self.exact)

    def matches(self, ifname: str) -> bool:
        hit = any((ifname == n) if self.exact else ifname.startswith(n) for n in self.names)
        return not hit if self.exclude else hit


def parse_nccl_ifname(value: str) -> IfSpec:
    """Parse NCCL's syntax: `[^][=]name[:port][,name[:port]...]` (the port part is ignored)."""
    text = value
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    exact = text.startswith("=")
    if exact:
        text = text[1:]
    names = []
    for item in text.split(","):
        name = item.split(":", 1)[0].strip()
        if name:
            names.append(name)
    return IfSpec(names, exclude, exact)


def nccl_value_is_used(value: Optional[str]) -> bool:
    """NCCL ignores NCCL_SOCKET_IFNAME unless it is longer than one character."""
    return value is not None and len(value) > 1


def match_nccl(value: str, interfaces: Sequence[str]) -> List[str]:
    """The interfaces (in the given order) that NCCL_SOCKET_IFNAME=value selects."""
    spec = parse_nccl_ifname(value)
    return [name for name in interfaces if spec.matches(name)]


def nccl_auto_pick(interfaces: Sequence[str]) -> List[str]:
    """What NCCL picks with NCCL_SOCKET_IFNAME unset (interfaces that have an address)."""
    for candidate in NCCL_DEFAULT_ORDER:
        found = match_nccl(candidate, interfaces)
        if found:
            return found
    return []


def parse_gloo_ifname(value: str) -> List[str]:
    """GLOO_SOCKET_IFNAME: comma-separated exact interface names (torch's ProcessGroupGloo)."""
    return [part.strip() for part in value.split(",") if part.strip()]


def match_gloo(value: str, interfaces: Sequence[str]) -> List[str]:
    wanted = parse_gloo_ifname(value)
    return [name for name in wanted if name in interfaces]


def is_suspicious(ifname: str) -> bool:
    """docker0, virbr0, lo and friends: usually not the route between hosts."""
    return any(ifname.startswith(p) for p in SUSPICIOUS_PREFIXES)
