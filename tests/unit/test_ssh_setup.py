"""ssh-setup's pure parts, no host: the authorized_keys merge (and the agent op on a scratch home),
the key pair, password-login failures translated and classified, the per-host judgement, the
password sources and the rendering."""

from __future__ import annotations

import base64
import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest
from rich.console import Console
from typer.testing import CliRunner

from inventory import LOCALHOST, ConfigError, Host
from node_agent.ops.authkeys import authorize, key_of, to_append
from orchestrator.cli import app
from orchestrator.commands.ssh_setup import read_passwords, render, to_json
from orchestrator.errors import HostError, HostErrorKind
from orchestrator.hostops.ssh_setup import (
    Installed,
    Outcome,
    Reason,
    SetupReport,
    host_outcome,
    parse_installed,
    reason_for,
)
from orchestrator.remote.keys import LocalKey, ensure_key, key_login, password_login
from orchestrator.remote.ssh import AcceptNew, make_connection
from orchestrator.remote.ssh_config import HostSshConfig
from orchestrator.remote.ssh_errors import UnknownHostKey, translate
from orchestrator.remote.ssh_options import RecordedHostKey, SshOptions

ROOT = Path(__file__).resolve().parents[2]
ED = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIESzWsGWV+buPH0VZvo9IUKK0aRBq9Mn78bz7MIONnzm"
OTHER = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICgcowjuYMNeV4qhgYiaPY5eaoK8zNO0DCPrYtzltElt"
RSA = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7"
NODE1 = Host(name="node1", address="198.18.0.11", user="ddpuser")
NODE2 = Host(name="node2", address="198.18.0.12", user="ddpuser")
SECRET = "pw s3cr3t-w0rd $;'\""
runner = CliRunner()


# -- authorized_keys: one line per key, whatever its options or comment ------------------------

@pytest.mark.parametrize(("line", "expected"), [
    (f"{ED} me@laptop", tuple(ED.split())),
    (ED, tuple(ED.split())),
    (f"no-pty,from=\"10.0.0.*\" {ED} c", tuple(ED.split())),
    (f'command="echo a b; exit",no-pty {ED}', tuple(ED.split())),
    (f'environment="X=a \\" b" {RSA} rsa key', tuple(RSA.split())),
    ("sk-ssh-ed25519@openssh.com AAAAGnNr k", ("sk-ssh-ed25519@openssh.com", "AAAAGnNr")),
    ("ecdsa-sha2-nistp256 AAAAE2VjZHNh= x", ("ecdsa-sha2-nistp256", "AAAAE2VjZHNh=")),
    ("# ssh-ed25519 AAAA commented out", None),
    ("", None),
    ("   ", None),
    ("garbage here", None),
])
def test_key_of_finds_type_and_blob_past_options_and_ignores_comments(line: str,
                                                                      expected: tuple[str, str] | None) -> None:
    assert key_of(line) == expected


@pytest.mark.parametrize(("existing", "expected"), [
    ("", f"{ED} new\n"),
    (f"{OTHER} someone\n", f"{ED} new\n"),
    (f"{OTHER} someone", f"\n{ED} new\n"),  # no final newline: never glue two keys together
    (f"{ED} old-comment\n", None),
    (f'from="10.*",no-pty {ED}\n', None),
    (f"# a comment\n\n{OTHER}\n{ED}\n", None),
    (f"# {ED}\n", f"{ED} new\n"),  # a commented-out line is not the key
])
def test_to_append_adds_the_key_once_ignoring_options_and_comment(existing: str, expected: str | None) -> None:
    assert to_append(existing, f"{ED} new") == expected


@pytest.mark.parametrize("bad", ["not a key", f"{ED} a\n{OTHER} b", ""])
def test_to_append_refuses_anything_but_one_key_line(bad: str) -> None:
    with pytest.raises(ValueError):
        to_append("", bad)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_authorize_creates_ssh_dir_0700_and_file_0600_then_finds_the_key_present(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        first = authorize(f"{ED} me", str(tmp_path))
        second = authorize(f"{ED} me-again", str(tmp_path))
    finally:
        os.umask(old)
    keys = tmp_path / ".ssh" / "authorized_keys"
    assert (first["status"], first["created_dir"], first["created_file"]) == ("added", True, True)
    assert (second["status"], second["created_dir"], second["created_file"]) == ("present", False, False)
    assert (mode(keys.parent), mode(keys)) == (0o700, 0o600)
    assert (first["dir_mode"], first["file_mode"]) == (0o700, 0o600)
    assert keys.read_text() == f"{ED} me\n"


def test_authorize_keeps_existing_lines_and_modes_and_reports_them(tmp_path: Path) -> None:
    ssh = tmp_path / ".ssh"
    ssh.mkdir(mode=0o755)
    ssh.chmod(0o755)
    keys = ssh / "authorized_keys"
    keys.write_text(f"{OTHER} someone")
    keys.chmod(0o644)
    result = authorize(f"{ED} me", str(tmp_path))
    assert result["status"] == "added" and not result["created_dir"] and not result["created_file"]
    assert (result["dir_mode"], result["file_mode"]) == (0o755, 0o644)
    assert keys.read_text() == f"{OTHER} someone\n{ED} me\n"


def test_hosts_sharing_one_home_add_the_key_once(tmp_path: Path) -> None:
    """NFS homes: every host's agent appends to the same file at once; the lock keeps one line."""
    code = ("import sys; from node_agent.ops.authkeys import authorize; "
            "print(authorize(sys.argv[1], sys.argv[2])['status'])")
    procs = [subprocess.Popen([sys.executable, "-c", code, f"{ED} host{i}", str(tmp_path)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True) for i in range(8)]
    statuses = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert statuses == ["added"] + ["present"] * 7
    assert len((tmp_path / ".ssh" / "authorized_keys").read_text().splitlines()) == 1


def test_authorize_key_op_reports_an_unwritable_home_as_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from node_agent.ops import authkeys

    missing = tmp_path / "no" / "such" / "home"
    monkeypatch.setattr(authkeys, "_home", lambda: str(missing))
    result = authkeys.authorize_key({"op": "authorize_key", "key": f"{ED} me"}, io.BytesIO())
    assert result["status"] == "failed" and str(missing) in result["message"]
    assert parse_installed("n1", result) == Installed("failed", message=result["message"])


# -- the key pair -----------------------------------------------------------------------------

def ssh_keygen_fingerprint(pub: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]


def test_a_missing_key_is_created_ed25519_0600_with_pub_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "new" / ".ssh" / "id_ed25519"
    key = ensure_key(path, comment="me@here")
    assert key.created and key.algorithm == "ED25519"
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    pub = path.with_name("id_ed25519.pub")
    assert pub.read_text() == key.public_line + "\n" and key.public_line.endswith(" me@here")
    assert key.fingerprint == ssh_keygen_fingerprint(pub)  # OpenSSH's own spelling: SHA256:…
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True, check=True)
    assert derived.stdout.split()[:2] == key.public_line.split()[:2]  # OpenSSH reads the private file


def test_an_existing_key_is_used_not_replaced_and_a_missing_pub_is_written(tmp_path: Path) -> None:
    path = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "old", "-f", str(path)], check=True)
    private = path.read_bytes()
    pub = path.with_name("id_ed25519.pub")
    original = pub.read_text().strip()
    assert ensure_key(path).public_line == original and not ensure_key(path).created
    pub.unlink()
    again = ensure_key(path)
    assert path.read_bytes() == private and pub.read_text().split()[:2] == original.split()[:2]
    assert again.fingerprint == ssh_keygen_fingerprint(pub)


@pytest.mark.parametrize(("prepare", "message"), [
    ("passphrase", "passphrase-protected"),
    ("mismatched_pub", "does not hold the public half"),
    ("stray_pub", "exists but its private key"),
    ("garbage", "not a private key ddpctl can read"),
])
def test_keys_ddpctl_cannot_use_are_bad_input_naming_the_file(tmp_path: Path, prepare: str, message: str) -> None:
    path = tmp_path / "id_ed25519"
    pub = path.with_name("id_ed25519.pub")
    if prepare == "passphrase":
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "pass word", "-f", str(path)], check=True)
    elif prepare == "mismatched_pub":
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        pub.write_text(f"{OTHER} other\n")
    elif prepare == "stray_pub":
        pub.write_text(f"{OTHER} other\n")
    else:
        path.write_text("not a key\n")
    with pytest.raises(ConfigError) as info:
        ensure_key(path)
    assert message in info.value.message and info.value.key == "--key"
    assert prepare != "stray_pub" or not path.exists()  # nothing half-created


# -- failures of the password login, translated once and classified ---------------------------

def password_error(exc: BaseException, login: dict[str, object] | None = None) -> HostError:
    parsed = HostSshConfig.from_text("")
    parsed.host = NODE1
    conn = make_connection(NODE1, SshOptions(connect_timeout=3), parsed)
    conn.connect_kwargs.update(login if login is not None else password_login(SECRET))
    return translate(NODE1, conn, exc)


def public(line: str) -> paramiko.PKey:
    key_type, blob = line.split()[:2]
    return paramiko.PKey.from_type_string(key_type, base64.b64decode(blob))


@pytest.mark.parametrize(("make_exc", "reason", "words"), [
    (lambda: paramiko.AuthenticationException("Authentication failed."), Reason.WRONG_PASSWORD,
     "ddpuser@198.18.0.11:22 (node1) refused the password"),
    (lambda: paramiko.BadAuthenticationType("Bad authentication type", ["publickey"]), Reason.PASSWORD_DISABLED,
     "does not accept a password from ddpuser (it allows only publickey)"),
    (lambda: ConnectionRefusedError(111, "refused"), Reason.UNREACHABLE, "refused the connection"),
    (lambda: TimeoutError("timed out"), Reason.UNREACHABLE, "timed out after 3s"),
    (lambda: paramiko.BadHostKeyException("198.18.0.11", public(ED), public(OTHER)), Reason.HOST_KEY_CHANGED,
     "CHANGED"),
    (lambda: UnknownHostKey("198.18.0.11", public(ED)), Reason.UNKNOWN_HOST_KEY,
     "unknown host key for 198.18.0.11"),
])
def test_password_login_failures_are_classified_and_never_hold_the_password(make_exc: object, reason: Reason,
                                                                            words: str) -> None:
    err = password_error(make_exc())  # type: ignore[operator]
    assert reason_for(err) is reason and words in err.message
    assert SECRET not in err.message + err.fix + json.dumps(err.to_json())


def test_a_refused_key_login_is_still_a_key_refusal_not_a_wrong_password(tmp_path: Path) -> None:
    err = password_error(paramiko.AuthenticationException("Authentication failed."), dict(key_login(tmp_path / "k")))
    assert err.kind is HostErrorKind.AUTH and reason_for(err) is Reason.KEY_REFUSED


def test_accept_new_records_the_key_and_tells_its_openssh_fingerprint(tmp_path: Path) -> None:
    seen: list[RecordedHostKey] = []
    known = tmp_path / "ssh" / "known_hosts"
    AcceptNew(known, "node1", seen.append).missing_host_key(paramiko.SSHClient(), "[198.18.0.11]:2222", public(ED))
    assert known.read_text() == f"[198.18.0.11]:2222 {ED}\n"
    pub = tmp_path / "host.pub"
    pub.write_text(ED + "\n")
    assert seen == [RecordedHostKey("node1", "[198.18.0.11]:2222", "ssh-ed25519", ssh_keygen_fingerprint(pub), known)]


# -- each host's outcome ------------------------------------------------------------------------

ADDED = Installed("added", "/home/u/.ssh/authorized_keys", True, True, 0o700, 0o600)
PRESENT = Installed("present", "/home/u/.ssh/authorized_keys", dir_mode=0o700, file_mode=0o600)
LOOSE = Installed("present", "/home/u/.ssh/authorized_keys", dir_mode=0o775, file_mode=0o664)
WRONG = HostError("node1", HostErrorKind.WRONG_PASSWORD, "refused the password", "check it")
DISABLED = HostError("node1", HostErrorKind.PASSWORD_DISABLED, "no password login", "allow it")
DOWN = HostError("node1", HostErrorKind.UNREACHABLE, "no route", "ping")
REFUSED = HostError("node1", HostErrorKind.AUTH, "refused every key offered", "ssh-copy-id")


@pytest.mark.parametrize(("install", "verify", "outcome", "reason", "words"), [
    (ADDED, True, Outcome.INSTALLED, None, "added to /home/u/.ssh/authorized_keys (created ~/.ssh and the file)"),
    (PRESENT, True, Outcome.PRESENT, None, "already in /home/u/.ssh/authorized_keys"),
    (WRONG, True, Outcome.PRESENT, None, "the key already logs in (the password login failed: wrong password)"),
    (DISABLED, True, Outcome.PRESENT, None, "password login disabled"),
    (WRONG, REFUSED, Outcome.FAILED, Reason.WRONG_PASSWORD, "refused the password"),
    (DISABLED, REFUSED, Outcome.FAILED, Reason.PASSWORD_DISABLED, "no password login"),
    (DOWN, None, Outcome.FAILED, Reason.UNREACHABLE, "no route"),
    (ADDED, REFUSED, Outcome.FAILED, Reason.KEY_REFUSED, "but sshd refused a login with it"),
    (ADDED, DOWN, Outcome.FAILED, Reason.UNREACHABLE, "but logging in with it failed: no route"),
    (Installed("failed", message="/h: Read-only file system"), None, Outcome.FAILED, Reason.NOT_WRITTEN,
     "Read-only file system"),
])
def test_judge_combines_the_password_step_and_the_key_only_login(install: Installed | HostError,
                                                                 verify: HostError | bool | None, outcome: Outcome,
                                                                 reason: Reason | None, words: str) -> None:
    row = host_outcome(NODE1, install, verify)
    assert (row.outcome, row.reason, row.verified) == (outcome, reason, verify is True)
    assert words in row.message


def test_loose_modes_are_named_in_the_fix_of_a_refused_key() -> None:
    row = host_outcome(NODE1, LOOSE, REFUSED)
    assert row.fix.startswith("~/.ssh is 775 and authorized_keys 664") and "chmod 700 ~/.ssh" in row.fix


def test_this_machine_needs_no_setup() -> None:
    row = host_outcome(LOCALHOST, None, None)
    assert row.outcome is Outcome.LOCAL and not row.failed


# -- passwords: stdin lines or terminal prompts; never echoed back ----------------------------

def test_one_stdin_line_is_the_password_of_every_host_verbatim() -> None:
    got = read_passwords([NODE1, NODE2], False, True, io.StringIO(SECRET + "\nignored\n"), _no_prompt, False)
    assert got == {"node1": SECRET, "node2": SECRET}


def test_ask_each_reads_one_stdin_line_per_host_in_order() -> None:
    got = read_passwords([NODE1, NODE2], True, True, io.StringIO("first pw\r\nsecond pw\n"), _no_prompt, False)
    assert got == {"node1": "first pw", "node2": "second pw"}


def test_too_few_stdin_lines_is_bad_input_naming_the_host_order() -> None:
    with pytest.raises(ConfigError) as info:
        read_passwords([NODE1, NODE2], True, True, io.StringIO("only one\n"), _no_prompt, False)
    assert "expected 2 line(s)" in info.value.message and "node1, node2" in info.value.message
    assert "only one" not in info.value.message


def test_the_terminal_is_asked_once_or_once_per_host() -> None:
    asked: list[str] = []

    def prompt(text: str) -> str:
        asked.append(text)
        return f"answer{len(asked)}"

    assert read_passwords([NODE1, NODE2], False, False, io.StringIO(), prompt, True) == {
        "node1": "answer1", "node2": "answer1"}
    assert asked == ["SSH password (the same for all 2 host(s)): "]
    asked.clear()
    assert read_passwords([NODE1, NODE2], True, False, io.StringIO(), prompt, True) == {
        "node1": "answer1", "node2": "answer2"}
    assert asked == ["SSH password for ddpuser@node1: ", "SSH password for ddpuser@node2: "]


def test_password_stdin_on_a_terminal_asks_without_echo_instead_of_reading_an_echoed_line() -> None:
    got = read_passwords([NODE1], False, True, io.StringIO("echoed\n"), lambda text: f"asked: {text}", True)
    assert got == {"node1": "asked: SSH password for ddpuser@node1: "}


def test_no_terminal_and_no_password_stdin_is_bad_input_with_the_fix() -> None:
    with pytest.raises(ConfigError) as info:
        read_passwords([NODE1], False, False, io.StringIO(SECRET), _no_prompt, False)
    assert info.value.key == "--password-stdin" and "--password-stdin <" in (info.value.hint or "")


def _no_prompt(text: str) -> str:
    raise AssertionError(f"prompted: {text}")


def test_the_cli_without_a_terminal_exits_2_before_any_connection(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.toml"
    inventory.write_text('[[hosts]]\nname = "node1"\naddress = "198.18.0.11"\n')
    result = runner.invoke(app, ["ssh-setup", "-i", str(inventory), "--key", str(tmp_path / "k")])
    assert result.exit_code == 2 and "not a terminal" in result.output and "Traceback" not in result.output


def test_a_job_file_and_an_inventory_together_are_bad_input(tmp_path: Path) -> None:
    result = runner.invoke(app, ["ssh-setup", str(tmp_path / "job.toml"), "-i", str(tmp_path / "hosts.toml")])
    assert result.exit_code == 2 and "not both" in result.output


# -- rendering --------------------------------------------------------------------------------

def report() -> SetupReport:
    key = LocalKey(Path("/home/me/.ssh/id_ed25519"), f"{ED} me@here", "ED25519", "SHA256:abc", True)
    rows = [host_outcome(NODE1, ADDED, True), host_outcome(NODE2, WRONG, REFUSED), host_outcome(LOCALHOST, None, None)]
    recorded = [RecordedHostKey("node1", "198.18.0.11", "ssh-ed25519", "SHA256:hostfp", Path("/k/known_hosts"))]
    return SetupReport(key, rows, recorded)


def test_the_table_shows_each_host_its_result_and_the_failures_with_their_fix() -> None:
    out = Console(record=True, width=200)
    render(report(), out)
    text = out.export_text()
    assert "key: /home/me/.ssh/id_ed25519 (created, ED25519 SHA256:abc)" in text
    assert "recorded new host key of node1 (198.18.0.11): ssh-ed25519 SHA256:hostfp in /k/known_hosts" in text
    lines = {line.split()[1]: line for line in text.splitlines() if line.startswith("│")}
    assert "installed" in lines["node1"] and "✓" in lines["node1"]
    assert "failed" in lines["node2"] and "wrong password" in lines["node2"] and "✗" in lines["node2"]
    assert "this machine" in lines["localhost"]
    assert "node2: wrong password: refused the password" in text and "fix: check it" in text


def test_json_has_the_same_results_and_the_exit_code() -> None:
    data = json.loads(to_json(report()))
    assert data["exit_code"] == 1 and data["key"]["fingerprint"] == "SHA256:abc"
    assert [(h["host"], h["outcome"], h["reason"], h["key_login"]) for h in data["hosts"]] == [
        ("node1", "installed", None, True), ("node2", "failed", "wrong password", False),
        ("localhost", "this machine", None, False)]
    assert data["new_host_keys"][0]["fingerprint"] == "SHA256:hostfp"
