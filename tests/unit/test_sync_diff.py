"""The pure per-host diff of [sync]: what the source sends is written only where it is the sync's
to write, and only what an earlier sync of this source put there is ever removed. Host-created
files (outputs, checkpoints, caches) are never removed nor overwritten, whatever `exclude` says."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from inventory.specs import SyncSpec
from orchestrator.sync.diff import Changes, Conflict, Manifest, Owned, Record, Why, diff
from orchestrator.sync.source import SourceTree, scan

SRC = "/home/me/proj"  # this source's record key
T = 1_700_000_000  # the source files' mtime


def source(tmp_path: Path, files: Mapping[str, str], **spec: object) -> SourceTree:
    root = tmp_path / "p"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        os.utime(root / rel, (T, T))
    root.mkdir(exist_ok=True)
    return scan(SyncSpec(src=root, **spec))  # type: ignore[arg-type]


def host(files: Mapping[str, tuple[int, int]], dirs: tuple[str, ...] = (), other: tuple[str, ...] = (),
         records: tuple[Record, ...] = ()) -> Manifest:
    """A host's copy: each file as (size, mtime), mode 0o644."""
    return Manifest("/r", {k: (size, mtime, 0o644, None) for k, (size, mtime) in files.items()},
                    frozenset(dirs), frozenset(other), {r.source: r for r in records})


def record(files: Mapping[str, tuple[int, int]], dirs: tuple[str, ...] = (), src: str = SRC) -> Record:
    return Record(src, dict(files), frozenset(dirs))


def plan(tree: SourceTree, remote: Manifest, delete: bool = True) -> Changes:
    return diff(tree, remote, delete=delete, checksum=False, source=SRC)


# Each row: what the host has at a path the source also has (2 bytes, mtime T), this source's record
# of it (None: the path is not in the record; "none": no record at all), and what the sync does.
WRITES = [
    ("host has none", None, None, "send"),
    ("same contents", (2, T), "none", "unchanged"),
    ("older copy, no record yet (an older ddpctl's copy)", (5, T - 60), "none", "send"),
    ("newer on the host, no record yet", (5, T + 60), "none", Why.NEWER),
    ("the last sync's copy, the source changed since", (5, T - 60), (5, T - 60), "send"),
    ("changed on the host since the last sync", (9, T - 10), (5, T - 60), Why.CHANGED),
    ("created on the host, the source has it now", (7, T - 600), None, Why.CREATED),
]


@pytest.mark.parametrize(("have", "recorded", "expected"), [r[1:] for r in WRITES], ids=[r[0] for r in WRITES])
def test_a_file_the_source_has_is_written_only_where_it_is_the_syncs(
        tmp_path: Path, have: tuple[int, int] | None, recorded: object, expected: object) -> None:
    tree = source(tmp_path, {"f.py": "xx", "other.py": "o"})
    files = {"f.py": have} if have is not None else {}
    records: tuple[Record, ...] = ()
    if recorded != "none":
        records = (record({"other.py": (1, T), **({"f.py": recorded} if recorded else {})}),)  # type: ignore[dict-item]
    changes = plan(tree, host(files, records=records))
    if expected == "send":
        assert "f.py" in changes.send and changes.owned is not None and "f.py" in changes.owned.files
    elif expected == "unchanged":
        assert "f.py" not in changes.send and changes.owned is not None and "f.py" in changes.owned.files
    else:
        assert changes.conflicts == (Conflict("f.py", expected),)  # type: ignore[arg-type]
        assert "f.py" not in changes.send
        assert changes.owned is not None and "f.py" not in changes.owned.files  # the host's from now on
    assert changes.remove == ()


def test_what_an_earlier_sync_put_there_and_the_source_dropped_is_removed_nothing_else(tmp_path: Path) -> None:
    tree = source(tmp_path, {"train.py": "t", "data/keep": "k"}, exclude=("data/", "*.ckpt"))
    remote = host({
        "train.py": (1, T),
        "gone.py": (4, T - 5),  # synced, then deleted from the source: removed
        "edited.py": (8, T + 9),  # synced, then changed on the host, then deleted from the source: kept
        "pkg/__pycache__/m.cpython-311.pyc": (300, T + 1),  # the host's Python wrote it
        "outputs/model.ckpt": (1000, T + 2),  # the job wrote it
        "checkpoints/last.pt": (2000, T + 3),
        "old.ckpt": (3, T - 5),  # synced before it was excluded: excluded now, so kept
        "data/set.bin": (50, T - 5),
    }, dirs=("pkg", "pkg/__pycache__", "outputs", "checkpoints", "data"), other=("latest",),
        records=(record({"train.py": (1, T), "gone.py": (4, T - 5), "edited.py": (4, T - 5),
                         "old.ckpt": (3, T - 5), "data/set.bin": (50, T - 5)}),))
    changes = plan(tree, remote)
    assert changes.remove == ("gone.py",)
    assert changes.send == () and changes.conflicts == ()
    assert changes.kept == 5  # edited.py, the .pyc, both checkpoints and the "latest" link
    assert changes.owned == Owned(("data/set.bin", "old.ckpt", "train.py"), ())
    kept = plan(tree, remote, delete=False)
    assert kept.remove == () and kept.owned is not None and "gone.py" in kept.owned.files  # still the sync's


def test_without_a_record_nothing_is_removed(tmp_path: Path) -> None:
    """A copy made by an older ddpctl (or by hand): the source's files become the sync's, the
    rest stays the host's."""
    tree = source(tmp_path, {"a.py": "a"})
    changes = plan(tree, host({"a.py": (1, T), "stale.py": (3, T - 100), "d/x": (1, T - 100)}, dirs=("d",)))
    assert changes.remove == () and changes.rmdirs == () and changes.kept == 2
    assert changes.owned == Owned(("a.py",), ())  # written now: the next sync may remove a.py


def test_another_sources_files_are_not_this_syncs_to_remove(tmp_path: Path) -> None:
    """Two job files whose sources differ sync the same root: each has its own record."""
    tree = source(tmp_path, {"a.py": "a"})
    theirs = record({"shared.py": (2, T - 5), "b.py": (1, T - 5)}, ("lib",), src="/home/me/other")
    mine = record({"a.py": (1, T), "shared.py": (2, T - 5), "lib/x.py": (1, T - 5)}, ("lib",))
    remote = host({"a.py": (1, T), "shared.py": (2, T - 5), "b.py": (1, T - 5), "lib/x.py": (1, T - 5)},
                  dirs=("lib",), records=(mine, theirs))
    changes = plan(tree, remote)
    assert changes.remove == ("lib/x.py",)  # only mine; shared.py is theirs too
    assert changes.rmdirs == ()  # lib/ is theirs too
    assert changes.owned is not None and "shared.py" not in changes.owned.files  # theirs alone now
    rival = source(tmp_path / "r", {"b.py": "different"})
    assert plan(rival, remote).conflicts == (Conflict("b.py", Why.OTHER_SOURCE),)


def test_directories_are_made_parents_first_and_removed_only_when_a_sync_made_them_and_they_are_empty(
        tmp_path: Path) -> None:
    tree = source(tmp_path, {"new/deep/f": "", "keep/k": ""})
    remote = host({"keep/k": (0, T), "a/b/old.py": (1, T - 5), "busy/old.py": (1, T - 5),
                   "busy/out.log": (9, T + 5), "theirs/x": (1, T - 5)},
                  dirs=("keep", "a", "a/b", "busy", "theirs", "empty-mine", "empty-host"),
                  records=(record({"keep/k": (0, T), "a/b/old.py": (1, T - 5), "busy/old.py": (1, T - 5)},
                                  ("keep", "a", "a/b", "busy", "empty-mine")),))
    changes = plan(tree, remote)
    assert changes.mkdirs == ("new", "new/deep")
    assert changes.remove == ("a/b/old.py", "busy/old.py")
    assert changes.rmdirs == ("a/b", "a", "empty-mine")  # deepest first; busy/ holds a host file
    assert changes.owned is not None and {"new", "new/deep", "keep", "busy", "a"} <= set(changes.owned.dirs)
    assert plan(tree, remote, delete=False).rmdirs == ()


def test_what_stands_where_a_directory_goes(tmp_path: Path) -> None:
    tree = source(tmp_path, {"mine/f": "", "hosts/f": "", "link/f": ""})
    remote = host({"mine": (3, T - 5), "hosts": (3, T - 5)}, other=("link",),
                  records=(record({"mine": (3, T - 5)}),))
    changes = plan(tree, remote)
    assert changes.remove == ("mine",) and changes.mkdirs == ("mine",)  # a sync's file: replaced
    assert set(changes.conflicts) == {Conflict("hosts", Why.NOT_A_DIR), Conflict("link", Why.NOT_A_DIR)}
    assert changes.send == ("mine/f",)  # nothing is sent under what the host keeps


def test_what_stands_where_a_file_goes(tmp_path: Path) -> None:
    tree = source(tmp_path, {"d": "", "ln": ""})
    changes = plan(tree, host({}, dirs=("d",), other=("ln",), records=(record({}),)))
    assert set(changes.conflicts) == {Conflict("d", Why.NOT_A_FILE), Conflict("ln", Why.NOT_A_FILE)}
    assert changes.send == ()


def test_the_record_is_rewritten_only_when_it_changes(tmp_path: Path) -> None:
    tree = source(tmp_path, {"a.py": "a", "d/b.py": "b"})
    current = record({"a.py": (1, T), "d/b.py": (1, T)}, ("d",))
    remote = host({"a.py": (1, T), "d/b.py": (1, T), "out.log": (5, T)}, dirs=("d",), records=(current,))
    assert plan(tree, remote).owned is None and plan(tree, remote).empty
    stale = host({"a.py": (1, T), "d/b.py": (1, T)}, dirs=("d",), records=(record({"a.py": (1, T)}, ("d",)),))
    assert plan(tree, stale).owned == Owned(("a.py", "d/b.py"), ("d",))  # d/b.py adopted: the same contents


def test_checksum_mode_compares_contents(tmp_path: Path) -> None:
    tree = source(tmp_path, {"a.py": "same", "b.py": "diff"}, checksum=True)
    f = tree.files
    remote = Manifest("/r", {"a.py": (4, 0, f["a.py"].mode, tree.sha256("a.py")),
                             "b.py": (4, T, f["b.py"].mode, "0" * 64)})
    assert diff(tree, remote, delete=True, checksum=True).send == ("b.py",)  # a.py's old mtime is fine


def test_modes_and_the_manifest_reply(tmp_path: Path) -> None:
    tree = source(tmp_path, {"run.sh": "x"})
    os.chmod(tree.files["run.sh"].path, 0o755)
    tree = scan(SyncSpec(src=tree.root))
    reply = {"root": "/r", "files": {"run.sh": [1, T, 0o644, None]}, "dirs": [], "other": [], "free_bytes": 10,
             "records": [{"source": SRC, "files": {"run.sh": [1, T]}, "dirs": []}]}
    remote = Manifest.from_reply(reply)
    assert remote.records[SRC] == record({"run.sh": (1, T)}) and remote.free_bytes == 10
    changes = plan(tree, remote)
    assert changes.chmod == ("run.sh",) and changes.send == () and changes.owned is None
