"""`ddpctl hosts` (orchestrator/commands/hosts.py): one row per host with its runs, last seen,
faults by kind with the last one, mean time between faults and state; `--json`; `-i` to an
inventory's hosts; `--release HOST` after a repair, and an error naming an unknown host."""

from __future__ import annotations

import json
import time
from pathlib import Path

from account_fixtures import HOSTS, account
from typer.testing import CliRunner

from inventory import Host
from orchestrator.cli import build
from orchestrator.hostops.ledger import Ledger, Note, Sighting
from orchestrator.hostops.quarantine import EventKind

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
NODE0 = Host("node0", "198.18.0.10")
NODE1 = Host("node1", "198.18.0.11")
KILLED = "a rank was killed (SIGKILL: out of memory, or killed on the host)"


def hosts(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(build(), ["hosts", *args], env=ENV)
    return result.exit_code, result.output


def seed() -> None:
    now = time.time()
    book = Ledger()
    book.record("train-1.0", "up", [Sighting(NODE0), Sighting(NODE1)],
                [Note(NODE1, EventKind.LOST, "node1 lost: connection closed", at=now - 600)], at=now - 600)
    book.record("train-2", "up", [Sighting(NODE0), Sighting(NODE1)],
                [Note(NODE1, EventKind.HOST_FAULT, KILLED, at=now - 60),
                 Note(NODE0, EventKind.STRAGGLER, "rank 0 on node0 is 30% slower", at=now - 60)], at=now - 60)


def inventory(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(f'[defaults]\n{extra}\n[[hosts]]\nname = "node0"\naddress = "198.18.0.10"\n'
                    '[[hosts]]\nname = "node1"\naddress = "198.18.0.11"\n'
                    '[[hosts]]\nname = "node2"\naddress = "198.18.0.12"\nspare = true\n')
    return path


def test_an_empty_ledger_says_where_it_is_and_what_fills_it() -> None:
    code, out = hosts()
    assert code == 0 and "no host in the ledger yet" in out and "ddpctl up" in out


def test_one_row_per_host_with_its_faults_state_and_the_release_command() -> None:
    seed()
    code, out = hosts()
    assert code == 0, out
    row0 = next(line for line in out.splitlines() if line.startswith("node0"))
    row1 = next(line for line in out.splitlines() if line.startswith("node1"))
    assert "straggler 1" in row0 and row0.rstrip().endswith("ok")
    assert "host_fault 1, lost 1; last host_fault: SIGKILL at" in row1 and "9 min" in row1
    assert row1.rstrip().endswith("quarantined") and " 2 " in row1  # 2 runs
    assert "node1: quarantined (2 host faults in 24 h: lost at " in out
    assert "release it with: ddpctl hosts --release node1" in out


def test_json_carries_every_field() -> None:
    seed()
    code, out = hosts("--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["quarantine"] == {"enabled": True, "after": 2, "window_s": 86400.0}
    by_name = {h["name"]: h for h in data["hosts"]}
    assert by_name["node1"]["state"] == "quarantined" and by_name["node1"]["faults"] == {"lost": 1, "host_fault": 1}
    assert by_name["node1"]["last"]["run_id"] == "train-2" and round(by_name["node1"]["mtbf_s"]) == 540
    assert by_name["node0"]["state"] == "ok" and by_name["node0"]["runs"] == 2


def test_the_cost_column_sums_what_each_host_cost_the_runs_in_the_quarantine_window(tmp_path: Path) -> None:
    seed()
    now = time.time()
    for run_id, ago, lost in (("train-1.0", 600, 100.0), ("train-2", 60, 86.0), ("train-0", 3 * 86400, 900.0)):
        Ledger().record_account(account(run_id, now - ago - 600, node1=lost, node0=4.0), HOSTS)
    code, out = hosts()
    assert code == 0, out
    header = next(line for line in out.splitlines() if line.startswith("host "))
    row1 = next(line for line in out.splitlines() if line.startswith("node1"))
    assert "cost 24 h" in header and "186 s in 2 runs" in row1 and "8 s in 2 runs" in out
    assert "node1: quarantined (2 host faults in 24 h, costing 186 s: lost at " in out
    by_name = {h["name"]: h for h in json.loads(hosts("--json")[1])["hosts"]}
    assert by_name["node1"]["cost"] == {"seconds": 186.0, "runs": 2}
    code, out = hosts("-i", str(inventory(tmp_path, "quarantine_window = \"7d\"")))
    assert "cost 7 d" in out and "1086 s in 3 runs" not in out and "18.1 min in 3 runs" in out


def test_an_inventory_lists_its_hosts_known_or_not_under_its_own_settings(tmp_path: Path) -> None:
    seed()
    code, out = hosts("-i", str(inventory(tmp_path, "quarantine_after = 3")), "--json")
    assert code == 0, out
    data = json.loads(out)
    assert [(h["name"], h["runs"], h["state"]) for h in data["hosts"]] == [
        ("node0", 2, "ok"), ("node1", 2, "suspect"), ("node2", 0, "ok")]


def test_release_puts_a_quarantined_host_back() -> None:
    seed()
    code, out = hosts("--release", "node1")
    assert code == 0, out
    assert "released node1 (198.18.0.11): it was quarantined (2 host faults in 24 h" in out
    data = json.loads(hosts("--json")[1])
    assert {h["name"]: h["state"] for h in data["hosts"]}["node1"] == "ok"
    code, out = hosts("--release", "198.18.0.11", "--json")  # by address, as JSON
    assert code == 0 and json.loads(out)["was"] == "ok"


def test_releasing_an_unknown_host_is_an_error_naming_it(tmp_path: Path) -> None:
    seed()
    code, out = hosts("--release", "node7")
    assert code == 2 and "no host node7 in the ledger (known: node0, node1)" in out
    code, out = hosts("-i", str(inventory(tmp_path)), "--release", "node9")
    assert code == 2 and "no host node9 in the inventory" in out


def test_a_name_two_clusters_share_needs_the_inventory_or_the_address(tmp_path: Path) -> None:
    seed()
    Ledger().record("other-1", "up", [Sighting(Host("node1", "10.0.0.5"))])
    code, out = hosts("--release", "node1")
    assert code == 2 and "2 hosts go by node1" in out and "-i hosts.toml" in out
    code, out = hosts("-i", str(inventory(tmp_path)), "--release", "node1")
    assert code == 0, out


def test_a_corrupt_ledger_is_a_warning_not_a_failure() -> None:
    from orchestrator.hostops.ledger import ledger_path

    ledger_path().parent.mkdir(parents=True, exist_ok=True)
    ledger_path().write_bytes(b"not sqlite" * 100)
    code, out = hosts()
    assert code == 0 and "warning:" in out and "corrupt" in out


def test_check_goes_with_release_and_an_inventory() -> None:
    code, out = hosts("--check")
    assert code == 2 and "--check goes with --release HOST and -i <inventory>" in out
    code, out = hosts("--release", "node1", "--check")
    assert code == 2 and "ddpctl hosts -i hosts.toml --release node3 --check" in out


def test_check_needs_two_hosts_the_ledger_knows_good(tmp_path: Path) -> None:
    seed()  # node1: two host faults, quarantined; node0 a straggler, still ok
    path = inventory(tmp_path)
    Ledger().record("doctor-1", "doctor", [Sighting(Host("node2", "198.18.0.12"))],
                    [Note(Host("node2", "198.18.0.12"), EventKind.DEEP_FINDING, "[links] warn: slow")])
    code, out = hosts("-i", str(path), "--release", "node1", "--check")
    assert code == 2 and "--check needs 2 hosts the ledger knows good beside node1 (it has 1: node0)" in out
    assert "quarantined" in hosts("-i", str(path))[1], "nothing was released"
