"""Check 6: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME select an up interface that reaches the master."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from node_agent.host.ifname import (
    is_suspicious,
    match_nccl,
    nccl_auto_pick,
    nccl_value_is_used,
    parse_gloo_ifname,
    parse_nccl_ifname,
)
from orchestrator.checks.addressing import PickedInterfaces, Route, is_loopback, pick_interfaces, usable_names
from orchestrator.checks.base import fail, info, listing, ok, warn
from orchestrator.checks.model import Finding, Observations
from orchestrator.checks.spec import CheckSpec, Runs, implements
from orchestrator.remote.wire import HostFacts, InterfaceFact

CHECK = "ifname"
SPEC = CheckSpec(CHECK, order=110, runs=Runs.NODE | Runs.LAUNCH | Runs.SLURM, column="if")


def master_dev(hf: HostFacts) -> str | None:
    """The interface this host uses to reach the master (the one holding it, on the master)."""
    for addr, route in hf.resolution.routes.items():
        if route.error:
            continue
        if route.type != "local":
            return route.dev
        for i in hf.facts.interfaces or ():
            if i.name != "lo" and any(a.address == addr for a in i.addresses):
                return i.name
        return route.dev
    return None


def master_address(hf: HostFacts) -> str | None:
    """The address this host resolved master_addr to (the one it routes to)."""
    return next(iter(hf.resolution.routes), None)


def reaches_master(iface: InterfaceFact, dev: str | None, master: str | None) -> bool:
    """Traffic to the master can leave through this interface: it is the route's device, or the
    master's address lies in one of its subnets."""
    if dev is not None and iface.name == dev:
        return True
    for a in iface.addresses:
        try:
            net = ipaddress.ip_interface(f"{a.address}/{a.prefixlen}").network
            if master is not None and ipaddress.ip_address(master) in net:
                return True
        except ValueError:
            continue
    return False


def _described(ifaces: Sequence[InterfaceFact], names: list[str]) -> str:
    """`docker0 (172.17.0.1/16)` for each name: what a reader needs to see the decoy."""
    by_name = {i.name: i for i in ifaces}
    out = []
    for n in names:
        addrs = [f"{a.address}/{a.prefixlen}" for a in (by_name[n].addresses if n in by_name else ())
                 if a.scope != "link"]
        out.append(f"{n} ({', '.join(addrs)})" if addrs else n)
    return listing(out)


def nccl_finding(host: str, value: str | None, ifaces: Sequence[InterfaceFact],
                 dev: str | None, local_only: bool, master: str | None = None,
                 picked: PickedInterfaces | None = None, common: str | None = None) -> Finding:
    names = [i.name for i in ifaces]
    usable = usable_names(ifaces)
    pin = pin_fix("NCCL_SOCKET_IFNAME", host, dev, value, common)
    evidence = f"interfaces: {listing(names, 16)}; up with an address: {listing(usable, 16)}" + (
        f"; route to master {master or ''} via {dev}".replace("  ", " ") if dev else "")
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
        if dev and not local_only:
            return nccl_routing(host, value, ifaces, good, dev, master, evidence, pin)
        return ok(CHECK, host, f"NCCL_SOCKET_IFNAME={value} selects {listing(good)}", evidence)
    if picked is not None and "NCCL_SOCKET_IFNAME" in picked.env:
        return info(CHECK, host, f"NCCL_SOCKET_IFNAME is unset: ddpctl sets NCCL_SOCKET_IFNAME="
                    f"{picked.env['NCCL_SOCKET_IFNAME']} on {host} ({picked.describe_why()})", evidence,
                    "set it in the job's [env] to choose another, or pick_interfaces = false in "
                    "[rendezvous] to leave it to NCCL")
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


def nccl_routing(host: str, value: str, ifaces: Sequence[InterfaceFact], good: list[str], dev: str,
                 master: str | None, evidence: str, pin: str) -> Finding:
    """NCCL bootstraps over the first selected interface and opens data sockets over all of
    them: every selected one must reach the master, the first one above all."""
    by_name = {i.name: i for i in ifaces}
    off = [n for n in good if not reaches_master(by_name[n], dev, master)]
    if not off:
        return ok(CHECK, host, f"NCCL_SOCKET_IFNAME={value} selects {listing(good)}", evidence)
    why = ""
    if parse_nccl_ifname(value).exclude and any(is_suspicious(n) for n in off):
        why = " (an exclusion list replaces NCCL's default skipping of docker and loopback interfaces)"
    what = f"NCCL_SOCKET_IFNAME={value} selects {_described(ifaces, good)} on {host}"
    to = f"the master {master}" if master else "the master"
    if len(off) == len(good) or off[0] == good[0]:
        return fail(CHECK, host, f"{what}; NCCL bootstraps over {good[0]}, which does not route to "
                    f"{to} (reached via {dev}){why}", evidence, pin)
    status = fail if any(is_suspicious(n) for n in off) else warn
    return status(CHECK, host, f"{what}; {listing(off)} does not route to {to} (reached via {dev}), "
                  f"yet NCCL would open connections over it{why}", evidence, pin)


def pin_fix(var: str, host: str, dev: str | None, value: str | None, common: str | None = None) -> str:
    """Where to set the variable: a value that fits every host (the one device they all use, or
    NCCL's prefix list of theirs) in the job's [env]; else this host's own `env` in the inventory
    (the job's [env] wins over it, so a job-wide value must go)."""
    if dev is None:
        return f"set {var} to the interface that routes to the master"
    if common:
        fits = " (it selects the right interface on every host)" if common != dev else ""
        return f"set {var}={common} in the job's [env]{fits}"
    if value is not None:
        return (f"remove {var} from the job's [env] (ddpctl then sets each host's own interface where "
                f"needed), or set env = {{ {var} = \"{dev}\" }} for {host} in the inventory instead")
    return f"set env = {{ {var} = \"{dev}\" }} for {host} in the inventory"


def gloo_finding(host: str, hf: HostFacts, value: str | None, dev: str | None,
                 local_only: bool, master: str | None = None,
                 picked: PickedInterfaces | None = None, common: str | None = None) -> Finding:
    ifaces = hf.facts.interfaces or ()
    names = [i.name for i in ifaces]
    usable = usable_names(ifaces)
    pin = pin_fix("GLOO_SOCKET_IFNAME", host, dev, value, common)
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
        by_name = {i.name: i for i in ifaces}
        off = [n for n in wanted if not local_only and dev and not reaches_master(by_name[n], dev, master)]
        if off:
            to = f"the master {master}" if master else "the master"
            return fail(CHECK, host, f"GLOO_SOCKET_IFNAME={value}: {_described(ifaces, off)} does not "
                        f"route to {to} on {host} (it is reached via {dev}); Gloo would give peers "
                        "an address they cannot reach", evidence + f"; route to master via {dev}", pin)
        return ok(CHECK, host, f"GLOO_SOCKET_IFNAME={value} is up with an address")
    resolved = hf.facts.hostname_resolution or ()
    hostname = hf.facts.hostname
    if local_only:
        return info(CHECK, host, "GLOO_SOCKET_IFNAME is unset (single host)")
    if picked is not None and "GLOO_SOCKET_IFNAME" in picked.env:
        return info(CHECK, host, f"GLOO_SOCKET_IFNAME is unset: ddpctl sets GLOO_SOCKET_IFNAME="
                    f"{picked.env['GLOO_SOCKET_IFNAME']} on {host} ({picked.describe_why()})",
                    hf.errors.get("hostname_resolution", ""), "set it in the job's [env] to choose "
                    "another, or pick_interfaces = false in [rendezvous] to leave it to Gloo")
    if not resolved:  # Gloo cannot pick an address: every multi-host job fails
        return fail(CHECK, host, f"GLOO_SOCKET_IFNAME is unset and hostname {hostname} does not "
                    "resolve: Gloo cannot pick an address", hf.errors.get(
                        "hostname_resolution", ""), pin)
    first = resolved[0].address
    if is_loopback(first):  # peers would dial their own loopback: certain to fail
        return fail(CHECK, host, f"GLOO_SOCKET_IFNAME is unset and hostname {hostname} resolves "
                    f"to {first}: Gloo would listen on loopback", "/etc/hosts maps the hostname "
                    "to a loopback address", pin)
    return info(CHECK, host, f"GLOO_SOCKET_IFNAME is unset; Gloo uses {hostname} -> {first}",
                "", pin)


def fits_all(var: str, obs: Observations, devs: dict[str, str]) -> str | None:
    """A value of `var` that selects each host's route to the master first: the device where all
    hosts use the same one; for NCCL, the prefix list of theirs (node0 eth0, node1 ens5:
    "eth0,ens5") where it selects no wrong one first on any host; else None (set it per host)."""
    names = sorted(set(devs.values()))
    if len(names) == 1:
        return names[0]
    if var != "NCCL_SOCKET_IFNAME" or not names:
        return None
    value = ",".join(names)
    for host, dev in devs.items():
        selected = match_nccl(value, usable_names(obs.facts[host].facts.interfaces or ()))
        if not selected or selected[0] != dev:
            return None
    return value


@implements(SPEC)
def check(obs: Observations) -> list[Finding]:
    out: list[Finding] = []
    local_only = all(h.is_local for h in obs.ctx.hosts)
    multi = not local_only and len(obs.ctx.hosts) > 1
    devs = {h: d for h, hf in obs.facts.items() if (d := master_dev(hf))}
    nccl_common = fits_all("NCCL_SOCKET_IFNAME", obs, devs)
    gloo_common = fits_all("GLOO_SOCKET_IFNAME", obs, devs)
    for host in obs.ctx.hosts:
        hf = obs.facts.get(host.name)
        if hf is None:
            continue
        env = obs.ctx.host_env(host, hf.facts.env or {})
        dev, master = master_dev(hf), master_address(hf)
        picked = pick_interfaces(env, hf, Route(dev, None)) if multi and obs.ctx.pick_interfaces else None
        out.append(nccl_finding(host.name, env.get("NCCL_SOCKET_IFNAME"),
                                hf.facts.interfaces or (), dev, local_only, master, picked, nccl_common))
        # One host: its ranks meet on it, where Gloo on loopback works (a 127.0.1.1 hostname is no failure)
        out.append(gloo_finding(host.name, hf, env.get("GLOO_SOCKET_IFNAME"), dev, not multi, master, picked,
                                gloo_common))
    return out
