"""`ddpctl hosts --prom FILE` (orchestrator/hostops/prom.py): the ledger's series for node_exporter's
textfile collector, read back with prometheus-client's parser and checked by `promtool check
metrics` (skipped where promtool is missing and DDPCTL_REQUIRE_CLUSTER is unset; under
DDPCTL_REQUIRE_CLUSTER=1, CI, a missing promtool fails); and `family`, every declared series."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from account_fixtures import HOSTS, account
from prometheus_client.parser import text_string_to_metric_families
from test_hosts_cli import NODE1, hosts, inventory, seed

from inventory import Host
from node_agent.wire.metrics import METRICS, MetricName
from orchestrator.hostops.ledger import Ledger, Note, Sighting
from orchestrator.hostops.prom import family, write_textfile
from orchestrator.hostops.quarantine import EventKind
from tests.prometheus import promtool

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (name, sorted labels) -> value


def series(path: Path) -> Series:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(path.read_text()) for s in fam.samples}


def host(values: Series, name: str, metric: str, **labels: str) -> float:
    return values[(metric, tuple(sorted({"Hostname": name, **labels}.items())))]


def states(values: Series, name: str) -> dict[str, float]:
    return {state: host(values, name, "ddpctl_host_state", state=state) for state in ("ok", "suspect", "quarantined")}


def seed_costs() -> None:
    """node1 cost 100 s and 86 s in the last 24 h and 900 s three days ago; node0 4 s in each."""
    now = time.time()
    for run_id, ago, lost in (("train-1.0", 600, 100.0), ("train-2", 60, 86.0), ("train-0", 3 * 86400, 900.0)):
        Ledger().record_account(account(run_id, now - ago - 600, node1=lost, node0=4.0), HOSTS)


def test_the_file_has_each_hosts_state_faults_and_cost_as_the_ledger_has_them(tmp_path: Path) -> None:
    seed()  # node1: lost, then SIGKILLed: quarantined; node0: a straggler, ok
    seed_costs()
    path = tmp_path / "ddpctl.prom"
    code, out = hosts("--prom", str(path))
    assert code == 0, out
    assert out.strip().splitlines() == [f"wrote {path}: the state, host faults and cost in 24 h of 2 hosts"]
    values = series(path)
    assert states(values, "node1") == {"ok": 0.0, "suspect": 0.0, "quarantined": 1.0}
    assert states(values, "node0") == {"ok": 1.0, "suspect": 0.0, "quarantined": 0.0}
    assert host(values, "node1", "ddpctl_host_faults") == 2.0 and host(values, "node0", "ddpctl_host_faults") == 0.0
    assert host(values, "node1", "ddpctl_host_cost_seconds", window="24h") == 186.0
    assert host(values, "node0", "ddpctl_host_cost_seconds", window="24h") == 8.0
    assert len(values) == 2 * (3 + 1 + 1), sorted(values)


def test_the_inventorys_window_and_settings_hold_and_its_unknown_hosts_are_ok(tmp_path: Path) -> None:
    seed()
    seed_costs()
    Ledger().record("train-old", "up", [Sighting(NODE1)],
                    [Note(NODE1, EventKind.HOST_FAULT, "a rank was killed (SIGKILL)", at=time.time() - 2 * 86400)])
    path = tmp_path / "ddpctl.prom"
    inv = inventory(tmp_path, 'quarantine_after = 4\nquarantine_window = "7d"')
    code, out = hosts("-i", str(inv), "--prom", str(path))
    assert code == 0 and "in 7 d of 3 hosts" in out, out
    values = series(path)
    assert states(values, "node1") == {"ok": 0.0, "suspect": 1.0, "quarantined": 0.0}  # 3 faults of 4
    assert host(values, "node1", "ddpctl_host_faults") == 3.0
    assert host(values, "node1", "ddpctl_host_cost_seconds", window="7d") == 1086.0
    assert states(values, "node2")["ok"] == 1.0 and host(values, "node2", "ddpctl_host_cost_seconds", window="7d") == 0
    assert hosts("--prom", str(path))[0] == 0  # the default window counts the two recent faults only
    assert host(series(path), "node1", "ddpctl_host_faults") == 2.0


def test_a_released_host_is_ok_with_no_fault_counted(tmp_path: Path) -> None:
    seed()
    assert hosts("--release", "node1")[0] == 0
    path = tmp_path / "ddpctl.prom"
    assert hosts("--prom", str(path))[0] == 0
    values = series(path)
    assert states(values, "node1") == {"ok": 1.0, "suspect": 0.0, "quarantined": 0.0}
    assert host(values, "node1", "ddpctl_host_faults") == 0.0


def test_two_hosts_of_one_name_are_two_series(tmp_path: Path) -> None:
    seed()
    Ledger().record("other-1", "up", [Sighting(Host("node1", "10.0.0.5"))])
    path = tmp_path / "ddpctl.prom"
    assert hosts("--prom", str(path))[0] == 0
    names = {dict(labels)["Hostname"] for name, labels in series(path) if name == "ddpctl_host_faults"}
    assert names == {"node0", "node1 198.18.0.11", "node1 10.0.0.5"}


@pytest.mark.parametrize("seeded", [True, False], ids=["hosts", "empty-ledger"])
def test_promtool_finds_nothing_to_say_of_the_file(tmp_path: Path, seeded: bool) -> None:
    tool = promtool()
    if seeded:
        seed()
        seed_costs()
    path = tmp_path / "ddpctl.prom"
    assert hosts("--prom", str(path))[0] == 0
    with path.open("rb") as stdin:
        checked = subprocess.run([tool, "check", "metrics"], stdin=stdin, capture_output=True, text=True,
                                 timeout=60, check=False)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")
    assert ("ddpctl_host_state{" in path.read_text()) is seeded  # an empty ledger: each family, no sample


def test_an_unwritable_file_is_one_error_naming_it(tmp_path: Path) -> None:
    seed()
    path = tmp_path / "no" / "such" / "ddpctl.prom"
    code, out = hosts("--prom", str(path))
    assert code == 2 and "Traceback" not in out, out
    assert f"error: option --prom: cannot write {path}: No such file or directory" in out
    assert not path.parent.exists()


def test_a_file_node_exporter_would_not_read_is_written_with_a_warning(tmp_path: Path) -> None:
    seed()
    code, out = hosts("--prom", str(tmp_path / "ddpctl.txt"))
    assert code == 0 and "reads only *.prom files, not ddpctl.txt" in out
    assert "ddpctl_host_state" in (tmp_path / "ddpctl.txt").read_text()


def test_prom_goes_without_release(tmp_path: Path) -> None:
    seed()
    code, out = hosts("--release", "node1", "--prom", str(tmp_path / "ddpctl.prom"))
    assert code == 2 and "--prom goes without --release" in out
    assert "quarantined" in hosts()[1], "nothing was released"


@pytest.mark.parametrize("declared", METRICS, ids=[m.name for m in METRICS])
def test_every_declared_series_is_made_from_its_declaration(tmp_path: Path, declared: MetricName) -> None:
    write_textfile(tmp_path / "one.prom", [family(declared.name, [({label: "x" for label in declared.labels}, 3.0)])])
    assert [p.name for p in tmp_path.iterdir()] == ["one.prom"]  # the file written beside it was renamed
    text = (tmp_path / "one.prom").read_text()
    assert f"# HELP {declared.sample_name} {declared.help}\n" in text
    assert f"# TYPE {declared.sample_name} {declared.kind}\n" in text
    (parsed,) = text_string_to_metric_families(text)
    (sample,) = [s for s in parsed.samples if s.name == declared.sample_name]
    assert sorted(sample.labels) == sorted(declared.labels) and sample.value == 3.0


def test_a_family_refuses_labels_not_declared_and_names_not_declared() -> None:
    with pytest.raises(ValueError, match="ddpctl_host_faults has the labels Hostname, not Hostname, gpu"):
        family("ddpctl_host_faults", [({"Hostname": "node0", "gpu": "0"}, 1.0)])
    with pytest.raises(ValueError, match="ddpctl_host_cost_seconds has the labels Hostname, window, not none"):
        family("ddpctl_host_cost_seconds", [({}, 1.0)])
    with pytest.raises(KeyError):
        family("ddpctl_run_restarts_total")  # a counter goes by its declared name; prometheus-client adds _total
