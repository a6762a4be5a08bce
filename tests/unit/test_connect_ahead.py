"""HostPool.connect_ahead: the TCP dials go out before fabric loads and the SSH handshakes run while
a command still imports and plans; the first use of each host waits for its connection, or raises
the error opening it met, without dialling twice. PreDial is tested on loopback only."""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import fabric
import pytest

from inventory import LOCALHOST, Host
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.remote import pool as pool_module
from orchestrator.remote.pool import HostPool
from orchestrator.remote.predial import PreDial, dial_target
from orchestrator.remote.ssh import SshTransport
from orchestrator.remote.ssh_config import HostSshConfig
from orchestrator.remote.ssh_options import SshOptions, names_a_proxy
from orchestrator.remote.transport import LocalTransport

HOSTS = tuple(Host(name=f"node{i}", address=f"198.18.0.{10 + i}") for i in range(6))


class Open:
    """An open connection, as far as SshTransport asks."""

    is_connected = True

    def close(self) -> None:
        self.is_connected = False


class Dialer:
    """Stands in for the SSH handshake: counts dials per host, can fail some, can be held."""

    def __init__(self, failing: frozenset[str] = frozenset(), hold: threading.Event | None = None) -> None:
        self.failing = failing
        self.hold = hold
        self.dials: dict[str, int] = {}
        self.at_once = 0
        self.most_at_once = 0
        self.ended = 0
        self.changed = threading.Condition()

    def __call__(self, transport: SshTransport) -> Open:
        name = transport.host.name
        with self.changed:
            self.dials[name] = self.dials.get(name, 0) + 1
            self.at_once += 1
            self.most_at_once = max(self.most_at_once, self.at_once)
            self.changed.notify_all()
        try:
            if self.hold is not None:
                assert self.hold.wait(10), "the test never released the dialler"
            if name in self.failing:
                raise HostError(name, HostErrorKind.UNREACHABLE, f"cannot reach {name}")
            return Open()
        finally:
            with self.changed:
                self.at_once -= 1
                self.ended += 1
                self.changed.notify_all()

    def wait(self, until: Callable[[], bool]) -> None:
        """Block until `until()` holds (bounded: a hung test fails)."""
        with self.changed:
            assert self.changed.wait_for(until, timeout=10), "the dials never got there"


class NoDial:
    """Stands in for PreDial in pool tests: records where it would dial, sends nothing."""

    made: ClassVar[list[tuple[str, int]]] = []

    def __init__(self, target: tuple[str, int], timeout: float) -> None:
        self.target = target
        NoDial.made.append(target)

    def take(self) -> None:
        return None

    def discard(self) -> None:
        pass


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    NoDial.made = []
    monkeypatch.setattr(pool_module, "PreDial", NoDial)


@pytest.fixture
def dialer(monkeypatch: pytest.MonkeyPatch) -> Dialer:
    fake = Dialer(failing=frozenset({"node2"}))
    monkeypatch.setattr(SshTransport, "_open_connection", lambda self: fake(self))
    return fake


def pool_of(tmp_path: Path, parallel: int = 64, config_text: str = "") -> HostPool:
    config = tmp_path / "ssh_config"
    config.write_text(config_text)
    return HostPool(SshOptions(ssh_config=config), max_parallel=parallel)


def test_each_host_is_dialled_once_and_its_first_use_gets_that_connection(tmp_path: Path, dialer: Dialer) -> None:
    pool = pool_of(tmp_path)
    ok = tuple(h for h in HOSTS if h.name != "node2")
    pool.connect_ahead(ok)
    conns = pool.map(ok, lambda t: t.connection() if isinstance(t, SshTransport) else None)
    assert set(conns.succeeded) == {h.name for h in ok} and not conns.failed
    assert dialer.dials == {h.name: 1 for h in ok}  # the uses waited for the ahead dial, no second one
    assert all(isinstance(c, Open) for c in conns.succeeded.values())


def test_a_host_that_failed_ahead_raises_that_error_at_its_first_use_without_a_second_dial(
        tmp_path: Path, dialer: Dialer) -> None:
    pool = pool_of(tmp_path)
    pool.connect_ahead(HOSTS)
    dialer.wait(lambda: dialer.ended == len(HOSTS))  # every ahead open has ended: node2's failed
    fan = pool.map(HOSTS, lambda t: t.connection() if isinstance(t, SshTransport) else None)
    assert set(fan.failed) == {"node2"}
    assert fan.failed["node2"].kind == HostErrorKind.UNREACHABLE and "cannot reach node2" in fan.failed["node2"].message
    assert dialer.dials["node2"] == 1
    # The failure was reported once; a later use dials again, as a transport always did.
    with pytest.raises(HostError):
        pool.transport(HOSTS[2]).connection()  # type: ignore[attr-defined]
    assert dialer.dials["node2"] == 2


def test_a_use_that_comes_first_dials_itself_and_the_ahead_open_then_does_nothing(
        tmp_path: Path, dialer: Dialer) -> None:
    pool = pool_of(tmp_path)
    transport = pool.transport(HOSTS[0])
    assert isinstance(transport, SshTransport)
    transport.connection()
    transport.connect_ahead()  # as a late ahead thread would
    assert dialer.dials == {"node0": 1}


def test_a_closed_pool_opens_nothing_ahead(tmp_path: Path, dialer: Dialer) -> None:
    pool = pool_of(tmp_path)
    transports = [pool.transport(h) for h in HOSTS]
    pool.close()
    for t in transports:  # an ahead thread that starts after close
        assert isinstance(t, SshTransport)
        t.connect_ahead()
    assert dialer.dials == {}


def test_at_most_parallel_hosts_are_dialled_at_once_and_the_call_returns_before_any_dial_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hold = threading.Event()
    fake = Dialer(hold=hold)
    monkeypatch.setattr(SshTransport, "_open_connection", lambda self: fake(self))
    pool = pool_of(tmp_path, parallel=2)
    pool.connect_ahead(HOSTS)  # returns while every dial is held
    fake.wait(lambda: fake.at_once == 2)
    assert sum(fake.dials.values()) == 2
    hold.set()
    fake.wait(lambda: fake.ended == len(HOSTS))
    assert fake.dials == {h.name: 1 for h in HOSTS} and fake.most_at_once == 2


def test_local_hosts_have_nothing_to_open(tmp_path: Path, dialer: Dialer) -> None:
    pool = pool_of(tmp_path)
    pool.connect_ahead([LOCALHOST])
    assert isinstance(pool.transport(LOCALHOST), LocalTransport)
    assert dialer.dials == {}


def test_the_dials_go_where_ssh_config_sends_each_host_and_not_through_a_proxy(tmp_path: Path, dialer: Dialer) -> None:
    config = ("Host node0\n    HostName 198.18.1.1\n    Port 2222\n"
              "Host node1\n    ProxyJump node0\n"
              "Host node3\n    ProxyCommand nc %h %p\n")
    pool = pool_of(tmp_path, config_text=config)
    hosts = (*HOSTS[:4], Host("node9", "198.18.0.99", port=2200), LOCALHOST)
    pool.connect_ahead(hosts)
    dialer.wait(lambda: dialer.ended == 5)
    assert NoDial.made == [("198.18.1.1", 2222), ("198.18.0.12", 22), ("198.18.0.99", 2200)]
    assert set(dialer.dials) == {h.name for h in hosts[:5]}  # every SSH host still gets its handshake


def test_without_a_proxy_in_ssh_config_the_dials_go_to_each_address_before_ssh_config_is_read(
        tmp_path: Path, dialer: Dialer, monkeypatch: pytest.MonkeyPatch) -> None:
    def unread(self: HostPool) -> None:
        raise AssertionError("ssh_config was parsed before the dials went out")

    monkeypatch.setattr(HostPool, "_config", unread)
    pool = pool_of(tmp_path, config_text="Host node0\n    HostName 198.18.1.1\n    Port 2222\n")
    hosts = (HOSTS[0], Host("node9", "198.18.0.99", port=2200))
    with pytest.raises(AssertionError, match="parsed"):  # the transports need it, after the dials
        pool.connect_ahead(hosts)
    assert NoDial.made == [("198.18.0.10", 22), ("198.18.0.99", 2200)]


def test_a_proxy_anywhere_in_the_files_read_means_reading_them_first(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host *\n    User me\n")
    assert not names_a_proxy(config)
    config.write_text("Host bastioned\n  proxyJump bastion\n")
    assert names_a_proxy(config)
    config.write_text("Match host x\n\tProxyCommand nc %h %p\n")
    assert names_a_proxy(config)
    assert names_a_proxy(tmp_path / "missing")  # unreadable: assume the worst


def test_dial_target_follows_fabric_hostname_then_inventory_port_then_config_port() -> None:
    host = Host("n", "198.18.0.1")
    assert dial_target(host, {"hostname": "198.18.0.1"}) == ("198.18.0.1", 22)
    assert dial_target(host, {"hostname": "10.0.0.1", "port": "2022"}) == ("10.0.0.1", 2022)
    assert dial_target(Host("n", "a", port=23), {"hostname": "a", "port": "2022"}) == ("a", 23)
    assert dial_target(host, {"hostname": "x", "proxyjump": "bastion"}) is None
    assert dial_target(host, {"hostname": "x", "proxycommand": "nc %h %p"}) is None


# -- PreDial, on loopback ------------------------------------------------------------------------

@pytest.fixture
def listener() -> Any:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server
    server.close()


def test_a_dial_hands_over_its_connected_socket_once(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    dial = PreDial(("127.0.0.1", port), 5.0)
    sock = dial.take()
    assert sock is not None and sock.getpeername() == ("127.0.0.1", port)
    peer, _ = listener.accept()
    sock.sendall(b"SSH-2.0-test\r\n")
    assert peer.recv(64) == b"SSH-2.0-test\r\n"
    assert dial.take() is None  # taken: a second open dials itself
    sock.close()
    peer.close()


def test_a_refused_dial_leaves_the_dial_to_paramiko(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    assert PreDial(("127.0.0.1", port), 5.0).take() is None


def test_a_dial_that_times_out_raises_rather_than_wait_again(monkeypatch: pytest.MonkeyPatch) -> None:
    def timing_out(address: tuple[Any, int], timeout: float) -> socket.socket:
        assert address == (b"127.0.0.1", 22) and timeout == 0.5  # an ASCII name goes as bytes: no idna
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", timing_out)
    with pytest.raises(TimeoutError):
        PreDial(("127.0.0.1", 22), 0.5).take()
    unreachable = OSError(errno.EHOSTUNREACH, "No route to host")
    monkeypatch.setattr(socket, "create_connection", lambda address, timeout: (_ for _ in ()).throw(unreachable))
    assert PreDial(("127.0.0.1", 22), 0.5).take() is None


def test_a_discarded_dial_closes_its_socket(listener: socket.socket) -> None:
    dial = PreDial(("127.0.0.1", listener.getsockname()[1]), 5.0)
    peer, _ = listener.accept()
    dial._done.wait(5)
    dial.discard()
    peer.settimeout(5)
    assert peer.recv(64) == b""  # the server sees the connection close
    assert dial.take() is None
    peer.close()


def test_the_transport_connects_on_its_own_socket_and_drops_an_ahead_dial_aimed_elsewhere(
        listener: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    port = listener.getsockname()[1]
    opened: list[dict[str, Any]] = []

    def fake_open(conn: fabric.Connection) -> None:
        opened.append(dict(conn.connect_kwargs))
        conn.transport = _NoKeepalive()

    monkeypatch.setattr(fabric.Connection, "open", fake_open)
    here = Host("here", "127.0.0.1", port=port)
    transports = []
    for ahead in (PreDial(("127.0.0.1", port), 5.0), None, PreDial(("127.0.0.1", port), 5.0)):
        if len(transports) == 2:
            assert ahead is not None
            ahead.target = ("127.0.0.2", port)  # as if ssh_config had changed between the dial and the open
        if ahead is not None:
            assert ahead._done.wait(5)  # dialled: dropping it closes the socket there and then
        transports.append(SshTransport(here, SshOptions(), HostSshConfig().for_host(here), dial=ahead))
        transports[-1].connection()
    accepted = [listener.accept()[0] for _ in range(4)]  # 3 handed sockets, 1 dropped ahead dial
    for kwargs in opened:  # each open got a connected socket to fabric's target, without Nagle
        sock = kwargs["sock"]
        assert sock.getpeername() == ("127.0.0.1", port)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert len(opened) == 3 and sum(map(closed, accepted)) == 1  # the dropped dial, closed at once
    for kwargs in opened:
        kwargs["sock"].close()
    assert all(closed(peer, wait=5) for peer in accepted)
    for peer in accepted:
        peer.close()


def closed(peer: socket.socket, wait: float = 0.0) -> bool:
    """The other end has closed (EOF), within `wait` seconds."""
    peer.settimeout(wait or None)
    if not wait:
        peer.setblocking(False)
    try:
        return peer.recv(64) == b""
    except (BlockingIOError, TimeoutError):
        return False


class _NoKeepalive:
    def set_keepalive(self, interval: int) -> None:
        pass
