"""Unit tests of the train jobs' pure pieces: env parsing, device/backend/AMP choice, bandwidth
maths, size series, accumulation schedule, atomic checkpoints and the data loaders."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from train_jobs import common  # noqa: E402
from train_jobs.allreduce_bench import bench  # noqa: E402
from train_jobs.image_classifier import checkpoint, data  # noqa: E402
from train_jobs.image_classifier.train import is_step_batch  # noqa: E402

pytestmark = pytest.mark.torch

TORCHRUN_ENV = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "198.18.0.11",
    "MASTER_PORT": "29500",
}


def test_read_dist_env_parses_torchrun_variables() -> None:
    env = common.read_dist_env(TORCHRUN_ENV)
    assert env == common.DistEnv(
        rank=3,
        local_rank=1,
        world_size=4,
        local_world_size=2,
        node_rank=1,
        master_addr="198.18.0.11",
        master_port=29500,
    )


def test_read_dist_env_names_missing_variables_and_torchrun() -> None:
    partial = {k: v for k, v in TORCHRUN_ENV.items() if k not in ("RANK", "MASTER_PORT")}
    with pytest.raises(common.LaunchError, match=r"RANK, MASTER_PORT.*torchrun"):
        common.read_dist_env(partial)


def test_read_dist_env_rejects_non_integer_rank() -> None:
    with pytest.raises(common.LaunchError, match="RANK='x'"):
        common.read_dist_env({**TORCHRUN_ENV, "RANK": "x"})


def test_read_dist_env_defaults_node_rank_and_local_world_size() -> None:
    env = {k: v for k, v in TORCHRUN_ENV.items() if k not in ("GROUP_RANK", "LOCAL_WORLD_SIZE")}
    parsed = common.read_dist_env(env)
    assert (parsed.node_rank, parsed.local_world_size) == (0, 4)


@pytest.mark.parametrize(
    ("local_rank", "cuda", "count", "expected"),
    [(0, False, 0, "cpu"), (1, False, 8, "cpu"), (0, True, 0, "cpu"), (3, True, 4, "cuda:3")],
)
def test_select_device(local_rank: int, cuda: bool, count: int, expected: str) -> None:
    assert common.select_device(local_rank, cuda, count) == torch.device(expected)


def test_select_device_refuses_local_rank_beyond_visible_gpus() -> None:
    with pytest.raises(common.LaunchError, match="only 2 GPU"):
        common.select_device(2, True, 2)


def test_select_backend_is_nccl_only_for_cuda() -> None:
    assert common.select_backend(torch.device("cuda", 0)) == "nccl"
    assert common.select_backend(torch.device("cpu")) == "gloo"


@pytest.mark.parametrize(
    ("mode", "enabled", "dtype", "scaler"),
    [
        ("off", False, torch.float32, False),
        ("bf16", True, torch.bfloat16, False),
        ("fp16", True, torch.float16, True),
    ],
)
def test_select_amp(mode: str, enabled: bool, dtype: object, scaler: bool) -> None:
    assert common.select_amp(mode, "cpu") == common.AmpPlan(enabled, dtype, scaler)


def test_select_amp_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="off, bf16, fp16"):
        common.select_amp("fp8", "cuda")


def test_sync_bn_only_on_cuda() -> None:
    assert common.sync_bn_supported("cuda")
    assert not common.sync_bn_supported("cpu")


def test_threads_per_rank_never_below_one() -> None:
    assert common.threads_per_rank(16, 4) == 4
    assert common.threads_per_rank(2, 4) == 1


def test_checksum_is_order_sensitive() -> None:
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert common.checksum(a) != common.checksum(a.flip(0))
    assert common.checksum(a) == common.checksum(a.clone())


@pytest.mark.parametrize(("n", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_bus_factor_matches_nccl_tests(n: int, factor: float) -> None:
    assert bench.bus_factor(n) == factor


def test_busbw_equals_algbw_for_two_ranks() -> None:
    result = bench.make_result(size_bytes=1 << 20, count=1 << 18, seconds=0.001, world_size=2)
    assert result.algbw_gbps == pytest.approx(1.048576)
    assert result.busbw_gbps == result.algbw_gbps
    assert result.time_us == pytest.approx(1000.0)


def test_busbw_scales_with_world_size() -> None:
    assert bench.busbw_gbps(2.0, 4) == 3.0


@pytest.mark.parametrize(("text", "value"), [("4096", 4096), ("1K", 1024), ("256M", 256 << 20), ("1GiB", 1 << 30)])
def test_parse_size(text: str, value: int) -> None:
    assert bench.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "abc", "0", "-1K"])
def test_parse_size_rejects_bad_input(text: str) -> None:
    with pytest.raises(Exception, match="size"):
        bench.parse_size(text)


def test_size_series_doubles_and_includes_both_ends() -> None:
    assert bench.size_series(1024, 8192, 4) == [1024, 2048, 4096, 8192]
    assert bench.size_series(1, 8, 4) == [4, 8]


def test_is_step_batch_steps_every_accum_and_on_the_last_batch() -> None:
    steps = [i for i in range(7) if is_step_batch(i, 7, 3)]
    assert steps == [2, 5, 6]
    assert all(is_step_batch(i, 5, 1) for i in range(5))


def test_save_atomic_replaces_and_leaves_no_temp_file(tmp_path: Path) -> None:
    checkpoint.save_atomic({"epoch": 1}, tmp_path)
    checkpoint.save_atomic({"epoch": 2}, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    loaded = checkpoint.load_last(tmp_path)
    assert loaded is not None and loaded["epoch"] == 2


def test_load_last_is_none_without_checkpoint(tmp_path: Path) -> None:
    assert checkpoint.load_last(tmp_path) is None


def test_save_atomic_keeps_the_replaced_file_as_previous(tmp_path: Path) -> None:
    checkpoint.save_atomic({"epoch": 1}, tmp_path, previous=checkpoint.PREV)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # nothing to keep yet
    checkpoint.save_atomic({"epoch": 2}, tmp_path, previous=checkpoint.PREV)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "prev.pt"]
    assert torch.load(tmp_path / "prev.pt", weights_only=False)["epoch"] == 1
    assert torch.load(tmp_path / "last.pt", weights_only=False)["epoch"] == 2


class _DiesMidSave:
    def __reduce__(self) -> tuple[object, ...]:
        raise OSError("no space left on device")


def test_a_failed_save_leaves_last_and_prev_untouched(tmp_path: Path) -> None:
    checkpoint.save_atomic({"epoch": 1}, tmp_path, previous=checkpoint.PREV)
    checkpoint.save_atomic({"epoch": 2}, tmp_path, previous=checkpoint.PREV)
    with pytest.raises(OSError, match="no space left"):  # dies while writing, like a host killed mid-save
        checkpoint.save_atomic({"epoch": 3, "x": _DiesMidSave()}, tmp_path, previous=checkpoint.PREV)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "prev.pt"]  # no temp file left
    found = checkpoint.load_latest(tmp_path, warn=pytest.fail)
    assert found is not None and (found[0].name, found[1]["epoch"]) == ("last.pt", 2)


@pytest.mark.parametrize("torn", [b"", b"PK\x03\x04 not a whole zip", b"\x80\x04garbage"])
def test_load_latest_skips_a_corrupt_newest_checkpoint_for_the_older_one(tmp_path: Path, torn: bytes) -> None:
    checkpoint.save_atomic({"epoch": 1}, tmp_path, previous=checkpoint.PREV)
    checkpoint.save_atomic({"epoch": 2}, tmp_path, previous=checkpoint.PREV)
    (tmp_path / "last.pt").write_bytes(torn)
    warnings: list[str] = []
    found = checkpoint.load_latest(tmp_path, warn=warnings.append)
    assert found is not None
    path, state = found
    assert (path, state["epoch"]) == (tmp_path / "prev.pt", 1)
    assert len(warnings) == 1
    assert warnings[0].startswith(f"checkpoint: warning: {tmp_path / 'last.pt'} is unreadable (")
    assert warnings[0].endswith(f"; using {tmp_path / 'prev.pt'}")


def test_load_latest_uses_prev_when_a_save_was_interrupted_between_its_renames(tmp_path: Path) -> None:
    checkpoint.save_atomic({"epoch": 1}, tmp_path, previous=checkpoint.PREV)
    checkpoint.save_atomic({"epoch": 2}, tmp_path, previous=checkpoint.PREV)
    (tmp_path / "last.pt").replace(tmp_path / "prev.pt")  # killed after this rename, before the new last.pt
    warnings: list[str] = []
    found = checkpoint.load_latest(tmp_path, warn=warnings.append)
    assert found is not None and (found[0].name, found[1]["epoch"]) == ("prev.pt", 2)
    assert warnings == [f"checkpoint: warning: {tmp_path / 'last.pt'} is missing (a save was interrupted?); "
                        f"using {tmp_path / 'prev.pt'}"]


def test_load_latest_skips_a_file_that_is_no_checkpoint(tmp_path: Path) -> None:
    checkpoint.save_atomic({"epoch": 1}, tmp_path, previous=checkpoint.PREV)
    checkpoint.save_atomic([1, 2], tmp_path, previous=checkpoint.PREV)  # type: ignore[arg-type]
    warnings: list[str] = []
    found = checkpoint.load_latest(tmp_path, warn=warnings.append)
    assert found is not None and found[1] == {"epoch": 1}
    assert len(warnings) == 1 and "holds a list, not a checkpoint" in warnings[0]


def test_load_latest_with_a_run_id_skips_checkpoints_of_other_runs(tmp_path: Path) -> None:
    checkpoint.save_atomic({"epoch": 1, "run_id": "a"}, tmp_path, previous=checkpoint.PREV)
    checkpoint.save_atomic({"epoch": 2, "run_id": "b"}, tmp_path, previous=checkpoint.PREV)
    warnings: list[str] = []
    found = checkpoint.load_latest(tmp_path, warn=warnings.append, run_id="a")
    assert found is not None and (found[0].name, found[1]["epoch"]) == ("prev.pt", 1)
    assert warnings == [f"checkpoint: warning: {tmp_path / 'last.pt'} was saved by run b, not by this run a; "
                        f"using {tmp_path / 'prev.pt'}"]
    assert checkpoint.load_latest(tmp_path, warn=warnings.append, run_id="c") is None
    found = checkpoint.load_latest(tmp_path, warn=pytest.fail)  # no run_id: any run's
    assert found is not None and found[1]["epoch"] == 2


def test_load_latest_is_none_with_a_warning_when_nothing_is_readable(tmp_path: Path) -> None:
    (tmp_path / "last.pt").write_bytes(b"torn")
    warnings: list[str] = []
    assert checkpoint.load_latest(tmp_path, warn=warnings.append) is None
    assert len(warnings) == 1 and warnings[0].endswith("no older checkpoint to fall back to")
    assert checkpoint.load_latest(tmp_path / "absent", warn=pytest.fail) is None  # nothing there: no warning


def test_load_last_falls_back_to_prev(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint.save_atomic({"epoch": 1}, tmp_path, previous=checkpoint.PREV)
    checkpoint.save_atomic({"epoch": 2}, tmp_path, previous=checkpoint.PREV)
    (tmp_path / "last.pt").write_bytes(b"torn")
    loaded = checkpoint.load_last(tmp_path)
    assert loaded is not None and loaded["epoch"] == 1
    assert "checkpoint: warning: " in capsys.readouterr().out


def test_rng_state_roundtrip_reproduces_draws() -> None:
    state = checkpoint.rng_state()
    first = torch.rand(4)
    checkpoint.set_rng_state(state)
    assert torch.equal(torch.rand(4), first)


def test_synthetic_data_is_deterministic_and_cifar_shaped() -> None:
    a = data.synthetic_splits(64, 16, seed=7)
    b = data.synthetic_splits(64, 16, seed=7)
    assert a.train.tensors[0].shape == (64, 3, 32, 32)
    assert torch.equal(a.train.tensors[0], b.train.tensors[0])
    assert torch.equal(a.test.tensors[1], b.test.tensors[1])
    assert int(a.train.tensors[1].max()) < data.NUM_CLASSES


def _write_fake_cifar(folder: Path, per_batch: int) -> None:
    np = pytest.importorskip("numpy")
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
            b"labels": [int(x) for x in rng.integers(0, 10, size=per_batch)],
        }
        with (folder / name).open("wb") as f:
            pickle.dump(batch, f)


def test_load_splits_reads_cifar_pickles_when_present(tmp_path: Path) -> None:
    _write_fake_cifar(tmp_path / data.CIFAR_DIRNAME, per_batch=4)
    splits = data.load_splits(str(tmp_path), train_size=10, test_size=3, seed=0)
    assert splits.source.startswith("cifar10(")
    assert splits.train.tensors[0].shape == (10, 3, 32, 32)
    assert splits.test.tensors[1].shape == (3,)


def test_load_splits_falls_back_to_synthetic_without_pickles(tmp_path: Path) -> None:
    splits = data.load_splits(str(tmp_path), train_size=8, test_size=4, seed=0)
    assert splits.source.startswith("synthetic")
