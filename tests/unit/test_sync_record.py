"""[sync] loses nothing, for real on this machine (the same core `up` uses, to a local directory):
what the host made survives every sync, what an earlier sync put there and the source dropped goes,
the record the node agent keeps in the copy, and a host that cannot be written named in the OS's
words (the transport seam answers like the node agent where a real failure needs a mount)."""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from inventory import Host
from inventory.specs import SyncSpec
from node_agent.ops import syncdest
from node_agent.ops.syncdest import manifest, unpack
from node_agent.wire.layout import SYNC_RECORD_DIR as RECORD_DIR
from node_agent.wire.protocol import EVENT_PREFIX, RESULT_PREFIX
from orchestrator.errors import HostError
from orchestrator.remote.pool import HostPool
from orchestrator.sync.core import HostSync, sync_job
from orchestrator.sync.diff import Changes, Conflict, Manifest, Owned, Why
from orchestrator.sync.failures import cannot_write, explain, no_room
from orchestrator.sync.text import sync_line
from orchestrator.sync.transfer import TransferError
from tests.unit.test_sync import local_job, tree_at

HOST_MADE = {"outputs/model.ckpt": "weights", "pkg/__pycache__/util.cpython-311.pyc": "pyc",
             "checkpoints/last.pt": "epoch 3", "logs/run.log": "line"}


def sync(src: Path, dest: Path, **kwargs: Any) -> HostSync:
    report = sync_job(local_job(src, dest, SyncSpec(src=src)), HostPool(), **kwargs)
    assert report.ok, report.failed
    return report.synced["me"]


def files_under(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*")
            if p.is_file() and RECORD_DIR not in p.parts}


def the_record(dest: Path) -> dict[str, Any]:
    (path,) = (dest / RECORD_DIR).glob("*.json")
    return dict(json.loads(path.read_text()))


def test_what_the_host_made_survives_every_sync_and_what_the_source_dropped_goes(tmp_path: Path) -> None:
    src = tree_at(tmp_path / "src", {"train.py": "t", "pkg/util.py": "u", "pkg/old.py": "o", "gone/x.py": "x",
                                     "b.py": "b", "c.py": "c", "d.py": "d"})
    dest = tmp_path / "dest"
    sync(src, dest)
    for rel, text in HOST_MADE.items():
        tree_at(dest, {rel: text})
    for rel in ("pkg/old.py", "gone/x.py", "b.py", "c.py"):
        (src / rel).unlink()
    (src / "gone").rmdir()
    done = sync(src, dest)
    assert sorted(done.changes.remove) == ["b.py", "c.py", "gone/x.py", "pkg/old.py"] and done.removed_dirs == 1
    line = str(sync_line(done))
    assert "removed 4 files no longer in the source: b.py, c.py, gone/x.py (+1 more)" in line, line
    assert "kept 4 files the host made" in line, line
    for _ in range(3):
        again = sync(src, dest)
        assert again.changes.empty and again.changes.remove == () and again.changes.owned is None
    assert files_under(dest) == {**HOST_MADE, "train.py": "t", "pkg/util.py": "u", "d.py": "d"}
    assert not (dest / "gone").exists() and (dest / "pkg" / "__pycache__").is_dir()


def test_a_dry_run_lists_the_same_removals_and_writes_nothing(tmp_path: Path) -> None:
    src = tree_at(tmp_path / "src", {"train.py": "t", "a.py": "a"})
    dest = tmp_path / "dest"
    sync(src, dest)
    before = (dest / RECORD_DIR).stat().st_mtime_ns, the_record(dest)
    (src / "a.py").unlink()
    dry = sync(src, dest, dry_run=True)
    assert "would remove 1 file no longer in the source: a.py" in str(sync_line(dry))
    assert (dest / "a.py").exists() and ((dest / RECORD_DIR).stat().st_mtime_ns, the_record(dest)) == before


def test_the_host_keeps_a_file_it_made_where_the_source_later_has_one(tmp_path: Path) -> None:
    src = tree_at(tmp_path / "src", {"train.py": "t"})
    dest = tmp_path / "dest"
    sync(src, dest)
    tree_at(dest, {"results.json": "the host's"})
    tree_at(src, {"results.json": "this machine's"})
    done = sync(src, dest)
    assert done.changes.conflicts == (Conflict("results.json", Why.CREATED),)
    assert (dest / "results.json").read_text() == "the host's"
    line = str(sync_line(done))
    assert "not overwritten, the host's own: results.json (created on the host)" in line, line
    assert done.to_json()["conflicts"] == [{"path": "results.json", "why": "created on the host"}]
    (dest / "results.json").unlink()  # the fix the line gives
    assert sync(src, dest).changes.send == ("results.json",) and (dest / "results.json").read_text() == "this machine's"


def test_a_copy_without_a_record_loses_nothing(tmp_path: Path) -> None:
    """An older ddpctl's copy: the source's files are written (unless the host's is newer), the
    rest is kept, and from then on the record decides."""
    src = tree_at(tmp_path / "src", {"train.py": "new", "ckpt.pt": "local"})
    dest = tree_at(tmp_path / "dest", {"train.py": "old", "stale.py": "s", "ckpt.pt": "the host's run"})
    os.utime(dest / "train.py", (1_600_000_000, 1_600_000_000))
    later = (src / "ckpt.pt").stat().st_mtime + 60  # the host's run wrote it after this machine's
    os.utime(dest / "ckpt.pt", (later, later))
    done = sync(src, dest)
    assert done.changes.remove == () and done.changes.send == ("train.py",)
    assert done.changes.conflicts == (Conflict("ckpt.pt", Why.NEWER),)
    assert files_under(dest) == {"train.py": "new", "stale.py": "s", "ckpt.pt": "the host's run"}
    assert sorted(the_record(dest)["files"]) == ["train.py"]


def test_the_record_is_written_atomically_beside_the_copy_and_never_synced(tmp_path: Path) -> None:
    src = tree_at(tmp_path / "src", {"train.py": "t", "d/e/f.py": "f"})
    dest = tmp_path / "dest"
    sync(src, dest)
    record = the_record(dest)
    assert record["source"] == str(src) and record["dirs"] == ["d", "d/e"]
    st = (dest / "d" / "e" / "f.py").stat()
    assert record["files"]["d/e/f.py"] == [st.st_size, int(st.st_mtime)]
    assert os.listdir(dest / RECORD_DIR) == [Path(syncdest.record_path(str(dest), str(src))).name]  # no temp file
    itself = sync(src, src)  # the host's copy is the source itself: its record stays out of the source
    assert itself.changes.empty and (src / RECORD_DIR).is_dir()
    assert sync(src, src).changes.owned is None and RECORD_DIR not in str(sync_line(itself))


def test_two_sources_syncing_one_root_remove_only_their_own(tmp_path: Path) -> None:
    a = tree_at(tmp_path / "a", {"train.py": "a", "a.py": "a", "shared.py": "s"})
    b = tree_at(tmp_path / "b", {"train.py": "a", "b.py": "b", "shared.py": "s"})
    dest = tmp_path / "dest"
    sync(a, dest)
    os.utime(b / "shared.py", (os.stat(a / "shared.py").st_mtime,) * 2)
    os.utime(b / "train.py", (os.stat(a / "train.py").st_mtime,) * 2)
    assert sync(b, dest).changes.remove == ()  # a.py is a's
    for rel in ("a.py", "shared.py"):
        (a / rel).unlink()
    assert sync(a, dest).changes.remove == ("a.py",)  # shared.py is b's too
    assert set(files_under(dest)) == {"train.py", "b.py", "shared.py"}
    assert len(list((dest / RECORD_DIR).glob("*.json"))) == 2


# -- the node agent's side -------------------------------------------------------------------------

def test_manifest_lists_records_and_not_their_folder(tmp_path: Path) -> None:
    root = tree_at(tmp_path / "r", {"a.py": "a"})
    assert unpack({"root": str(root), "record": {"source": "/s", "files": ["a.py", "gone.py"], "dirs": []}},
                  None)["recorded"] == 1  # type: ignore[arg-type]
    (root / RECORD_DIR / "broken.json").write_text("{not json")
    out = manifest({"root": str(root)}, None)  # type: ignore[arg-type]
    assert set(out["files"]) == {"a.py"} and out["dirs"] == [] and out["free_bytes"] > 0
    assert out["records"] == [{"source": "/s", "files": {"a.py": [1, int((root / "a.py").stat().st_mtime)]},
                               "dirs": []}]  # the broken one counts as absent: nothing is removed for it


@pytest.mark.parametrize(("code", "words"), [(errno.EROFS, "Read-only file system"),
                                             (errno.ENOSPC, "No space left on device")])
def test_manifest_says_why_the_copy_cannot_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      code: int, words: str) -> None:
    def refuse(path: str, *args: object, **kwargs: object) -> object:
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(syncdest, "open", refuse, raising=False)  # the agent's writes, as the OS refuses them
    out = manifest({"root": str(tmp_path), "create": True}, None)  # type: ignore[arg-type]
    assert "error" not in out and out["exists"]  # listed all the same: an up-to-date copy needs no write
    why = out["unwritable"]
    assert why["error"] == f"cannot write to {tmp_path}: {words}" and why["errno"] == errno.errorcode[code]
    assert why["path"] == str(tmp_path)
    probe = unpack({"root": str(tmp_path), "probe": "pkg/sub"}, None)["probe"]  # type: ignore[arg-type]
    assert probe["error"] == f"cannot write to {tmp_path}: {words}"  # the nearest directory that exists
    monkeypatch.undo()
    assert unpack({"root": str(tmp_path), "probe": ""}, None)["probe"] is None  # type: ignore[arg-type]


def test_a_bundle_that_cannot_land_names_the_file_not_its_temporary_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tarfile

    (tmp_path / "pkg").mkdir()
    with tarfile.open(tmp_path / "b.tar", "w") as tar:
        info = tarfile.TarInfo("pkg/m.py")
        info.size = 0
        tar.addfile(info)

    def full(path: str, mode: str = "r", *args: object, **kwargs: object) -> object:
        if "w" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return open(path, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(syncdest, "open", full, raising=False)
    out = unpack({"root": str(tmp_path), "archive": "b.tar"}, None)  # type: ignore[arg-type]
    assert out["error"] == f"cannot write to {tmp_path}/pkg/m.py: No space left on device"
    assert not (tmp_path / "b.tar").exists() and os.listdir(tmp_path / "pkg") == []


PY38 = next((str(p) for p in sorted(Path("/root/.pyenv/versions").glob("3.8*/bin/python3.8"))), None)


@pytest.mark.skipif(PY38 is None, reason="no python3.8 on this machine")
def test_the_record_ops_run_on_python_3_8(tmp_path: Path) -> None:
    from orchestrator.remote.agent import call_agent
    from orchestrator.remote.transport import LocalTransport

    t = LocalTransport(Host("me", "127.0.0.1", python=str(PY38)))
    root = tree_at(tmp_path / "r", {"a.py": "a"})
    assert call_agent(t, "manifest", {"root": str(root), "create": True}).result["records"] == []
    assert call_agent(t, "unpack", {"root": str(root), "probe": "", "record": {
        "source": "/s", "files": ["a.py"], "dirs": []}}).result["recorded"] == 1
    assert call_agent(t, "manifest", {"root": str(root)}).result["records"][0]["source"] == "/s"


# -- a failed write, in the OS's words ---------------------------------------------------------------

class Answering:
    """The transport seam: every command answers with this node agent result (or raises)."""

    def __init__(self, result: Mapping[str, Any] | HostError) -> None:
        self.host = Host("node1", "198.18.0.12", python=sys.executable)
        self.result = result
        self.requests: list[dict[str, Any]] = []

    def start(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Answered:
        self.requests.append(json.loads((stdin or b"{}")[(stdin or b"").rfind(b'{"op"'):]))
        if isinstance(self.result, HostError):
            raise self.result
        return Answered(RESULT_PREFIX + json.dumps(self.result) + "\n")


@dataclass
class Answered:
    """A command that has answered already: a host with the agent cached, and its result."""

    stdout: str

    def chunks(self) -> Iterator[tuple[str, str]]:
        yield "stdout", f'{EVENT_PREFIX}{{"event": "agent", "cached": true, "state": "cached"}}\n' + self.stdout

    def send(self, data: bytes) -> None:
        raise AssertionError("nothing is sent to a host that has the agent")

    def close_stdin(self) -> None:
        return None

    def wait(self, timeout: float | None = None) -> int:
        return 0


FAILED_WRITES = [
    ("read-only", {"probe": {"error": "cannot write to /srv/proj/pkg: Read-only file system", "errno": "EROFS",
                             "path": "/srv/proj/pkg"}, "free_bytes": 1 << 30},
     "cannot write to /srv/proj/pkg: Read-only file system", "remount the filesystem of /srv/proj/pkg on node1"),
    ("full, still", {"probe": {"error": "cannot write to /srv/proj/pkg: No space left on device",
                               "errno": "ENOSPC", "path": "/srv/proj/pkg"}, "free_bytes": 0},
     "No space left on device", "free space on node1 (df -h /srv/proj/pkg)"),
    ("the write works now", {"probe": None, "free_bytes": 2048},
     "copying pkg/m.py to /srv/proj failed: Failure (2.0 KiB free there)", "is writable and has space"),
]


@pytest.mark.parametrize(("reply", "message", "fix"), [r[1:] for r in FAILED_WRITES], ids=[r[0] for r in FAILED_WRITES])
def test_a_failed_sftp_step_is_explained_by_the_node_agent(reply: dict[str, Any], message: str, fix: str) -> None:
    t = Answering(reply)
    err = explain(t, "/srv/proj", TransferError("pkg/m.py", OSError("Failure")))  # type: ignore[arg-type]
    assert err.host == "node1" and message in err.message and fix in err.fix
    assert t.requests[0]["op"] == "unpack" and t.requests[0]["probe"] == "pkg"


def test_an_unwritable_copy_stops_a_sync_only_when_something_must_be_written() -> None:
    why = {"error": "cannot write to /srv/proj: Read-only file system", "errno": "EROFS", "path": "/srv/proj"}
    read_only = Manifest("/srv/proj", unwritable=why)
    assert cannot_write("node1", read_only, Changes(unchanged=3)) is None  # up to date: it runs as it is
    for changes in (Changes(send=("a.py",)), Changes(remove=("b.py",)), Changes(owned=Owned(("a.py",)))):
        err = cannot_write("node1", read_only, changes)
        assert err is not None and err.host == "node1" and err.message == why["error"]
        assert err.fix.startswith("remount the filesystem of /srv/proj on node1 read-write")
    full = Manifest("/srv/proj", free_bytes=1 << 20)
    assert cannot_write("node1", full, Changes(send=("w.bin",), send_bytes=2 << 20)) is not None
    assert cannot_write("node1", full, Changes(send=("w.bin",), send_bytes=1 << 20)) is None


def test_a_lost_connection_keeps_the_original_error_and_a_full_disk_is_refused_before_sending() -> None:
    gone = Answering(HostError("node1", "lost", "connection closed"))  # type: ignore[arg-type]
    err = explain(gone, "/srv/proj", TransferError("a.py", EOFError("closed")))  # type: ignore[arg-type]
    assert err.message == "copying a.py to /srv/proj failed: closed"
    full = no_room("node1", "/srv/proj", 20 << 20, 1 << 20)
    assert full is not None and full.message == ("cannot write to /srv/proj: No space left on device "
                                                 "(20 MiB to send, 1.0 MiB free)")
    assert no_room("node1", "/srv/proj", 1 << 20, 1 << 20) is None and no_room("n", "/r", 5, None) is None


def test_plain_lines_name_the_host_made_and_the_kept(tmp_path: Path) -> None:
    changes = Changes(remove=("a.py",), unchanged=2, kept=1, conflicts=(Conflict("x", Why.CHANGED),))
    line = sync_line(HostSync("n0", "/r", changes, 0, 0.5))
    assert line == ("sync n0: 1 removed, 2 unchanged in 0.5s (/r); removed 1 file no longer in the source: a.py; "
                    "kept 1 file the host made; not overwritten, the host's own: x (changed on the host since the "
                    "last sync); delete them on the host to take the source's, or exclude them")
