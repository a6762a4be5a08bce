"""Check 4: firewall rules (ufw, iptables, nft) and, authoritative, the TCP probe between hosts."""

from __future__ import annotations

from collections import defaultdict

from orchestrator.checks.addressing import HostNet
from orchestrator.checks.base import fail, info, listing, ok, skip, warn
from orchestrator.checks.model import Finding, Observations, ProbeOutcome
from orchestrator.checks.spec import CheckSpec, Runs, implements
from orchestrator.remote.wire import FirewallFact, HostFacts, IptablesFact, NftFact, UfwFact

CHECK = "firewall"
SPEC = CheckSpec(CHECK, order=90, runs=Runs.NODE | Runs.LAUNCH | Runs.SLURM, column="fw")


def subnet_of(hf: HostFacts | None, address: str) -> str:
    """The CIDR of the interface holding `address` on that host, else the /32 itself."""
    return HostNet(hf.facts.interfaces or () if hf else ()).subnet(address)


def static_evidence(hf: HostFacts, port: int | None) -> list[str]:
    """Firewall configuration that can block doctor's probes on this host."""
    fw = hf.facts.firewall or FirewallFact()
    found: list[str] = []
    ufw = fw.ufw or UfwFact()
    if ufw.active and ufw.default_incoming in ("deny", "reject"):
        found.append(f"ufw active, default {ufw.default_incoming} (incoming)")
    ipt = fw.iptables or IptablesFact()
    if ipt.policy in ("DROP", "REJECT"):
        found.append(f"iptables INPUT policy {ipt.policy}")
    found += [f"iptables: {r}" for r in ipt.blocking]
    nft = fw.nft or NftFact()
    if nft.policy_drop:
        found.append("nft input chain policy drop")
    found += [f"nft: {r}" for r in nft.blocking]
    return list(dict.fromkeys(found))


def blame(outcome: ProbeOutcome, obs: Observations) -> str:
    """The host whose firewall most likely dropped it: the target, unless only the source has
    rules, or the source reached no peer at all while the others reached this target (its own
    outbound traffic is what is blocked)."""
    target, source = obs.facts.get(outcome.target_host), obs.facts.get(outcome.source)
    if target and static_evidence(target, outcome.port):
        return outcome.target_host
    if source and static_evidence(source, outcome.port):
        return outcome.source
    mine = [o for o in obs.probes.outcomes if o.source == outcome.source]
    others_reach = any(o.ok for o in obs.probes.outcomes
                       if o.target_host == outcome.target_host and o.source != outcome.source)
    if len(mine) > 1 and not any(o.ok for o in mine) and others_reach:
        return outcome.source
    return outcome.target_host


BLOCKED = ("timeout", "refused")  # the only probe outcomes that a firewall explains


def attempts_text(o: ProbeOutcome) -> str:
    """`timeout (6 attempts over 4.0s, each waited 4.0/3.5/3.0/2.5/2.0/1.0s)`."""
    if o.attempts <= 1 and not o.waited_ms:
        return o.kind
    waits = "/".join(f"{w / 1000:.1f}" for w in o.waited_ms)
    return f"{o.kind} ({o.attempts} attempt{'s' if o.attempts != 1 else ''}" + (
        f", each waited {waits}s)" if waits else ")")


def probe_findings(obs: Observations) -> list[Finding]:
    """A port is blocked where every dial timed out (each retried within the probe's bound) or was
    refused; any other failure (a name that does not resolve, no route) is not a firewall's doing
    and is reported as what it is (unreached_findings)."""
    grouped: dict[tuple[str, str], list[ProbeOutcome]] = defaultdict(list)
    for o in obs.probes.outcomes:
        if not o.ok and o.kind in BLOCKED:
            grouped[(blame(o, obs), o.purpose)].append(o)
    out: list[Finding] = []
    for (host, purpose), bad in grouped.items():
        pairs = [f"{o.source} -> {o.target_host} {o.address}:{o.port}: {attempts_text(o)}" for o in bad]
        peers = sorted({o.source if o.target_host == host else o.target_host for o in bad})
        ports = sorted({o.port for o in bad})
        what = "the master port" if purpose == "master_port" else "ephemeral ports (NCCL/Gloo)"
        hf = obs.facts.get(host)
        rules = static_evidence(hf, obs.ctx.master_port) if hf else []
        out.append(fail(CHECK, host, f"TCP on {what} {listing(map(str, ports))} is blocked "
                        f"between {host} and {listing(peers)}", "; ".join(pairs + rules),
                        allow_fix(obs, host, peers)))
    return out + unreached_findings(obs)


def unreached_findings(obs: Observations) -> list[Finding]:
    """Probe dials that failed for a reason other than a firewall: a name that does not resolve
    on the dialling host (dns), no route to the address (ifname: the interfaces and routes)."""
    grouped: dict[tuple[str, str], list[ProbeOutcome]] = defaultdict(list)
    for o in obs.probes.outcomes:
        if not o.ok and o.kind not in BLOCKED:
            grouped[(o.source, o.kind)].append(o)
    out: list[Finding] = []
    for (source, kind), bad in grouped.items():
        evidence = "; ".join(f"{source} -> {o.target_host} {o.address}:{o.port}: {attempts_text(o)}"
                             + (f" ({o.error})" if o.error and o.error != o.kind else "") for o in bad)
        names = sorted({o.address for o in bad})
        if kind == "unresolved":
            out.append(fail("dns", source, f"{source} cannot resolve {listing(names)}", evidence,
                            f"on {source}: add the address to /etc/hosts (or fix DNS), or give the "
                            "address instead of the name in the inventory or job"))
        elif kind == "unreachable":
            out.append(fail("ifname", source, f"{source} has no route to {listing(names)}", evidence,
                            f"on {source}: check `ip route get {names[0]}` and that the interface "
                            "toward the other hosts is up"))
        else:
            out.append(fail(CHECK, source, f"{source} could not dial {listing(names)}: {kind}", evidence))
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


@implements(SPEC)
def check(obs: Observations) -> list[Finding]:
    out = probe_findings(obs)
    blamed = {f.host for f in out}
    for host, err in obs.probes.errors.items():
        out.append(warn(CHECK, host, "the TCP probe could not run", err))
    if obs.probes.sampled:
        out.append(info(CHECK, None, f"the TCP probe sampled the pairs of hosts: {obs.probes.sampled}"))
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
