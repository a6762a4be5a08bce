"""`orchestrator.doctor(...)`: doctor from Python, the same runner as `ddpctl doctor` (its request,
its report), on this machine (no inventory: localhost)."""

from __future__ import annotations

from pathlib import Path

import pytest

import orchestrator
from inventory import ConfigError, load_inventory
from orchestrator.doctor.runner import DoctorReport


def test_doctor_from_python_checks_this_machine_and_says_what_the_cli_would(tmp_path: Path) -> None:
    from orchestrator import doctor

    report = doctor(timeout=60)
    assert isinstance(report, DoctorReport)
    assert report.report.hosts == ["localhost"]
    assert {f.check for f in report.findings} >= {"ssh", "python", "workdir"}
    assert report.ok == (report.exit_code() == 0) and report.exit_code(strict=True) in (0, 1)
    assert any(f.check == "ssh" and f.status.value == "ok" for f in report.findings)


def test_orchestrator_doctor_is_callable_and_still_the_package() -> None:
    import orchestrator.doctor.runner as runner

    assert callable(orchestrator.doctor) and orchestrator.doctor.runner is runner
    assert orchestrator.doctor.run_doctor.__module__ == "orchestrator.doctor.core"


def test_an_inventory_object_or_file_is_a_target_and_bad_input_is_a_located_error(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[[hosts]]\nname = "localhost"\naddress = "127.0.0.1"\n')
    by_file = orchestrator.doctor(inventory=hosts, timeout=60)
    by_object = orchestrator.doctor(inventory=load_inventory(hosts), timeout=60)
    assert by_file.report.hosts == by_object.report.hosts == ["localhost"]
    with pytest.raises(ConfigError, match="not both"):
        orchestrator.doctor(tmp_path / "job.toml", inventory=hosts)
    with pytest.raises(ConfigError) as missing:
        orchestrator.doctor(tmp_path / "nope.toml")
    assert "nope.toml" in str(missing.value)
