"""doctor --deep's verdicts from figures (orchestrator/checks/links.py, compute.py, doctor/deep.py):
a slow host is told from a slow pair, a slow CPU explains its slow gloo links, a slow device is
compared with its own model only, and a healthy spread gives no warning."""

from __future__ import annotations

import random
from typing import Any

from orchestrator.checks.compute import DeviceRate, compute_findings
from orchestrator.checks.links import LinkRate, LinkRounds, link_findings
from orchestrator.checks.model import CheckStatus, Finding
from orchestrator.doctor.deep import analyse
from train_jobs.hostcheck.schedule import round_robin

HOSTS = [f"node{i}" for i in range(8)]


def rounds_of(rates: dict[tuple[int, int], float], all_pairs: bool = True, backend: str = "gloo",
              once: tuple[tuple[int, int], ...] = ()) -> LinkRounds:
    """`rates` as measured: every pair twice (a slow pair confirmed), but those in `once`."""
    return LinkRounds(tuple(LinkRate(HOSTS[a], HOSTS[b], v, 1 if (a, b) in once else 2) for (a, b), v in rates.items()),
                      rounds=7, all_pairs=all_pairs, nbytes=2 << 20, backend=backend)


def tournament(jitter: float = 0.3, seed: int = 1) -> dict[tuple[int, int], float]:
    rng = random.Random(seed)
    return {p: 900.0 * (1 + rng.uniform(-jitter, jitter)) for r in round_robin(8) for p in r}


def warned(findings: list[Finding]) -> dict[str | None, list[str]]:
    out: dict[str | None, list[str]] = {}
    for f in findings:
        if f.status in (CheckStatus.WARN, CheckStatus.FAIL):
            out.setdefault(f.host, []).append(f.message)
    return out


def test_a_healthy_spread_gives_one_ok_per_host_and_the_schedule_line() -> None:
    for seed in range(20):
        findings = link_findings(HOSTS, rounds_of(tournament(seed=seed)))
        assert warned(findings) == {}
        assert {f.host for f in findings if f.status is CheckStatus.OK} == set(HOSTS)
    (line,) = [f for f in findings if f.host is None]
    assert line.message.startswith("links: all 28 pairs in 7 rounds, 2 MiB each way, median ")


def test_a_host_whose_every_link_is_slow_is_named_with_its_figure_against_the_median() -> None:
    rates = tournament()
    for p in rates:
        if 3 in p:
            rates[p] = 24.0
    found = warned(link_findings(HOSTS, rounds_of(rates)))
    assert list(found) == ["node3"]
    (message,) = found["node3"]
    assert message.startswith("every link ") and "× below the median (24 MB/s at best vs " in message
    assert message.endswith("a degraded NIC or cable")


def test_one_slow_pair_between_fine_hosts_names_the_pair_on_both_hosts() -> None:
    rates = tournament()
    rates[(2, 5)] = 30.0
    found = warned(link_findings(HOSTS, rounds_of(rates)))
    assert set(found) == {"node2", "node5"}
    assert found["node2"][0].startswith("the link node2 <-> node5 is ") and "other links are fine" in found["node2"][0]
    assert warned(link_findings(HOSTS, rounds_of(rates, once=((2, 5),)))) == {}, "measured once: not confirmed"


def test_a_slow_cpu_explains_its_slow_gloo_links_but_not_nccl_ones() -> None:
    rates = tournament()
    for p in rates:
        if 4 in p:
            rates[p] = 50.0
    gloo = link_findings(HOSTS, rounds_of(rates), slow_compute={"node4"})
    assert warned(gloo) == {}
    assert any(f.host == "node4" and f.status is CheckStatus.INFO and "its CPU is slow too" in f.message for f in gloo)
    nccl = link_findings(HOSTS, rounds_of(rates, backend="nccl"), slow_compute={"node4"})
    assert list(warned(nccl)) == ["node4"]


def test_a_covering_schedule_says_how_much_it_measured() -> None:
    rates = {p: 900.0 for r in round_robin(8)[:3] for p in r}
    (line,) = [f for f in link_findings(HOSTS, rounds_of(rates, all_pairs=False)) if f.host is None]
    assert "12 of 28 pairs in 7 rounds (a covering schedule" in line.message


def test_two_hosts_have_nothing_to_compare_with() -> None:
    findings = link_findings(HOSTS[:2], LinkRounds((LinkRate("node0", "node1", 3.0),), 1, True, 2 << 20))
    assert [f.status for f in findings] == [CheckStatus.INFO]
    assert "nothing to compare one link with" in findings[0].message


def test_a_slow_gpu_is_compared_with_its_own_model_only() -> None:
    rates = [DeviceRate(h, f"cuda:{g}", "NVIDIA H100 80GB HBM3", 700.0 - g, gpu=True)
             for h in HOSTS[:4] for g in range(2)]
    rates[3] = DeviceRate("node1", "cuda:1", "NVIDIA H100 80GB HBM3", 210.0, gpu=True)
    rates += [DeviceRate("node4", "cuda:0", "NVIDIA A100-SXM4-40GB", 250.0, gpu=True)]  # slower, but another model
    findings = compute_findings(HOSTS[:5], rates)
    found = warned(findings)
    assert list(found) == ["node1"]
    assert found["node1"][0].startswith("GPU 1: compute 3.3× below the median of its 7 peer(s) (210.0 TFLOP/s")
    assert any(f.host == "node4" and f.status is CheckStatus.INFO and "no peer of the same model" in f.message
               for f in findings)


def test_a_throttled_cpu_host_is_named_and_a_noisy_spread_is_not() -> None:
    rng = random.Random(3)
    rates = [DeviceRate(h, "cpu", "EPYC (2 threads)", 0.1 * (1 + rng.uniform(-0.3, 0.3))) for h in HOSTS]
    assert warned(compute_findings(HOSTS, rates)) == {}
    rates[6] = DeviceRate("node6", "cpu", "EPYC (2 threads)", 0.02)
    found = warned(compute_findings(HOSTS, rates))
    assert list(found) == ["node6"] and found["node6"][0].startswith("compute ")
    assert "GFLOP/s" in found["node6"][0]


def test_the_figures_of_one_run_map_ranks_to_hosts() -> None:
    figures: dict[str, Any] = {
        "backend": "gloo", "bytes": 2 << 20, "rounds": 3, "all_pairs": True,
        "compute": [{"rank": r, "device": "cpu", "gpu": None, "model": "cpu", "tflops": 0.1 if r != 2 else 0.01}
                    for r in range(4)],
        "links": [{"a": a, "b": b, "mbps": 5.0 if 1 in (a, b) else 900.0} for r in round_robin(4) for a, b in r],
    }
    found = warned(analyse(HOSTS[:4], figures))
    assert set(found) == {"node1", "node2"}
    assert found["node1"][0].startswith("every link") and found["node2"][0].startswith("compute")


def test_the_figures_table_shows_each_hosts_compute_and_link_range() -> None:
    from rich.console import Console

    from orchestrator.commands.doctor import render_deep

    figures: dict[str, Any] = {
        "hosts": ["node0", "node1", "node2"], "rounds": 3, "backend": "gloo",
        "compute": [{"rank": r, "tflops": t} for r, t in enumerate((0.18, 0.02, 2.5))],
        "links": [{"a": 0, "b": 1, "mbps": 2.5}, {"a": 0, "b": 2, "mbps": 1150.0}, {"a": 1, "b": 2, "mbps": 2.4}],
    }
    console = Console(record=True, width=120)
    render_deep(figures, console)
    text = console.export_text()
    assert "doctor --deep: 3 round(s), gloo" in text
    assert "node0 │ 180.0 GFLOP/s │ 2 .. 1,150 (2)" in text
    assert "node1 │ 20.0 GFLOP/s  │ 2 .. 2 (2)" in text
    assert "node2 │ 2.5 TFLOP/s" in text
