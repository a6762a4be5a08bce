"""[sync] without a cluster: the job file's table, which files go (exclude, .gitignore, .git/),
the node agent's manifest, and a real sync to a local directory through the same core `up` uses
(the pure diff: test_sync_diff.py; what the host made and the record: test_sync_record.py)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from inventory import ConfigError, Host, Inventory, Job, load_job
from inventory.specs import SyncSpec
from node_agent.ops.syncdest import manifest, unpack
from orchestrator.errors import HostsFailed
from orchestrator.launch import core
from orchestrator.launch.observer import Collected
from orchestrator.launch.options import LaunchOptions
from orchestrator.remote.pool import HostPool
from orchestrator.sync.core import HostSync, SyncPlanned, sync_job
from orchestrator.sync.diff import Manifest, diff
from orchestrator.sync.source import scan
from orchestrator.sync.text import sync_line
from tests.unit.test_launch_core import ScriptedBackend, make_job


def tree_at(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# -- the job file -------------------------------------------------------------------------------

def job_file(tmp_path: Path, sync: str) -> Path:
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "job.toml"
    path.write_text(f'[job]\nscript = "train.py"\n[sync]\n{sync}\n')
    return path


def test_sync_table_defaults_and_where_each_host_runs(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, ""))
    assert job.sync == SyncSpec(src=tmp_path.resolve())
    host = Host("h", "198.18.0.5")
    assert job.workdir_for(host) == str(tmp_path.resolve())  # the shared-filesystem layout
    assert job.workdir_for(replace(host, workdir="/scratch/p")) == "/scratch/p"
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.py").write_text("")
    (tmp_path / "jobs" / "job.toml").write_text('[job]\nscript = "train.py"\n[sync]\nsrc = ".."\ndest = "~/p"\n')
    nested = load_job(tmp_path / "jobs" / "job.toml")
    assert nested.sync is not None and nested.sync.src == tmp_path.resolve()
    assert nested.sync_root(host) == "~/p" and nested.workdir_for(host) == "~/p/jobs"  # the job file's dir inside


BAD = [
    ("delete = 1", "sync.delete", "expected true or false"),
    ('src = "nowhere"', "sync.src", "is not a directory"),
    ('exclude = "data/"', "sync.exclude", "expected an array of strings"),
    ('exclude = [""]', "sync.exclude[0]", "one non-empty line"),
    ('dest = " /x"', "sync.dest", "surrounding whitespace"),
    ("exlude = []", "sync.exlude", 'unknown key "exlude"'),
]


@pytest.mark.parametrize(("body", "key", "message"), BAD, ids=[b[1] for b in BAD])
def test_bad_sync_values_are_located(tmp_path: Path, body: str, key: str, message: str) -> None:
    path = job_file(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert info.value.key == key and message in info.value.message and info.value.file == path
    assert info.value.line is not None


# -- what goes ----------------------------------------------------------------------------------

def test_exclude_gitignore_and_git_dir(tmp_path: Path) -> None:
    src = tree_at(tmp_path / "p", {
        "train.py": "", ".gitignore": "*.ckpt\nlogs/\n!keep.ckpt\n", "a.ckpt": "", "keep.ckpt": "",
        "logs/x": "", "data/big": "", "pkg/.gitignore": "local.txt\n", "pkg/local.txt": "", "pkg/m.py": "",
        "local.txt": "", ".git/HEAD": "", "sub/.git": "gitfile", "runs/job/a.log": "",
        ".ddpctl-sync/0123.json": "{}",  # the source is itself a synced copy: its records stay
    })
    tree = scan(SyncSpec(src=src, exclude=("data/",)), keep_out=(src / "runs", tmp_path / "elsewhere"))
    assert set(tree.files) == {"train.py", ".gitignore", "keep.ckpt", "pkg/.gitignore", "pkg/m.py", "local.txt",
                               "sub/.git"}
    assert "logs" not in tree.dirs and ".git" not in tree.dirs and "runs" not in tree.dirs
    assert ".ddpctl-sync" not in tree.dirs
    everything = scan(SyncSpec(src=src, gitignore=False))
    assert {"a.ckpt", "logs/x", "pkg/local.txt", "data/big"} <= set(everything.files)
    assert not any(f.startswith(".git/") for f in everything.files)  # the repository itself never goes


def test_symlinks_to_files_send_the_file_and_links_to_directories_are_reported(tmp_path: Path) -> None:
    src = tree_at(tmp_path / "p", {"real.py": "x = 1\n", "d/f": ""})
    (src / "alias.py").symlink_to(src / "real.py")
    (src / "dlink").symlink_to(src / "d")
    (src / "dangling").symlink_to(src / "gone")
    tree = scan(SyncSpec(src=src))
    assert tree.files["alias.py"].size == 6 and "dangling" not in tree.files
    assert tree.skipped_links == ["dlink"]


# -- what a host needs --------------------------------------------------------------------------

def test_what_the_source_holds_but_does_not_send_is_never_removed(tmp_path: Path) -> None:
    """The host's copy may be the source itself (this machine, or a shared filesystem): links to
    directories, dangling links and other non-files there are the user's, not stale copies."""
    src = tree_at(tmp_path / "p", {"a.py": "", "d/f": ""})
    (src / "dlink").symlink_to(src / "d")
    (src / "dangling").symlink_to(src / "gone")
    tree = scan(SyncSpec(src=src))
    listed = Manifest.from_reply(manifest({"root": str(src)}, None))  # type: ignore[arg-type]
    changes = diff(tree, listed, delete=True, checksum=False)
    assert changes.empty and changes.unchanged == 2
    (src / "alias.py").symlink_to(src / "a.py")  # a link to a file: the host's copy is the source itself
    again = diff(scan(SyncSpec(src=src)), Manifest.from_reply(manifest({"root": str(src)}, None)),  # type: ignore[arg-type]
                 delete=True, checksum=False)
    assert again.empty and again.conflicts == () and again.unchanged == 3


# -- the node agent's side ----------------------------------------------------------------------

def test_manifest_lists_creates_and_refuses_a_file(tmp_path: Path) -> None:
    root = tree_at(tmp_path / "r", {"a.txt": "abc", "d/b": ""})
    (root / "ln").symlink_to(root / "a.txt")
    (root / "dl").symlink_to(root / "d")
    out = manifest({"root": str(root), "checksum": True}, None)  # type: ignore[arg-type]
    assert out["files"]["a.txt"][0] == 3 and out["files"]["a.txt"][3].startswith("ba7816bf")
    assert out["dirs"] == ["d"] and sorted(out["other"]) == ["dl", "ln"]
    fresh = manifest({"root": str(tmp_path / "new" / "x"), "create": True}, None)  # type: ignore[arg-type]
    assert fresh["exists"] and (tmp_path / "new" / "x").is_dir() and fresh["files"] == {}
    assert not manifest({"root": str(tmp_path / "absent")}, None)["exists"]  # type: ignore[arg-type]
    bad = manifest({"root": str(root / "a.txt"), "create": True}, None)  # type: ignore[arg-type]
    assert bad["exit_code"] == 2 and "is not a directory" in bad["error"]


# -- the core, for real, to a directory on this machine -------------------------------------------

def local_job(src: Path, dest: Path, spec: SyncSpec | None = None) -> Job:
    import sys
    host = Host("me", "127.0.0.1", python=sys.executable, workdir=str(dest))
    return Job(name="j", inventory=Inventory((host,)), hosts=(host,), script="train.py", base_dir=src,
               sync=spec or SyncSpec(src=src, exclude=("data/",)))


def test_sync_job_to_a_local_directory_is_incremental_and_atomic(tmp_path: Path) -> None:
    src = tree_at(tmp_path / "src", {"train.py": "print(1)\n", "m/util.py": "X = 1\n", "data/big": "zz",
                                     "odd name $(x);'\".py": "q"})
    dest = tmp_path / "dest"
    events: list[object] = []
    report = sync_job(local_job(src, dest), HostPool(), events.append)
    assert report.ok and report.files == 3
    assert (dest / "m" / "util.py").read_text() == "X = 1\n" and not (dest / "data").exists()
    assert (dest / "odd name $(x);'\".py").read_text() == "q"
    assert (dest / "train.py").stat().st_mtime == int((src / "train.py").stat().st_mtime)
    assert not list(dest.rglob(".*.ddpctl-*"))  # no temporary file left
    planned = [e for e in events if isinstance(e, SyncPlanned)]
    assert len(planned) == 1 and planned[0].root == str(dest) and len(planned[0].changes.send) == 3

    (src / "m" / "util.py").unlink()
    (src / "m").rmdir()
    (dest / "data").mkdir()
    (dest / "data" / "mine").write_text("kept")
    again = sync_job(local_job(src, dest), HostPool())
    result = again.synced["me"]
    assert result.changes.send == () and result.changes.remove == ("m/util.py",) and result.removed_dirs == 1
    assert not (dest / "m").exists() and (dest / "data" / "mine").read_text() == "kept"
    assert sync_line(result) is not None and "1 removed" in str(sync_line(result))


def test_a_script_left_out_of_the_sync_is_a_config_error(tmp_path: Path) -> None:
    src = tree_at(tmp_path / "src", {"train.py": ""})
    job = local_job(src, tmp_path / "dest", SyncSpec(src=src, exclude=("train.py",)))
    with pytest.raises(ConfigError, match="left out of the sync") as info:
        sync_job(job, HostPool())
    assert info.value.key == "sync.exclude"
    assert not (tmp_path / "dest").exists()  # checked before any host is touched


def test_sync_dry_run_touches_nothing(tmp_path: Path) -> None:
    src = tree_at(tmp_path / "src", {"train.py": ""})
    report = sync_job(local_job(src, tmp_path / "dest"), HostPool(), dry_run=True)
    assert report.synced["me"].dry_run and report.synced["me"].changes.send == ("train.py",)
    assert not (tmp_path / "dest").exists()


# -- the launch core runs it first ----------------------------------------------------------------

class SyncingBackend(ScriptedBackend):
    def __init__(self, report: object) -> None:
        super().__init__(lambda _b, emit: [emit(e) for e in ()])  # never started in these tests
        self.report = report
        self.synced_with: LaunchOptions | None = None

    def sync(self, job: Job, options: LaunchOptions, progress: object) -> object:
        self.synced_with = options
        return self.report


def test_the_launch_syncs_before_planning_and_a_failed_host_stops_it(tmp_path: Path) -> None:
    from orchestrator.errors import HostError, HostErrorKind
    from orchestrator.sync.core import SyncReport

    job = replace(make_job(), sync=SyncSpec(src=tmp_path))
    failed = SyncReport(tmp_path, 1, 1, failed={"b": HostError("b", HostErrorKind.SYNC, "disk full")})
    backend = SyncingBackend(failed)
    out = Collected()
    with pytest.raises(HostsFailed) as info:
        core.launch(job, backend, out, LaunchOptions(runs_dir=tmp_path))
    assert info.value.step == "sync" and info.value.errors[0].host == "b"
    assert backend.plan is None and out.plan is None  # nothing was planned or started

    skipped = SyncingBackend(failed)
    with pytest.raises(HostsFailed):  # detach syncs too
        core.detach(job, skipped, Collected(), LaunchOptions(runs_dir=tmp_path))
    not_applicable = SyncingBackend(None)
    core.sync_code(job, not_applicable, out, LaunchOptions(runs_dir=tmp_path))
    assert any("does not apply to the scripted backend" in n for n in out.notices)
    off = SyncingBackend(failed)
    core.sync_code(job, off, out, LaunchOptions(runs_dir=tmp_path, sync=False))
    assert off.synced_with is None and any("--no-sync" in n for n in out.notices)


def test_plain_lines_for_a_host(tmp_path: Path) -> None:
    src = tree_at(tmp_path / "src", {"train.py": "x"})
    report = sync_job(local_job(src, tmp_path / "dest"), HostPool())
    done: HostSync = report.synced["me"]
    assert sync_line(done) == f"sync me: 1 file (1 B) sent, 0 unchanged in {done.duration_s:.1f}s ({tmp_path / 'dest'})"
    up_to_date = sync_job(local_job(src, tmp_path / "dest"), HostPool()).synced["me"]
    assert "up to date (1 file)" in str(sync_line(up_to_date))


# -- many files: one tar bundle, landed by the node agent ---------------------------------------

def test_many_files_go_as_one_bundle_with_modes_and_mtimes(tmp_path: Path) -> None:
    files = {f"pkg{i % 3}/m{i}.py": f"X = {i}\n" for i in range(40)}
    src = tree_at(tmp_path / "src", {"train.py": "", **files})
    os.chmod(src / "pkg0" / "m0.py", 0o750)
    os.utime(src / "pkg1" / "m1.py", (1_600_000_000, 1_600_000_000))
    events: list[object] = []
    report = sync_job(local_job(src, tmp_path / "dest"), HostPool(), events.append)
    assert report.ok
    dest = tmp_path / "dest"
    assert all((dest / rel).read_text() == text for rel, text in files.items())
    assert (dest / "pkg0" / "m0.py").stat().st_mode & 0o777 == 0o750
    assert (dest / "pkg1" / "m1.py").stat().st_mtime == 1_600_000_000
    leftovers = [p for p in dest.rglob("*") if "ddpctl" in p.name and ".ddpctl-sync" not in p.parts]
    assert leftovers == [] and len(list((dest / ".ddpctl-sync").glob("*.json"))) == 1  # no bundle nor temp file
    from orchestrator.sync.core import SyncSent
    sent = [e for e in events if isinstance(e, SyncSent)]
    assert sum(e.files for e in sent) == 41 and any(e.path.startswith(".ddpctl-bundle-") for e in sent)
    assert sum(e.nbytes for e in sent) == pytest.approx(report.total_bytes, abs=8)


def test_unpack_refuses_members_outside_the_root_and_always_removes_the_archive(tmp_path: Path) -> None:
    import io
    import tarfile

    root = tmp_path / "root"
    root.mkdir()

    def archive(name: str, members: dict[str, bytes]) -> str:
        with tarfile.open(root / name, "w") as tar:
            for member, data in members.items():
                info = tarfile.TarInfo(member)
                info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
                tar.addfile(info, io.BytesIO(data))
        return name

    missing = unpack({"root": str(root), "archive": archive("a.tar", {"x/y.txt": b"hi"})}, None)  # type: ignore[arg-type]
    assert "No such file or directory" in missing["error"] and missing["errno"] == "ENOENT"  # the sender makes x/
    assert not (root / "a.tar").exists()
    (root / "x").mkdir()
    ok = unpack({"root": str(root), "archive": archive("b.tar", {"x/y.txt": b"hi"})}, None)  # type: ignore[arg-type]
    assert ok["files"] == 1 and (root / "x" / "y.txt").read_bytes() == b"hi"
    for bad in ("../evil", "/etc/evil", "x/../../evil"):
        with pytest.raises(ValueError, match="outside"):
            unpack({"root": str(root), "archive": archive("c.tar", {bad: b"no"})}, None)  # type: ignore[arg-type]
        assert not (root / "c.tar").exists()
    assert not (tmp_path / "evil").exists()
    with pytest.raises(ValueError, match="outside"):
        unpack({"root": str(root), "archive": "../elsewhere.tar"}, None)  # type: ignore[arg-type]
    assert sorted(p.name for p in root.rglob("*")) == ["x", "y.txt"]


def test_the_terminal_view_counts_files_and_bytes_per_host_and_prints_done_lines(tmp_path: Path) -> None:
    from orchestrator.commands.sync_view import SyncView
    from orchestrator.sync.core import SyncSent
    from orchestrator.sync.diff import Changes

    changes = Changes(send=("a", "b", "c"), send_bytes=3 << 20, unchanged=2)
    live = SyncView(live=True)
    assert live.update(SyncPlanned("n0", "/r", changes)) is None  # the live line shows it
    live.update(SyncSent("n0", "a", 1 << 20, 0))
    live.update(SyncSent("n0", "a", 0, 1))
    assert "1/3 files 1.0 MiB/3.0 MiB" in live.status().plain
    done = live.update(HostSync("n0", "/r", changes, 0, 1.5))
    assert done == "sync n0: 3 files (3.0 MiB) sent, 2 unchanged in 1.5s (/r)"
    assert live.status().plain == ""  # a finished host leaves the live line
    plain = SyncView(live=False)
    assert plain.update(SyncPlanned("n0", "/r", changes)) == "sync n0: 3 files (3.0 MiB) to send, 0 to remove -> /r"
    assert plain.update(SyncPlanned("n1", "/r", Changes(unchanged=5))) is None  # "up to date" comes when done
