"""Check 6: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME select an up interface that reaches the master."""

from __future__ import annotations

import ipaddress
from typing import Any

from node_agent.ifname import is_suspicious, match_nccl, nccl_auto_pick, nccl_value_is_used, parse_gloo_ifname
from orchestrator.doctor.checks.base import fail, info, listing, ok, warn
from orchestrator.doctor.model import Finding, Observations
from orchestrator.remote.wire import HostFacts

CHECK = "ifname"


def usable_names(ifaces: list[dict[str, Any]]) -> list[str]:
    """Interfaces that are up and carry an address NCCL would use (no IPv6 link-local)."""
    out = []
    for i in ifaces:
        addrs = [a for a in i.get("addresses") or [] if a.get("scope") != "link"]
        if i.get("up") and addrs:
            out.append(str(i.get("name")))
    return out


def master_dev(hf: HostFacts) -> str | None:
    """The interface this host uses to reach the master (the one holding it, on the master)."""
    routes = (hf.get("resolution") or {}).get("routes") or {}
    for addr, route in routes.items():
        if not isinstance(route, dict) or route.get("error"):
            continue
        if route.get("type") != "local":
            return route.get("dev")
        for i in hf.get("interfaces") or []:
            if i.get("name") != "lo" and any(a.get("address") == addr
                                             for a in i.get("addresses") or []):
                return str(i.get("name"))
        return route.get("dev")
    return None


def nccl_finding(host: str, value: str | None, ifaces: list[dict[str, Any]],
                 dev: str | None, local_only: bool) -> Finding:
    names = [str(i.get("name")) for i in ifaces]
    usable = usable_names(ifaces)
    pin = f"set NCCL_SOCKET_IFNAME={dev} in the job's [env]" if dev else \
        "set NCCL_SOCKET_IFNAME to the interface that routes to the master"
    evidence = f"interfaces: {listing(names, 16)}; up with an address: {listing(usable, 16)}" + (
        f"; route to master via {dev}" if dev else "")
    if value is not None and not nccl_value_is_used(value):
        return warn(CHECK, host, f"NCCL ignores NCCL_SOCKET_IFNAME={value!r} (one character)",
                    evidence, pin)
    if value is not None:
        matched = match_nccl(value, names)
        good = match_nccl(value, usable)
        if not matched:
            return fail(CHECK, host, f"NCCL_SOCKET_IFNAME={value} matches no interface on {host}",
                        evidence, pin)
        if not good:
            return fail(CHECK, host, f"NCCL_SOCKET_IFNAME={value} selects {listing(matched)} on "
                        f"{host}, but none is up with an address", evidence, pin)
        if dev and not local_only and dev not in good:
            return warn(CHECK, host, f"NCCL_SOCKET_IFNAME={value} selects {listing(good)}, but "
                        f"{host} reaches the master via {dev}", evidence, pin)
        return ok(CHECK, host, f"NCCL_SOCKET_IFNAME={value} selects {listing(good)}", evidence)
    auto = nccl_auto_pick(usable)
    odd = [n for n in auto if n != dev and is_suspicious(n)]
    if odd and not local_only:
        return warn(CHECK, host, f"NCCL_SOCKET_IFNAME is unset: NCCL would also use "
                    f"{listing(odd)} (not the route to the master)", evidence, pin)
    if auto and dev and not local_only and auto[0] != dev:
        return warn(CHECK, host, f"NCCL_SOCKET_IFNAME is unset: NCCL would pick {auto[0]} first,"
                    f" but the master is reached via {dev}", evidence, pin)
    return info(CHECK, host, "NCCL_SOCKET_IFNAME is unset" + (
        f"; the master is reached via {dev}" if dev else ""), evidence, "" if local_only else pin)


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def gloo_finding(host: str, hf: HostFacts, value: str | None, dev: str | None,
                 local_only: bool) -> Finding:
    ifaces = hf.get("interfaces") or []
    names = [str(i.get("name")) for i in ifaces]
    usable = usable_names(ifaces)
    pin = f"set GLOO_SOCKET_IFNAME={dev} in the job's [env]" if dev else \
        "set GLOO_SOCKET_IFNAME to the interface that routes to the master"
    if value:
        wanted = parse_gloo_ifname(value)
        missing = [n for n in wanted if n not in names]
        down = [n for n in wanted if n in names and n not in usable]
        evidence = f"interfaces: {listing(names, 16)}"
        if missing:
            return fail(CHECK, host, f"GLOO_SOCKET_IFNAME={value}: no interface "
                        f"{listing(missing)} on {host}", evidence, pin)
        if down:
            return fail(CHECK, host, f"GLOO_SOCKET_IFNAME={value}: {listing(down)} is down or "
                        f"has no address on {host}", evidence, pin)
        return ok(CHECK, host, f"GLOO_SOCKET_IFNAME={value} is up with an address")
    resolved = hf.get("hostname_resolution") or []
    hostname = hf.get("hostname")
    if local_only:
        return info(CHECK, host, "GLOO_SOCKET_IFNAME is unset (single host)")
    if not resolved:
        return warn(CHECK, host, f"GLOO_SOCKET_IFNAME is unset and hostname {hostname} does not "
                    "resolve: Gloo cannot pick an address", hf.errors.get(
                        "hostname_resolution", ""), pin)
    first = str(resolved[0].get("address"))
    if _loopback(first):
        return warn(CHECK, host, f"GLOO_SOCKET_IFNAME is unset and hostname {hostname} resolves "
                    f"to {first}: Gloo would listen on loopback", "/etc/hosts maps the hostname "
                    "to a loopback address", pin)
    return info(CHECK, host, f"GLOO_SOCKET_IFNAME is unset; Gloo uses {hostname} -> {first}",
                "", pin)


def check(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    local_only = all(h.is_local for h in obs.ctx.hosts)
    for host in obs.ctx.hosts:
        hf = obs.facts.get(host.name)
        if hf is None:
            continue
        env = obs.ctx.host_env(host, hf.get("env") or {})
        dev = master_dev(hf)
        out.append(nccl_finding(host.name, env.get("NCCL_SOCKET_IFNAME"),
                                hf.get("interfaces") or [], dev, local_only))
        out.append(gloo_finding(host.name, hf, env.get("GLOO_SOCKET_IFNAME"), dev, local_only))
    return out
