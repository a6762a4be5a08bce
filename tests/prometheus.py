"""A real Prometheus and node_exporter for the metrics tests (Debian's `prometheus` and
`prometheus-node-exporter`): Prometheus on this machine, scraping every second; node_exporter inside
a namespace host with only its textfile collector. Each is started by the test and ended by pid."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.required import missing

PROMETHEUS = "/usr/bin/prometheus"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
PROMTOOL = "/usr/bin/promtool"


def require(*binaries: str) -> None:
    """Skip where a binary is missing; under DDPCTL_REQUIRE_CLUSTER=1 (CI), fail instead."""
    absent = [b for b in binaries if not os.access(b, os.X_OK)]
    if absent:
        missing(f"not installed: {', '.join(absent)} (Debian: prometheus prometheus-node-exporter)")


def promtool() -> str:
    """promtool's path (Debian's prometheus package), or the test skipped (failed in CI)."""
    require(PROMTOOL)
    return PROMTOOL


def free_port(address: str = "0.0.0.0") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def promtool_check_metrics(text: str) -> str:
    """promtool's complaints about an exposition ("" when it has none)."""
    checked = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    return "" if checked.returncode == 0 and not checked.stdout.strip() else checked.stdout + checked.stderr


def node_exporter_argv(textfile_dir: Path, address: str, port: int) -> list[str]:
    return [NODE_EXPORTER, f"--web.listen-address={address}:{port}", "--collector.disable-defaults",
            "--collector.textfile", f"--collector.textfile.directory={textfile_dir}"]


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` gives now: each series' labels ("metric") and "value"."""
        return list(self.api("query", query=expr)["result"])

    def values(self, expr: str, key: str) -> dict[str, float]:
        """label `key` -> value, for each series of `expr` now."""
        return {r["metric"].get(key, ""): float(r["value"][1]) for r in self.query(expr)}

    def targets_up(self) -> bool:
        active = self.api("targets")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)


@contextmanager
def prometheus(workdir: Path, targets: dict[str, Sequence[str]],
               rule_files: Sequence[Path] = ()) -> Iterator[Prometheus]:
    """Prometheus scraping `targets` (scrape job -> host:port) every second, with `rule_files`."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(p) for p in rule_files],
              "scrape_configs": [{"job_name": name, "static_configs": [{"targets": list(hosts)}]}
                                 for name, hosts in targets.items()]}
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port("127.0.0.1")
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=out, stderr=subprocess.STDOUT)
    server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"prometheus did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        shutil.rmtree(workdir / "data", ignore_errors=True)
