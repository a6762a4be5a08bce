"""doctor --deep's verdicts from figures (orchestrator/checks/links.py, compute.py, doctor/deep.py):
a slow host is told from a slow pair, a slow CPU explains its slow gloo links, a slow device is
compared with its own model only, and a healthy spread gives no warning."""

from __future__ import annotations

import random
from collections.abc import Sequence

from orchestrator.checks.compute import DeviceRate, compute_findings
from orchestrator.checks.links import LinkRate, LinkRounds, link_findings
from orchestrator.checks.model import CheckStatus, Finding
from orchestrator.doctor.deep import analyse
from train_jobs.hostcheck.figures import ComputeRow, DeepFigures, LinkRow, Missed, Phases
from train_jobs.hostcheck.schedule import round_robin
from train_jobs.hostcheck.verdict import Figure

HOSTS = [f"node{i}" for i in range(8)]


def rounds_of(rates: dict[tuple[int, int], float], all_pairs: bool = True, backend: str = "gloo",
              once: tuple[tuple[int, int], ...] = ()) -> LinkRounds:
    """`rates` as measured: every pair three times (a slow pair confirmed), but those in `once`."""
    return LinkRounds(tuple(LinkRate(HOSTS[a], HOSTS[b], v, 1 if (a, b) in once else 3) for (a, b), v in rates.items()),
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
    assert message.startswith("its links are ") and "× below the others' median (typically 24 MB/s vs " in message
    assert "7 of its 7 partners slow, 21 measurements" in message
    assert message.endswith("a degraded NIC or cable")


def test_one_slow_pair_between_fine_hosts_names_the_pair_on_both_hosts() -> None:
    rates = tournament()
    rates[(2, 5)] = 30.0
    found = warned(link_findings(HOSTS, rounds_of(rates)))
    assert set(found) == {"node2", "node5"}
    assert found["node2"][0].startswith("the link node2 <-> node5 is ")
    assert "node2 is at pace with its 6 other partner(s)" in found["node2"][0]
    assert "node5 with its 6" in found["node2"][0]
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


def cpu(rank: int, tflops: float) -> ComputeRow:
    return ComputeRow(rank, "cpu", None, "cpu", tflops)


def run_of(compute: Sequence[ComputeRow], links: Sequence[LinkRow], tested: Sequence[int], rounds: int = 3,
           all_pairs: bool = True, missed: Sequence[Missed] = (), hosts: Sequence[str] | None = None) -> DeepFigures:
    """The figures of one host check: 2 MiB exchanges over gloo."""
    return DeepFigures(2 << 20, 2, rounds, all_pairs, tuple(links), tuple(compute), tuple(tested), tuple(missed),
                       Phases(), "gloo", hosts=None if hosts is None else tuple(hosts))


def test_the_figures_of_one_run_map_ranks_to_hosts() -> None:
    figures = run_of([cpu(r, 0.1 if r != 2 else 0.01) for r in range(4)],
                     [LinkRow(a, b, Figure(5.0 if 1 in (a, b) else 900.0, 3)) for r in round_robin(4) for a, b in r],
                     tested=range(4))
    found = warned(analyse(HOSTS[:4], figures))
    assert set(found) == {"node1", "node2"}
    assert found["node1"][0].startswith("its links are") and found["node2"][0].startswith("compute")


def test_the_figures_table_shows_each_hosts_compute_and_link_range() -> None:
    from rich.console import Console

    from orchestrator.commands.doctor import render_deep

    figures = run_of([cpu(r, t) for r, t in enumerate((0.18, 0.02, 2.5))],
                     [LinkRow(0, 1, Figure(2.5)), LinkRow(0, 2, Figure(1150.0)), LinkRow(1, 2, Figure(2.4))],
                     tested=range(3), hosts=["node0", "node1", "node2"])
    console = Console(record=True, width=120)
    render_deep(figures, console)
    text = console.export_text()
    assert "doctor --deep: 3 round(s), gloo" in text
    assert "node0 │ 180.0 GFLOP/s │ 2.5 .. 1,150 (2)" in text
    assert "node1 │ 20.0 GFLOP/s  │ 2.4 .. 2.5 (2)" in text
    assert "node2 │ 2.5 TFLOP/s" in text


# -- the two runs of issue 45, with their numbers: node3's link at 40 Mbit/s (~5 MB/s), node5's
# sessions at 4 % of a core (its gloo links 21-23 MB/s with five peers, 580 MB/s with one, and its
# compute 149× below). The old rules named node1 (first run) or node2 and node7 (second run) too.
def starved_and_slow(fast_peer: int, seed: int) -> tuple[dict[tuple[int, int], float], list[DeviceRate]]:
    rng = random.Random(seed)
    rates = {p: 458.0 * (1 + rng.uniform(-0.25, 0.25)) for r in round_robin(8) for p in r}
    for p in rates:
        if 3 in p:
            rates[p] = 4.6 + rng.uniform(0, 0.4)
        elif 5 in p:
            rates[p] = 580.0 if fast_peer in p else 21.0 + rng.uniform(0, 2)
    devices = [DeviceRate(h, "cpu", "EPYC (2 threads)", 0.149 if h == "node5" else 0.15 * (1 + rng.uniform(-0.1, 0.1)))
               for h in HOSTS]
    devices[5] = DeviceRate("node5", "cpu", "EPYC (2 threads)", 0.001)
    return rates, devices


def test_the_issues_two_runs_name_node3_for_links_and_node5_for_compute_and_no_other_host() -> None:
    for fast_peer, seed in ((1, 1), (7, 2), (2, 3)):
        rates, devices = starved_and_slow(fast_peer, seed)
        links = link_findings(HOSTS, rounds_of(rates), slow_compute={"node5"})
        compute = compute_findings(HOSTS, devices)
        assert warned(links) == {"node3": [next(f.message for f in links if f.host == "node3")]}
        assert list(warned(compute)) == ["node5"]
        node5 = next(f for f in links if f.host == "node5")
        assert node5.status is CheckStatus.INFO and "its CPU is slow too" in node5.message
        node3 = next(f for f in links if f.host == "node3")
        assert node3.basis is not None and node3.basis.measurements == 21 and len(node3.basis.partners) == 7
        assert node3.basis.reference is not None and node3.basis.reference > 300


def test_the_old_rule_is_what_blamed_the_healthy_peer() -> None:
    """The figures above under the old slow-host rule (every link slow: its best) give node5 no
    host verdict, so its slow links became pairs on healthy peers; the typical link does not."""
    rates, _ = starved_and_slow(1, 1)
    own = [v for p, v in rates.items() if 5 in p]
    others = sorted(v for p, v in rates.items() if 5 not in p)
    assert max(own) * 5 > others[len(others) // 2], "its best link is at pace"
    assert sorted(own)[len(own) // 2] * 5 < others[len(others) // 2], "its typical link is not"


def test_a_slow_host_seen_in_one_round_only_is_in_doubt_not_blamed() -> None:
    rates = tournament()
    for p in rates:
        if 6 in p:
            rates[p] = 30.0
    findings = link_findings(HOSTS, rounds_of(rates, once=tuple(p for p in rates if 6 in p)))
    assert warned(findings) == {}
    (node6,) = [f for f in findings if f.host == "node6"]
    assert node6.status is CheckStatus.INFO and node6.message.startswith("in doubt")


def test_a_slow_pair_whose_end_is_slow_with_others_too_is_not_a_pair_verdict() -> None:
    rates = tournament()
    rates[(1, 4)] = 20.0
    rates[(4, 6)] = 20.0
    rates[(4, 7)] = 20.0  # node4: three slow links of seven: not a slow host, not at pace either
    findings = link_findings(HOSTS, rounds_of(rates))
    assert warned(findings) == {}, "no peer of node4 is blamed for node4's links"
    (node4,) = [f for f in findings if f.host == "node4"]
    assert node4.status is CheckStatus.INFO and node4.message.startswith("in doubt: slow with node1, node6, node7")


def test_a_host_late_for_its_compute_test_is_named_with_the_deadline_and_the_others_time() -> None:
    links = [LinkRow(a, b, Figure(900.0)) for a, b in ((0, 1), (0, 3), (1, 3))]
    figures = run_of([cpu(r, 0.1) for r in (0, 1, 3)], links, tested=(0, 1, 3), all_pairs=False,
                     missed=[Missed("compute", (2,), 12.0, 0.4)])
    findings = analyse(HOSTS[:4], figures)
    found = warned(findings)
    assert found == {"node2": ["did not finish its compute test in 12 s; the others took 0.4 s "
                               "(a starved or overloaded host)"]}
    assert any(f.host == "node2" and f.check == "links" and f.message.startswith("not measured") for f in findings)
