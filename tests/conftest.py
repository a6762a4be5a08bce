"""Shared pytest fixtures: the real namespace cluster (its logic lives in tests/cluster.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `tests.cluster` and the project packages import from the root
    sys.path.insert(0, str(ROOT))

from tests.cluster import Cluster, ClusterError, require_cluster, start_cluster  # noqa: E402
from tests.slurm_cluster import SlurmCluster, require_slurm, start_slurm_cluster  # noqa: E402


@pytest.fixture(autouse=True)
def private_host_ledger(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own host ledger (orchestrator/hostops/ledger.py), never the user's: the tests
    kill hosts of shared clusters all the time, and a shared ledger would quarantine them for the
    next test. `ddpctl` subprocesses inherit DDPCTL_STATE_DIR."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("DDPCTL_STATE_DIR", str(state))
    return state


@pytest.fixture
def cluster_available() -> None:
    """For tests that call start_cluster themselves: skip (or fail) like the cluster fixtures."""
    require_cluster()


@pytest.fixture(scope="session")
def cluster2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two hosts shared by the whole session: read-only use; inject faults via make_cluster."""
    require_cluster()
    with start_cluster(2, tmp_path_factory.mktemp("cluster2")) as cluster:
        yield cluster


@pytest.fixture
def make_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[int], Cluster]]:
    """A factory of fresh clusters for one test, all torn down when it ends."""
    started: list[Cluster] = []

    def make(n: int, resolvable: bool | Collection[int] = ()) -> Cluster:
        require_cluster()
        started.append(start_cluster(n, tmp_path_factory.mktemp(f"cluster{n}-"), resolvable=resolvable))
        return started[-1]

    yield make
    errors = []
    for cluster in reversed(started):
        try:
            cluster.teardown()
        except ClusterError as err:
            errors.append(str(err))
    if errors:
        pytest.fail("; ".join(errors), pytrace=False)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real Slurm cluster (login node + 2 compute nodes, all idle) shared by the session."""
    require_slurm()
    with start_slurm_cluster(2, tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
