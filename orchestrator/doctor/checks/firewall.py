"""Check 4: firewall rules (ufw, iptables, nft) and, authoritative, the TCP probe between hosts."""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from typing import Any

from orchestrator.doctor.checks.base import fail, info, listing, ok, skip, warn
from orchestrator.doctor.model import Finding, Observations, ProbeOutcome
from orchestrator.remote.wire import HostFacts

CHECK = "firewall"


def subnet_of(hf: HostFacts | None, address: str) -> str:
    """The CIDR of the interface holding `address` on that host, else the /32 itself."""
    for iface in (hf.get("interfaces") or []) if hf else []:
        for a in iface.get("addresses") or []:
            if a.get("address") == address and a.get("prefixlen") is not None:
                return str(ipaddress.ip_interface(f"{address}/{a['prefixlen']}").network)
    return address


def static_evidence(hf: HostFacts, port: int | None) -> list[str]:
    """Firewall configuration that can block doctor's probes on this host."""
    fw: dict[str, Any] = hf.get("firewall") or {}
    found: list[str] = []
    ufw = fw.get("ufw") or {}
    if ufw.get("active") and ufw.get("default_incoming") in ("deny", "reject"):
        found.append(f"ufw active, default {ufw['default_incoming']} (incoming)")
    ipt = fw.get("iptables") or {}
    if ipt.get("policy") in ("DROP", "REJECT"):
        found.append(f"iptables INPUT policy {ipt['policy']}")
    found += [f"iptables: {r}" for r in ipt.get("blocking") or []]
    nft = fw.get("nft") or {}
    if nft.get("policy_drop"):
        found.append("nft input chain policy drop")
    found += [f"nft: {r}" for r in nft.get("blocking") or []]
    return list(dict.fromkeys(found))


def blame(outcome: ProbeOutcome, obs: Observations) -> str:
    """The host whose firewall most likely dropped it: the target unless only the source has rules."""
    target, source = obs.facts.get(outcome.target_host), obs.facts.get(outcome.source)
    if target and static_evidence(target, outcome.port):
        return outcome.target_host
    if source and static_evidence(source, outcome.port):
        return outcome.source
    return outcome.target_host


def probe_findings(obs: Observations) -> list[Finding]:
    grouped: dict[tuple[str, str], list[ProbeOutcome]] = defaultdict(list)
    for o in obs.probes.outcomes:
        if not o.ok:
            grouped[(blame(o, obs), o.purpose)].append(o)
    out: list[Finding] = []
    for (host, purpose), bad in grouped.items():
        pairs = [f"{o.source} -> {o.target_host} {o.address}:{o.port}: {o.kind}" for o in bad]
        peers = sorted({o.source if o.target_host == host else o.target_host for o in bad})
        ports = sorted({o.port for o in bad})
        what = "the master port" if purpose == "master_port" else "ephemeral ports (NCCL/Gloo)"
        hf = obs.facts.get(host)
        rules = static_evidence(hf, obs.ctx.master_port) if hf else []
        out.append(fail(CHECK, host, f"TCP on {what} {listing(map(str, ports))} is blocked "
                        f"between {host} and {listing(peers)}", "; ".join(pairs + rules),
                        allow_fix(obs, host, peers)))
    return out


def _addr(obs: Observations, host: str) -> str:
    for h in obs.ctx.hosts:
        if h.name == host:
            return h.address
    return host


def allow_fix(obs: Observations, host: str, peers: list[str]) -> str:
    """Open `host` to its peers' networks (each peer's interface CIDR, else its address); with no
    peer, to its own network."""
    sources = list(dict.fromkeys(subnet_of(obs.facts.get(p), _addr(obs, p)) for p in peers or [host]))
    ufw = " && ".join(f"sudo ufw allow from {s}" for s in sources)
    iptables = " && ".join(f"sudo iptables -I INPUT -s {s} -j ACCEPT" for s in sources)
    return f"on {host}: {ufw} (or {iptables}); NCCL and Gloo need every port open between hosts"


def check(obs: Observations) -> list[Finding]:
    out = probe_findings(obs)
    blamed = {f.host for f in out}
    for host, err in obs.probes.errors.items():
        out.append(warn(CHECK, host, "the TCP probe could not run", err))
    for purpose, why in obs.probes.skipped.items():
        status = skip if len(obs.facts) < 2 else info
        out.append(status(CHECK, None, f"{purpose.replace('_', ' ')} probe skipped: {why}"))
    tested = {o.source for o in obs.probes.outcomes} | {o.target_host for o in obs.probes.outcomes}
    for host, hf in obs.facts.items():
        if host in blamed:
            continue
        rules = static_evidence(hf, obs.ctx.master_port)
        if rules and host in tested:
            out.append(info(CHECK, host, "firewall rules present, but the probe got through",
                            "; ".join(rules)))
        elif rules:
            out.append(warn(CHECK, host, "firewall rules may block the master port or NCCL/Gloo "
                            "ports (not probed)", "; ".join(rules),
                            allow_fix(obs, host, [h.name for h in obs.ctx.hosts if h.name != host])))
        elif host in tested:
            out.append(ok(CHECK, host, "TCP probe passed to and from every peer"))
        else:
            out.append(ok(CHECK, host, "no blocking firewall rules"))
    return out
