"""`ddpctl ssh-setup` through the real CLI on hosts that share no filesystem: two accept the test
user's password, one only keys. Every test brings its own HOME (so its own key and known_hosts)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import secrets
import select
import struct
import subprocess
import termios
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster, require_cluster, start_cluster
from tests.ddpctl_run import REPO, ddpctl_argv

pytestmark = pytest.mark.cluster
PASSWORD_HOSTS = (0, 1)
KEYS_ONLY = 2  # password login disabled for the test user


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_cluster()
    with start_cluster(3, tmp_path_factory.mktemp("sshsetup"), private=True,
                       password_login=PASSWORD_HOSTS) as c:
        yield c


class Setup:
    """One test's side of the control machine: HOME, inventory and ssh_config, and the CLI run."""

    def __init__(self, cluster: Cluster, root: Path, hosts: Sequence[int] = (0, 1, 2),
                 known_hosts: Path | None = None, extra_hosts: Sequence[tuple[str, str]] = ()) -> None:
        self.cluster = cluster
        self.root = root
        self.home = root / "home"
        self.home.mkdir(exist_ok=True)
        self.inventory = root / "hosts.toml"
        entries = [(cluster.hosts[i].name, cluster.hosts[i].address) for i in hosts] + list(extra_hosts)
        self.inventory.write_text('[defaults]\nuser = "ddpuser"\n' + "".join(
            f'[[hosts]]\nname = "{name}"\naddress = "{address}"\n' for name, address in entries))
        self.ssh_config = root / "ssh_config"
        known = f'    UserKnownHostsFile "{known_hosts}"\n' if known_hosts else ""
        self.ssh_config.write_text(f"Host *\n{known}    ConnectTimeout 5\n")

    @property
    def key(self) -> Path:
        return self.home / ".ssh" / "id_ed25519"

    def argv(self, *args: str) -> list[str]:
        return ddpctl_argv("ssh-setup", "-i", str(self.inventory), "--ssh-config", str(self.ssh_config),
                           "--connect-timeout", "3", *args)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        return {**env, "HOME": str(self.home), "PYTHONPATH": str(REPO)}

    def run(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), input=stdin, capture_output=True, text=True, timeout=120,
                              cwd=self.root, env=self.env(), check=False)

    def run_json(self, *args: str, stdin: str) -> tuple[int, dict[str, Any]]:
        result = self.run("--json", "--password-stdin", *args, stdin=stdin)
        try:
            data = json.loads(result.stdout)
        except ValueError:
            pytest.fail(f"no JSON (exit {result.returncode}): {result.stdout}\n{result.stderr}")
        assert data["exit_code"] == result.returncode
        return result.returncode, data


def outcomes(data: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    return {h["host"]: (h["outcome"], h["reason"]) for h in data["hosts"]}


def authorized_keys(cluster: Cluster, i: int) -> list[str]:
    out = cluster.run_in(i, ["cat", f"{cluster.test_home}/.ssh/authorized_keys"])
    return out.stdout.splitlines() if out.returncode == 0 else []


def lines_with(key: Path, lines: list[str]) -> list[str]:
    blob = key.with_name(key.name + ".pub").read_text().split()[1]
    return [line for line in lines if blob in line.split()]


def key_only_login(cluster: Cluster, i: int, key: Path) -> subprocess.CompletedProcess[str]:
    """OpenSSH's own client with this key alone: no agent, no password, no other key."""
    return subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
         "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "-o", f"UserKnownHostsFile={cluster.known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=5",
         f"{cluster.test_user}@{cluster.hosts[i].address}", "echo", "key-login-ok"],
        capture_output=True, text=True, timeout=30, check=False)


def host_key_fingerprint(cluster: Cluster) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", f"{cluster.host_key}.pub"], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


def secret_words(*passwords: str) -> list[str]:
    """The passwords, and their longer words: found even where quoting or JSON escaping changed them."""
    return [*passwords, *(w for p in passwords for w in p.split() if len(w) >= 8)]


def assert_absent(words: Sequence[str], *texts: str) -> None:
    for word in words:
        for text in texts:
            assert word not in text


def files_text(*roots: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for root in roots for p in sorted(root.rglob("*"))
                     if p.is_file())


# -- installing the key ---------------------------------------------------------------------

def test_the_key_is_created_installed_and_then_logs_in_alone(cluster: Cluster, tmp_path: Path) -> None:
    s = Setup(cluster, tmp_path, hosts=PASSWORD_HOSTS, known_hosts=cluster.known_hosts)
    code, data = s.run_json(stdin=cluster.test_password + "\n")  # no --key: ~/.ssh/id_ed25519
    assert code == 0, data
    assert outcomes(data) == {"node0": ("installed", None), "node1": ("installed", None)}
    assert all(h["key_login"] for h in data["hosts"])
    assert (s.key.stat().st_mode & 0o777, s.key.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    pub = s.key.with_name("id_ed25519.pub").read_text()
    assert pub.startswith("ssh-ed25519 ") and data["key"]["created"] and data["key"]["public_key"] == pub.strip()
    for i in PASSWORD_HOSTS:
        assert len(lines_with(s.key, authorized_keys(cluster, i))) == 1
        login = key_only_login(cluster, i, s.key)
        assert (login.returncode, login.stdout.strip()) == (0, "key-login-ok"), login.stderr
        modes = cluster.run_in(i, ["stat", "-c", "%a %U %n", f"{cluster.test_home}/.ssh",
                                   f"{cluster.test_home}/.ssh/authorized_keys"]).stdout.splitlines()
        assert [line.split()[:2] for line in modes] == [["700", "ddpuser"], ["600", "ddpuser"]]


def test_a_second_run_finds_the_key_already_present_and_adds_no_line(cluster: Cluster, tmp_path: Path) -> None:
    s = Setup(cluster, tmp_path, hosts=PASSWORD_HOSTS, known_hosts=cluster.known_hosts)
    first = s.run("--password-stdin", stdin=cluster.test_password + "\n")
    assert first.returncode == 0, first.stdout + first.stderr
    second = s.run("--password-stdin", stdin=cluster.test_password + "\n")
    assert second.returncode == 0, second.stdout + second.stderr
    rows = {line.split()[1]: line for line in second.stdout.splitlines() if line.startswith("│")}
    assert "already present" in rows["node0"] and "already present" in rows["node1"]
    assert "(existing, ED25519 SHA256:" in second.stdout
    for i in PASSWORD_HOSTS:
        assert len(lines_with(s.key, authorized_keys(cluster, i))) == 1


def test_a_key_already_authorized_with_options_and_another_comment_is_not_added_again(
        cluster: Cluster, tmp_path: Path) -> None:
    s = Setup(cluster, tmp_path, hosts=PASSWORD_HOSTS, known_hosts=cluster.known_hosts)
    s.key.parent.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "made-by-hand", "-f", str(s.key)], check=True)
    type_, blob = s.key.with_name("id_ed25519.pub").read_text().split()[:2]
    home = cluster.test_home
    added = cluster.run_in(1, ["sh", "-c", f'mkdir -p {home}/.ssh && cat >> {home}/.ssh/authorized_keys && '
                                           f'chown -R ddpuser: {home}/.ssh'],
                           input=f'no-pty,no-X11-forwarding {type_} {blob} another-comment\n')
    assert added.returncode == 0, added.stderr
    code, data = s.run_json(stdin=cluster.test_password + "\n")
    assert (code, outcomes(data)) == (0, {"node0": ("installed", None), "node1": ("already present", None)})
    assert not data["key"]["created"]  # the user's key is used, not replaced
    line = f"no-pty,no-X11-forwarding {type_} {blob} another-comment"
    assert lines_with(s.key, authorized_keys(cluster, 1)) == [line]


# -- failures, each named per host ----------------------------------------------------------

def test_wrong_password_disabled_password_login_and_unreachable_are_reported_per_host(
        cluster: Cluster, tmp_path: Path) -> None:
    ghost = str(cluster.network.network_address + 90)  # on the bridge, but no host answers there
    s = Setup(cluster, tmp_path, known_hosts=cluster.known_hosts, extra_hosts=[("ghost", ghost)])
    wrong = f"not it {secrets.token_hex(8)}"
    result = s.run("--password-stdin", stdin=wrong + "\n")
    code, data = s.run_json(stdin=wrong + "\n")
    assert code == 1 and result.returncode == 1
    assert outcomes(data) == {"node0": ("failed", "wrong password"), "node1": ("failed", "wrong password"),
                              "node2": ("failed", "password login disabled"), "ghost": ("failed", "unreachable")}
    assert "node0: wrong password: ddpuser@" in result.stdout and "refused the password" in result.stdout
    assert "node2: password login disabled:" in result.stdout and "allows only publickey" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    for i in range(3):
        assert lines_with(s.key, authorized_keys(cluster, i)) == []
    assert_absent(secret_words(wrong, cluster.test_password), result.stdout, result.stderr, json.dumps(data),
                  files_text(s.root))


def test_a_host_without_password_login_fails_alone_and_the_others_get_the_key(cluster: Cluster,
                                                                              tmp_path: Path) -> None:
    s = Setup(cluster, tmp_path, known_hosts=cluster.known_hosts)
    code, data = s.run_json(stdin=cluster.test_password + "\n")
    assert (code, outcomes(data)) == (1, {"node0": ("installed", None), "node1": ("installed", None),
                                          "node2": ("failed", "password login disabled")})
    assert "PasswordAuthentication yes" in data["hosts"][2]["fix"]
    assert key_only_login(cluster, KEYS_ONLY, s.key).returncode != 0


def test_ask_each_takes_one_password_per_host_in_inventory_order(cluster: Cluster, tmp_path: Path) -> None:
    s = Setup(cluster, tmp_path, hosts=PASSWORD_HOSTS, known_hosts=cluster.known_hosts)
    code, data = s.run_json("--ask-each", stdin=f"{cluster.test_password}\nwrong for node1\n")
    assert (code, outcomes(data)) == (1, {"node0": ("installed", None), "node1": ("failed", "wrong password")})
    short = s.run("--password-stdin", "--ask-each", stdin=cluster.test_password + "\n")
    assert short.returncode == 2 and "expected 2 line(s)" in short.stderr and "node0, node1" in short.stderr


def test_the_password_is_on_no_command_line_and_in_no_output_or_file(cluster: Cluster, tmp_path: Path) -> None:
    s = Setup(cluster, tmp_path, hosts=PASSWORD_HOSTS, known_hosts=cluster.known_hosts)
    words = secret_words(cluster.test_password)
    out_file, err_file = tmp_path / "stdout", tmp_path / "stderr"
    with out_file.open("w") as out_f, err_file.open("w") as err_f:
        proc = subprocess.Popen(s.argv("--password-stdin"), stdin=subprocess.PIPE, stdout=out_f, stderr=err_f,
                                text=True, cwd=s.root, env=s.env())
    assert proc.stdin is not None
    proc.stdin.write(cluster.test_password + "\n")
    proc.stdin.close()
    seen: set[str] = set()
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= command_lines()
    proc.wait(timeout=10)
    out, err = out_file.read_text(), err_file.read_text()
    assert proc.returncode == 0, out + err
    assert any("ssh-setup" in line for line in seen)  # the scan did see ddpctl running
    assert_absent(words, "\n".join(seen), out, err, files_text(s.root))


def command_lines() -> set[str]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.add((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return found


# -- host keys: OpenSSH's rules, fingerprints shown -----------------------------------------

def test_unknown_host_keys_are_refused_and_accept_new_records_them_showing_the_fingerprint(
        cluster: Cluster, tmp_path: Path) -> None:
    s = Setup(cluster, tmp_path, hosts=PASSWORD_HOSTS)  # known_hosts: ~/.ssh/known_hosts, empty
    known = s.home / ".ssh" / "known_hosts"
    code, data = s.run_json(stdin=cluster.test_password + "\n")
    assert (code, outcomes(data)) == (1, {"node0": ("failed", "unknown host key"),
                                          "node1": ("failed", "unknown host key")})
    assert not known.exists() or known.read_text() == ""
    accepted = s.run("--password-stdin", "--accept-new-host-keys", stdin=cluster.test_password + "\n")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    fingerprint = host_key_fingerprint(cluster)
    for h in (cluster.hosts[i] for i in PASSWORD_HOSTS):
        assert f"recorded new host key of {h.name} ({h.address}): ssh-ed25519 {fingerprint} in {known}" in \
            accepted.stdout
    host_pub = Path(f"{cluster.host_key}.pub").read_text().split()[1]
    assert sorted(known.read_text().splitlines()) == sorted(
        f"{cluster.hosts[i].address} ssh-ed25519 {host_pub}" for i in PASSWORD_HOSTS)
    again = s.run("--password-stdin", "--accept-new-host-keys", stdin=cluster.test_password + "\n")
    assert again.returncode == 0 and "recorded new host key" not in again.stdout


def test_a_changed_host_key_is_refused_even_with_accept_new(cluster: Cluster, tmp_path: Path) -> None:
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    known = tmp_path / "known_hosts"
    node0 = cluster.hosts[0].address
    known.write_text(f"{node0} {' '.join(impostor.with_suffix('.pub').read_text().split()[:2])}\n")
    s = Setup(cluster, tmp_path, hosts=(0,), known_hosts=known)
    code, data = s.run_json("--accept-new-host-keys", stdin=cluster.test_password + "\n")
    assert (code, outcomes(data)) == (1, {"node0": ("failed", "host key changed")})
    assert "ssh-keygen -R" in data["hosts"][0]["fix"] and data["new_host_keys"] == []
    assert lines_with(s.key, authorized_keys(cluster, 0)) == []


# -- the terminal prompt --------------------------------------------------------------------

def run_on_terminal(argv: list[str], env: dict[str, str], cwd: Path, answers: Sequence[str],
                    timeout: float = 120) -> tuple[int, str, list[str]]:
    """Run argv with a pseudo-terminal as its controlling terminal; answer each password prompt."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: never returns
        os.chdir(cwd)
        os.execve(argv[0], argv, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))  # wide: one table row per line
    output, prompts, pending = b"", [], list(answers)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
            asked = re.findall(rb"SSH password[^:]*: ", output)
            while len(prompts) < len(asked):
                prompts.append(asked[len(prompts)].decode())
                os.write(fd, (pending.pop(0) + "\n").encode())
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    text = re.sub(r"\x1b\[[0-9;]*m", "", output.decode(errors="replace"))  # colours off
    return os.waitstatus_to_exitcode(status), text, prompts


def test_the_terminal_asks_once_without_echo(cluster: Cluster, tmp_path: Path) -> None:
    s = Setup(cluster, tmp_path, hosts=PASSWORD_HOSTS, known_hosts=cluster.known_hosts)
    code, output, prompts = run_on_terminal(s.argv(), s.env(), s.root, [cluster.test_password])
    assert prompts == ["SSH password (the same for all 2 host(s)): "]
    assert code == 0, output
    assert re.search(r"node0 .*installed", output) and re.search(r"node1 .*installed", output)
    assert_absent(secret_words(cluster.test_password), output)


def test_the_terminal_asks_each_host_in_turn_with_ask_each(cluster: Cluster, tmp_path: Path) -> None:
    s = Setup(cluster, tmp_path, hosts=PASSWORD_HOSTS, known_hosts=cluster.known_hosts)
    code, output, prompts = run_on_terminal(s.argv("--ask-each"), s.env(), s.root,
                                            ["wrong for node0", cluster.test_password])
    assert prompts == ["SSH password for ddpuser@node0: ", "SSH password for ddpuser@node1: "]
    assert code == 1, output
    assert re.search(r"node0 .*failed .*wrong password", output) and re.search(r"node1 .*installed", output)
    assert_absent(secret_words(cluster.test_password), output)
