"""Check 8: master_addr resolves everywhere to the same non-loopback address; unique hostnames."""

from __future__ import annotations

from collections import defaultdict

from inventory.fields import is_ip_address
from orchestrator.checks.addressing import facts_addressing, is_loopback, suggest_master
from orchestrator.checks.base import fail, majority, ok, warn
from orchestrator.checks.model import Finding, Observations
from orchestrator.checks.spec import CheckSpec, Runs, implements
from orchestrator.remote.wire import HostFacts, MasterRoute, ResolvedAddress

CHECK = "dns"
SPEC = CheckSpec(CHECK, order=130, runs=Runs.NODE | Runs.LAUNCH | Runs.SLURM)
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def first_address(hf: HostFacts) -> ResolvedAddress | None:
    master = hf.resolution.master
    return master[0] if master else None


def compared_address(hf: HostFacts) -> str | None:
    """The first IPv4 address (else the first address): what hosts must agree on."""
    master = hf.resolution.master
    v4 = [a for a in master if a.family == "inet"]
    return (v4 or master)[0].address if master else None


def host_findings(host: str, hf: HostFacts, addr: str, local_only: bool,
                  master_ip: str | None, suggested: str | None = None) -> list[Finding]:
    if hf.errors.get("resolution"):
        line = f"add `{master_ip} {addr}` to /etc/hosts" if master_ip else \
            f"map {addr} to the master's IP address in /etc/hosts"
        return [fail(CHECK, host, f"master_addr {addr} does not resolve on {host}",
                     hf.errors["resolution"],
                     f"{line} on {host} or fix DNS, or set master_addr to an IP address")]
    first = first_address(hf)
    if first is None:
        return []
    out: list[Finding] = []
    if is_loopback(first.address) and not local_only:
        use = f"set master_addr = \"{suggested}\" (the master's address on its route to the other " \
            "hosts), or remove master_addr: ddpctl then picks that address itself" if suggested else \
            "set master_addr to an address of the master that the other hosts reach, or remove " \
            "master_addr: ddpctl then picks one from the master's routes"
        out.append(fail(CHECK, host, f"master_addr {addr} resolves to loopback "
                        f"{first.address} on {host}: peers cannot reach it",
                        f"{addr} is a loopback name on {host}" if addr in LOOPBACK_NAMES else
                        "/etc/hosts maps the name to a loopback address (the 127.0.1.1 hostname line)",
                        use))
    route = hf.resolution.routes.get(first.address) or MasterRoute()
    if first.family == "inet6" and route.error:
        out.append(warn(CHECK, host, f"master_addr {addr} resolves IPv6-first "
                        f"({first.address}) but {host} has no IPv6 route to it",
                        route.error, "set master_addr to the IPv4 address, or add "
                        "`precedence ::ffff:0:0/96 100` to /etc/gai.conf"))
    return out


def duplicate_hostnames(obs: Observations) -> list[Finding]:
    by_name: dict[str, list[str]] = defaultdict(list)
    for host, hf in obs.facts.items():
        if hf.facts.hostname:
            by_name[hf.facts.hostname].append(host)
    out = []
    for hostname, hosts in by_name.items():
        if len(hosts) > 1:
            out += [warn(CHECK, h, f"hostname {hostname!r} is shared by {', '.join(hosts)}",
                         "NCCL and torchrun tell nodes apart by hostname",
                         f"give each host a unique name (on {h}: sudo hostnamectl set-hostname "
                         f"{h})") for h in hosts]
    return out


def master_is_here(obs: Observations, local_only: bool) -> list[Finding]:
    """master_addr must be an address of the master host (node_rank 0 hosts torchrun's store):
    one that is not leaves every rank dialing an address where nothing listens."""
    master = obs.ctx.master
    hf = obs.facts.get(master.name)
    if hf is None or local_only:
        return []
    for addr, route in hf.resolution.routes.items():
        if not route.error and route.type != "local":
            return [warn(CHECK, master.name, f"master_addr {obs.ctx.master_addr} is not an address of "
                         f"{master.name}, the master host (node_rank 0 hosts the rendezvous)",
                         f"{master.name} routes {addr} via {route.dev}"
                         + (f" and gateway {route.gateway}" if route.gateway else ""),
                         f"set master_addr to an address of {master.name} ({master.address}), or remove it "
                         "to use that one")]
    return []


def own_hostname(obs: Observations, local_only: bool) -> list[Finding]:
    """c10d's rendezvous looks each host's own hostname up (and hands it to the workers) unless
    torchrun is given the host's address: a hostname that does not resolve fails the launch with
    `Temporary failure in name resolution`. `up` gives each host the address it reported
    (addressing.Addressing.own), so only a host that reported none needs its name to resolve."""
    if obs.ctx.rdzv_backend != "c10d" or local_only:
        return []
    given = facts_addressing(obs.ctx, obs.facts).own if obs.ctx.gives_local_addr else {}
    out = []
    by_name = {h.name: h for h in obs.ctx.hosts}
    for host, hf in obs.facts.items():
        if host in given or not hf.ran("hostname_resolution") or hf.facts.hostname_resolution:
            continue
        hostname = hf.facts.hostname or host
        address = hf.route_source or (by_name[host].address if host in by_name else host)
        out.append(fail(CHECK, host, f"hostname {hostname} of {host} does not resolve on {host}, "
                        "and the c10d rendezvous looks it up",
                        hf.errors.get("hostname_resolution", "getaddrinfo found no address"),
                        f"on {host}: add `{address} {hostname}` to /etc/hosts (or fix DNS), or use "
                        'backend = "static" in [rendezvous]'))
    return out


@implements(SPEC)
def check(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    addr = obs.ctx.master_addr
    local_only = all(h.is_local for h in obs.ctx.hosts)
    firsts = {h: a for h, hf in obs.facts.items() if (a := compared_address(hf)) is not None}
    common, odd = majority(firsts)
    master_ip = common or (obs.ctx.master.address if is_ip_address(obs.ctx.master.address) else None)
    suggested = suggest_master(obs.ctx.master.name, obs.facts)
    for host, hf in obs.facts.items():
        out += host_findings(host, hf, addr, local_only, master_ip, suggested)
    out += own_hostname(obs, local_only)
    out += master_is_here(obs, local_only)
    for host in odd:
        out.append(fail(CHECK, host, f"master_addr {addr} resolves to {firsts[host]} on {host} "
                        f"but to {common} on the other hosts",
                        "; ".join(f"{h}={a}" for h, a in firsts.items()),
                        f"fix /etc/hosts or DNS on {host}, or set master_addr to {common}"))
    out += duplicate_hostnames(obs)
    bad = {f.host for f in out}
    if obs.ctx.master_picked:
        out += [ok(CHECK, h, f"master_addr {addr} ({obs.ctx.master_picked})") for h in obs.facts if h not in bad]
    else:
        out += [ok(CHECK, h, f"master_addr {addr} -> {firsts.get(h)}") for h in obs.facts if h not in bad]
    return out
