"""The addresses the ranks dial and the interface each host talks over (master_addr, each host's dial
address, GLOO/NCCL_SOCKET_IFNAME), from what the hosts report about their interfaces and routes;
pure (docs/architecture.md, "Addresses and interfaces")."""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from node_agent.host.ifname import is_suspicious, nccl_auto_pick
from orchestrator.checks.model import DoctorContext
from orchestrator.remote.wire import HostFacts, InterfaceFact, MasterRoute, ResolvedAddress, TableRoute

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(text: object) -> IPAddress | None:
    try:
        return ipaddress.ip_address(str(text).split("%")[0])
    except ValueError:
        return None


def is_loopback(address: str | None) -> bool:
    ip = _ip(address)
    return ip is not None and ip.is_loopback


@dataclass(frozen=True)
class Route:
    """A host's route to one address: the device and source address it leaves from."""

    dev: str | None
    src: str | None
    gateway: str | None = None
    local: bool = False  # the address is the host's own

    def to_fact(self) -> MasterRoute:
        """As the facts' `resolution.routes` entries read (`ip route get`)."""
        return MasterRoute(self.dev, self.src, self.gateway, "local" if self.local else "unicast")


@dataclass(frozen=True)
class HostNet:
    """One host's network as it reported it."""

    interfaces: Sequence[InterfaceFact] = ()
    routes: Sequence[TableRoute] = ()
    source: str | None = None  # its kernel's source address toward a named master_addr
    master_ip: str | None = None  # what a named master_addr resolved to there

    @property
    def known(self) -> bool:
        return bool(self.routes) and bool(self.interfaces)

    def own(self) -> dict[str, tuple[str, int | None]]:
        """Each address of this host -> (interface, prefix length); link-local ones left out."""
        out: dict[str, tuple[str, int | None]] = {}
        for iface in self.interfaces:
            for a in iface.addresses:
                if a.address and a.scope != "link":
                    out[a.address] = (iface.name, a.prefixlen)
        return out

    def subnet(self, address: str) -> str:
        """The network of this host's interface holding `address` (the address itself where it
        holds none): a rack, for the probe's sample and a firewall fix."""
        prefix = self.own().get(address, (None, None))[1]
        if prefix is None:
            return address
        return str(ipaddress.ip_interface(f"{address}/{prefix}").network)

    def peer_addresses(self) -> list[str]:
        """Addresses a peer could reach this host at: up, not loopback, IPv4 first."""
        up = {i.name for i in self.interfaces if i.up}
        found = [a for a, (dev, _) in self.own().items() if dev in up and not is_loopback(a)]
        return sorted(found, key=lambda a: (":" in a, found.index(a)))

    def route(self, address: str) -> Route | None:
        """The route the host's main table gives `address` (longest prefix, then lowest metric),
        as `ip route get` would without policy rules; None: no route (or not an address)."""
        target = _ip(address)
        if target is None:
            return None
        own = self.own()
        if str(target) in own:
            return Route(own[str(target)][0], str(target), None, True)
        best: tuple[int, int, TableRoute] | None = None
        for r in self.routes:
            dst = r.dst
            try:
                net = ipaddress.ip_network("0.0.0.0/0" if dst == "default" and target.version == 4 else
                                           "::/0" if dst == "default" else dst, strict=False)
            except ValueError:
                continue
            if net.version != target.version or target not in net:
                continue
            key = (net.prefixlen, -r.metric)
            if best is None or key > best[:2]:
                best = (*key, r)
        if best is None:
            return None
        r = best[2]
        dev = r.dev or None
        return Route(dev, r.src or self._source(dev, target) or None, r.gateway or None)

    def _source(self, dev: str | None, target: IPAddress) -> str:
        """A route without its source address (read from /proc/net/route): the device's address
        in the target's subnet, else its first of the same family, as the kernel picks."""
        mine = [(a, p) for a, (d, p) in self.own().items() if d == dev and (":" in a) == (target.version == 6)]
        for address, prefix in mine:
            if prefix is not None and target in ipaddress.ip_interface(f"{address}/{prefix}").network:
                return address
        return mine[0][0] if mine else ""


def net_of(hf: HostFacts) -> HostNet:
    """A host's network from its facts (the same tables its `listening` event carried)."""
    resolved = hf.resolution.master
    v4 = [a for a in resolved if a.family == "inet"]
    return HostNet(hf.facts.interfaces or (), hf.facts.routes or (), hf.route_source,
                   (v4 or resolved)[0].address if resolved else None)


def suggest_master(master: str, facts: Mapping[str, HostFacts]) -> str | None:
    """The master's address as ddpctl would pick it, for a fix that names one."""
    if master not in facts:
        return None
    return pick_master_address(net_of(facts[master]), {h: net_of(hf) for h, hf in facts.items() if h != master})


@dataclass(frozen=True)
class Addressing:
    """Where every host is dialled, and the master's address."""

    master_addr: str
    picked: str = ""  # how ddpctl chose master_addr ("" where the job or inventory named it)
    dial: Mapping[str, str] = field(default_factory=dict)  # host -> the address its peers dial
    routes: Mapping[str, Route] = field(default_factory=dict)  # host -> its route to the master
    # host -> the address of its own that it reported (its source toward the master; the master's,
    # master_addr as the hosts resolved or ddpctl picked it): what torchrun's c10d rendezvous is
    # given as the host's address (--local-addr) instead of looking the host's name up. A host
    # that reported none (its dial address is the inventory's) is not here.
    own: Mapping[str, str] = field(default_factory=dict)


def pick_master_address(master: HostNet, others: Mapping[str, HostNet]) -> str | None:
    """The master's own address on its route toward the other hosts: for each peer, the source
    address the master's table gives toward that peer's addresses (a directly connected subnet
    before a gateway, a plain interface before a docker/virbr one; an address every host holds,
    docker0's 172.17.0.1, is no peer's); the one most peers agree on. None: nothing to go by."""
    mine = master.own()
    votes: Counter[str] = Counter()
    for net in others.values():
        best: tuple[tuple[bool, bool], str] | None = None
        for address in net.peer_addresses():
            if address in mine:
                continue
            route = master.route(address)
            if route is None or route.local or not route.src or is_loopback(route.src):
                continue
            rank = (route.gateway is None, not is_suspicious(route.dev or ""))
            if best is None or rank > best[0]:
                best = (rank, route.src)
        if best is not None:
            votes[best[1]] += 1
    if not votes:
        return None
    top = max(votes.values())
    return next(a for a in master.peer_addresses() + sorted(votes) if votes.get(a) == top)


def plan_addressing(hosts: Sequence[str], master: str, master_addr: str, given: bool,
                    nets: Mapping[str, HostNet], fallback: Mapping[str, str]) -> Addressing:
    """master_addr (named, or picked from the master's routes) and every host's dial address
    and route to it. `fallback`: each host's inventory address, used where a host told us
    nothing (it failed, or its tables could not be read)."""
    picked = ""
    others = {h: n for h, n in nets.items() if h != master and n.known}
    chosen = pick_master_address(nets[master], others) if master in nets and nets[master].known else None
    if not given and chosen is not None:
        master_addr, picked = chosen, f"{master}'s address on its route to the other hosts"
    target = master_addr
    if given:  # a name resolves on each host: the address the hosts agree on is the one dialled;
        # where none resolves it to a peer's address (loopback, or not at all: the dns check's
        # finding), the probe still dials where the master can be reached
        resolved = Counter(n.master_ip for n in nets.values() if n.master_ip and not is_loopback(n.master_ip))
        target = resolved.most_common(1)[0][0] if resolved else chosen or master_addr
    dial: dict[str, str] = {}
    routes: dict[str, Route] = {}
    own: dict[str, str] = {}
    for host in hosts:
        net = nets.get(host, HostNet())
        route = net.route(net.master_ip or target) if given else net.route(target)
        if route is not None:
            routes[host] = route
        if host == master:
            dial[host] = target
        elif net.source:
            dial[host] = net.source
        elif route is not None and route.src and not route.local and not is_loopback(route.src):
            dial[host] = route.src
        else:
            dial[host] = fallback.get(host, host)
            continue
        if _ip(dial[host]) is not None and not is_loopback(dial[host]):
            own[host] = dial[host]
    return Addressing(master_addr, picked, dial, routes, own)


def addressing_of(ctx: DoctorContext, nets: Mapping[str, HostNet]) -> Addressing:
    """master_addr and every host's dial address, from what the hosts reported (one rule for the
    probe round, the checks and the launch)."""
    return plan_addressing([h.name for h in ctx.hosts], ctx.master.name, ctx.master_addr, ctx.master_given,
                           nets, {h.name: h.address for h in ctx.hosts})


def facts_addressing(ctx: DoctorContext, facts: Mapping[str, HostFacts]) -> Addressing:
    """addressing_of the hosts' facts (the tables their facts carry)."""
    return addressing_of(ctx, {name: net_of(hf) for name, hf in facts.items()})


# -- interfaces ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class PickedInterfaces:
    """What ddpctl sets on one host where the job leaves the variables unset, and why."""

    env: Mapping[str, str]
    why: Sequence[str]

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.env.items()) + f" ({self.describe_why()})"

    def describe_why(self) -> str:
        return "; ".join(self.why)


def usable_names(ifaces: Sequence[InterfaceFact]) -> list[str]:
    """Interfaces that are up and carry an address NCCL would use (no IPv6 link-local)."""
    return [i.name for i in ifaces if i.up and any(a.scope != "link" for a in i.addresses)]


def gloo_trouble(hostname: str, resolved: Sequence[ResolvedAddress], own: Mapping[str, tuple[str, int | None]],
                 dev: str) -> str | None:
    """Why Gloo's own choice (the host's hostname, resolved) fails across hosts, or None."""
    if not resolved:
        return f"hostname {hostname} does not resolve"
    first = resolved[0].address
    if is_loopback(first):
        return f"hostname {hostname} resolves to {first}"
    holder = own.get(first, (None, None))[0]
    if holder is not None and holder != dev:
        return f"hostname {hostname} resolves to {first} on {holder}, not the route to the master"
    return None


def nccl_trouble(ifaces: Sequence[InterfaceFact], dev: str) -> str | None:
    """Why NCCL's own choice (ncclFindInterfaces' order) would not use the route to the master."""
    auto = nccl_auto_pick(usable_names(ifaces))
    if not auto or auto == [dev]:
        return None
    if auto[0] != dev:
        return f"NCCL would pick {auto[0]} first"
    return f"NCCL would also use {', '.join(n for n in auto if n != dev)}"


def pick_interfaces(env: Mapping[str, str], hf: HostFacts, route: Route | None) -> PickedInterfaces | None:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for one host of a multi-host job, each only where
    `env` (what the host's processes see) leaves it unset and the library would pick wrong."""
    dev = route.dev if route is not None else None
    if not dev or dev == "lo":
        return None
    ifaces = hf.facts.interfaces or ()
    out: dict[str, str] = {}
    why: list[str] = []
    if "GLOO_SOCKET_IFNAME" not in env and hf.ran("hostname_resolution"):
        trouble = gloo_trouble(hf.hostname, hf.facts.hostname_resolution or (), HostNet(ifaces).own(), dev)
        if trouble:
            out["GLOO_SOCKET_IFNAME"] = dev
            why.append(trouble)
    if "NCCL_SOCKET_IFNAME" not in env and ifaces:
        trouble = nccl_trouble(ifaces, dev)
        if trouble:
            out["NCCL_SOCKET_IFNAME"] = f"={dev}"
            why.append(trouble)
    if not out:
        return None
    return PickedInterfaces(out, [*why, f"{dev} routes to the master"])
