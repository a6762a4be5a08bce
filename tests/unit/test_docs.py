"""The docs stay honest: README and docs/ links resolve; every command and flag they show exists;
the job file's and the inventory's documented keys, defaults and examples are the loader's; every
check doctor can report has its troubleshooting entry, which names each message the check prints;
every finding `up` prints has its entry too."""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
import typer.core
import typer.main

from inventory import hostfile, jobfile, loading, metrics, restart, slurm_table, sync, watch
from orchestrator import cli
from orchestrator.checks import catalog, explain

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = ("cluster", "job-file", "running", "bare-hosts", "slurm", "restarts", "deep-checks", "watching", "python-api",
         "performance", "architecture", "troubleshooting", "metrics")
RUN_COMMAND = "pip install -e '.[train]' && ddpctl up train_jobs/toy/job.toml"
TEST_COMMAND = "pip install -e '.[test]' && python3 -m pytest -q -p no:cacheprovider"
GLOBAL_FLAGS = {"--help", "--version", "--install-completion", "--show-completion"}


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose(text: str) -> str:
    """The text without its fenced code blocks (links and headings there are not Markdown)."""
    return re.sub(r"^```.*?^```[ \t]*$", "", text, flags=re.MULTILINE | re.DOTALL)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    parts = heading.split("`")  # HTML tags are dropped outside code spans only
    text = "".join(re.sub(r"<[^>]+>", "", p) if i % 2 == 0 else p for i, p in enumerate(parts)).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    text = prose(path.read_text(encoding="utf-8"))
    found = set(re.findall(r'<a (?:id|name)="([^"]+)"', text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+?)\s*#*$", text, flags=re.MULTILINE):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def links(path: Path) -> Iterator[str]:
    text = re.sub(r"`[^`\n]*`", "", prose(path.read_text(encoding="utf-8")))
    yield from re.findall(r"\]\(([^)\s]+)\)", text)


def test_the_docs_pages_exist_and_readme_is_a_front_door() -> None:
    assert sorted(p.stem for p in DOCS.glob("*.md")) == sorted(PAGES)
    readme = README.read_text(encoding="utf-8")
    lines = readme.splitlines()
    assert RUN_COMMAND in lines and TEST_COMMAND in lines  # the two set-up commands, verbatim
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: keep it a front door, move detail into docs/"
    linked = {target.split("#")[0] for target in links(README)}
    assert {f"docs/{page}.md" for page in PAGES} <= linked, "README links every docs page"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.name)
def test_every_link_resolves(path: Path) -> None:
    broken = []
    for target in links(path):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading or anchor #{fragment} in {dest.name}")
    assert not broken, f"{path.name}: " + "; ".join(broken)


# -- commands and flags -------------------------------------------------------------------------

@cache
def command_options() -> dict[str, frozenset[str]]:
    group = typer.main.get_command(cli.build())
    assert isinstance(group, typer.core.TyperGroup)
    out = {}
    for name, command in group.commands.items():
        opts = {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
        out[name] = frozenset(opts | {"--help"})
    return out


def code_spans(text: str) -> Iterator[str]:
    """Each line of a fenced code block, and each inline code span."""
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        yield from block.splitlines()
    yield from re.findall(r"`([^`\n]+)`", prose(text))


def command_uses(span: str) -> Iterator[tuple[str, list[str]]]:
    """(command, the --flags written after it) for each command line in a span: `ddpctl COMMAND ...`
    where a command starts (the span's start, after `$`, `&&`, `;`, `|` or `(`), and a span that
    starts with a command's name (`up --dry-run`); a `#` comment ends the command. Prose quoted in
    code (an error's "no ddpctl setting ...") is not a command line."""
    span = span.split(" #")[0]
    starts = [(m.start(1), m.group(1)) for m in re.finditer(r"(?:^|[$;|(]|&&)\s*ddpctl ([^\s:]+)", span)]
    bare = re.match(r"([a-z][a-z-]*) --", span)
    if bare and bare.group(1) in cli.COMMANDS:
        starts.insert(0, (0, bare.group(1)))
    for i, (at, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(span)
        yield name, re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", span[at:end])


def test_every_command_and_flag_the_docs_show_exists() -> None:
    options = command_options()
    wrong = []
    for path in markdown_files():
        for span in code_spans(path.read_text(encoding="utf-8")):
            for name, flags in command_uses(span):
                if name.startswith("-"):
                    if name not in GLOBAL_FLAGS:
                        wrong.append(f"{path.name}: ddpctl {name}: no such global option")
                elif name.startswith(("<", "[", "…", "COMMAND")):
                    continue  # a placeholder: `ddpctl <command> --help`
                elif name not in options:
                    if "/" in name or difflib.get_close_matches(name, options, cutoff=0.6):
                        wrong.append(f"{path.name}: `{span}`: ddpctl has no command {name!r}")
                    # else prose quoted in code: "ddpctl is not importable by ..."
                else:
                    wrong += [f"{path.name}: `{span}`: ddpctl {name} has no {flag}"
                              for flag in flags if flag not in options[name] | GLOBAL_FLAGS]
    assert not wrong, "\n".join(wrong)


def test_the_flag_checker_catches_a_made_up_flag() -> None:
    uses = dict(command_uses("ddpctl up job.toml --detach --no-such-flag  # see --not-this"))
    assert uses == {"up": ["--detach", "--no-such-flag"]}
    assert dict(command_uses("$ ddpctl ps --json && ddpctl down j1 --grace 5")) == {
        "ps": ["--json"], "down": ["--grace"]}
    assert not dict(command_uses("fix: no ddpctl setting can raise it"))
    assert "stack" not in command_options() and difflib.get_close_matches("stack", command_options())
    assert "--no-such-flag" not in command_options()["up"] and "--detach" in command_options()["up"]


# -- the keys of the job file and the inventory ---------------------------------------------------

def documented_keys(page: str) -> set[str]:
    return {key for key, _, _ in key_rows(page)}


def test_the_job_file_page_documents_exactly_the_keys_the_loader_accepts() -> None:
    tables = {"job": jobfile.JOB_KEYS, "rendezvous": jobfile.RENDEZVOUS_KEYS,
              "supervise": jobfile.SUPERVISE_KEYS, "restart": restart.RESTART_KEYS, "watch": watch.WATCH_KEYS,
              "metrics": metrics.METRICS_KEYS, "sync": sync.SYNC_KEYS, "slurm": slurm_table.SLURM_KEYS}
    assert set(jobfile.JOB_FILE_KEYS) == {*tables, "inventory", "env"}  # a new table needs its rows here
    expected = {f"{table}.{key}" for table, keys in tables.items() for key in keys} | {"inventory"}
    expected = (expected - {"slurm.metrics"}) | {f"slurm.metrics.{key}" for key in metrics.TEXTFILE_KEYS}  # a table
    documented = documented_keys("job-file.md")
    env_rows = {key for key in documented if key.startswith("env.")}
    assert len(env_rows) == 1, f"one row for [env]'s free-form names, not {sorted(env_rows)}"
    assert documented - env_rows == expected, (
        f"documented, not accepted: {sorted(documented - env_rows - expected)}; "
        f"accepted, not documented: {sorted(expected - documented)}")


def key_rows(page: str) -> list[tuple[str, str, str]]:
    """(key, default cell, last cell) of each reference-table row of a docs page."""
    rows = []
    for line in (DOCS / page).read_text(encoding="utf-8").splitlines():
        if m := re.match(r"\|\s*`([a-z_]+(?:\.[A-Za-z_<>]+){0,2})`\s*\|", line):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            rows.append((m.group(1), cells[1], cells[-1]))
    return rows


def literal(cell: str) -> str | None:
    """The TOML value a cell opens with in backticks (`29500`, `"static"`, `[]`); None for words
    ("the job file's directory", "none")."""
    m = re.match(r"`([^`]+)`", cell)
    return m.group(1) if m and re.fullmatch(r'-?[\d.]+|"[^"]*"|true|false|\[\]|\{\}', m.group(1)) else None


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "hosts.toml").write_text('[[hosts]]\nname = "node[0-3]"\naddress = "198.18.0.[10-13]"\n')
    return tmp_path


def load_body(where: Path, body: str) -> object:
    from inventory import load_job

    path = where / "job.toml"
    path.write_text(body)
    return load_job(path)


def job_text(table: str, line: str = "", key: str = "") -> str:
    head = "" if table == "slurm" else 'inventory = "hosts.toml"\n'
    script = "" if key in ("script", "module") else 'script = "train.py"\n'
    if table == "job":
        return f"{head}[job]\n{script}{line}\n"
    return f"{head}[job]\n{script}[{table}]\n{line}\n"


def test_each_documented_default_is_the_loaders(job_dir: Path) -> None:
    """A key set to its documented default loads the same job as the key left out."""
    from orchestrator.launch.faults import DEFAULT_LOST_AFTER

    checked = 0
    for key, default, _ in key_rows("job-file.md"):
        table, _, name = key.partition(".")
        value = literal(default)
        if value is None or not name or table == "env":
            continue
        given = load_body(job_dir, job_text(table, f"{name} = {value}"))
        if key == "supervise.lost_after":  # unset: the fault model's own default
            assert float(value) == DEFAULT_LOST_AFTER
            continue
        assert given == load_body(job_dir, job_text(table)), f"{key}: {value} is not the loader's default"
        checked += 1
    assert checked >= 20


def test_each_documented_example_loads(job_dir: Path) -> None:
    from inventory import ConfigError

    bad = []
    for key, _, example in key_rows("job-file.md"):
        table, _, name = key.partition(".")
        if not name:  # `inventory`: every example above already loads with it
            continue
        m = re.fullmatch(r"`([^`]+)`", example)
        assert m, f"{key}: its example cell is one `key = value` line"
        try:
            load_body(job_dir, job_text(table, m.group(1), name))
        except ConfigError as exc:
            bad.append(f"{key}: {m.group(1)}: {exc.message}")
    assert not bad, "\n".join(bad)


def test_each_documented_inventory_default_is_the_loaders(tmp_path: Path) -> None:
    from inventory import load_inventory

    def load(text: str) -> object:
        path = tmp_path / "hosts.toml"
        path.write_text(text)
        return load_inventory(path)

    plain = load('[[hosts]]\nname = "node0"\n')
    checked = 0
    for key, default, _ in key_rows("cluster.md"):
        table, name = key.split(".", 1)  # name: "metrics.textfile_dir", a dotted key
        value = literal(default)
        if value is None:
            continue
        text = (f"[defaults]\n{name} = {value}\n[[hosts]]\nname = \"node0\"\n" if table == "defaults"
                else f'[[hosts]]\nname = "node0"\n{name} = {value}\n')
        assert load(text).hosts == plain.hosts, f"{key}: the documented default {value} is not the loader's"
        checked += 1
    assert checked >= 5


def test_the_cluster_page_documents_exactly_the_inventory_keys() -> None:
    assert set(loading.INVENTORY_KEYS) == {"defaults", "hosts"}
    tables = {"metrics": metrics.TEXTFILE_KEYS}  # a table of a host's: one row per key of it
    keys = [f"{k}.{sub}" for k in loading.SHARED_KEYS if k in tables for sub in tables[k]]
    expected = ({f"defaults.{k}" for k in (*loading.DEFAULT_KEYS, *keys) if k not in tables}
                | {f"hosts.{k}" for k in (*loading.HOST_KEYS, *keys) if k not in tables})
    documented = documented_keys("cluster.md")
    assert documented == expected, (f"documented, not accepted: {sorted(documented - expected)}; "
                                    f"accepted, not documented: {sorted(expected - documented)}")
    page = (DOCS / "cluster.md").read_text(encoding="utf-8")
    assert all(key in page for key in hostfile.HOSTFILE_KEYS)


# -- troubleshooting: every doctor check and every finding of up -------------------------------------

def test_every_declared_check_has_its_explain_page_and_troubleshooting_entry() -> None:
    """A check is declared once, by its spec (orchestrator/checks/catalog.py finds them all): each
    needs its explain/<check>.md and its entry in docs/troubleshooting.md, and no page is of no check."""
    checks = catalog.names()
    pages = {p.stem for p in Path(explain.__file__).parent.glob("*.md")}
    assert [c for c in checks if c not in pages] == [], "declared checks without their explain/<check>.md"
    assert sorted(pages - set(checks)) == [], "explain/*.md of no declared check"
    entries = anchors(DOCS / "troubleshooting.md")
    assert [c for c in checks if explain.anchor(c) not in entries] == [], (
        "declared checks without their entry in docs/troubleshooting.md: "
        "run python -m orchestrator.checks.explain --write-docs")
    for spec in catalog.specs():
        text = explain.entry(spec.name)
        assert text.startswith(f"# `{spec.name}`"), f"{spec.name}.md starts with its title"
        assert re.search(r"^## [✗⚠i] `", text, flags=re.MULTILINE), f"{spec.name}.md has its findings"
        assert not re.search(r"^#{3,} ", text, flags=re.MULTILINE), f"{spec.name}.md: only # and ## headings"
        assert explain.resolve(spec.name) == spec.name and explain.resolve(spec.header.upper()) == spec.name


def test_every_check_doctor_reports_is_declared() -> None:
    reported = {check for _, check, _ in finding_messages()}
    assert sorted(reported - set(catalog.names())) == [], "findings of a check with no spec"


def test_the_troubleshooting_page_carries_the_entries_verbatim() -> None:
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    assert explain.with_region(page) == page, (
        "docs/troubleshooting.md's doctor findings differ from orchestrator/checks/explain/*.md: "
        "run python -m orchestrator.checks.explain --write-docs")


def _constants(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant | ast.Tuple):
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else node.targets
            for target, value in zip(targets, values, strict=False):
                if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    out[target.id] = value.value
    return out


def _literal_parts(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    if isinstance(node, ast.BinOp):
        return _literal_parts(node.left) + _literal_parts(node.right)
    return []


def finding_messages() -> Iterator[tuple[str, str, str]]:
    """(where, check, the longest literal piece of the message) of every finding doctor's checks make."""
    names: dict[str, str] = {"SLURM": "slurm", "PARTITION": "partition", "PROCTRACK": "proctrack", "ALLOC": "alloc"}
    sources = [*sorted((ROOT / "orchestrator/checks").glob("*.py")), ROOT / "orchestrator/checks/slurm_nodes.py",
               ROOT / "orchestrator/doctor/collective.py"]
    for path in sources:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        consts = {**names, **_constants(tree)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 3
                    and node.func.id in ("fail", "warn", "info", "Finding")):
                continue
            if node.func.id == "Finding" and ast.unparse(node.args[1]) not in ("CheckStatus.FAIL", "CheckStatus.WARN",
                                                                                "CheckStatus.INFO"):
                continue  # ok and skip are not printed as findings
            first = node.args[0]
            check = (first.value if isinstance(first, ast.Constant) else
                     consts.get(first.id) if isinstance(first, ast.Name) else None)
            message = node.args[3] if node.func.id == "Finding" else node.args[2]
            pieces = sorted((p.strip() for p in _literal_parts(message)), key=len)
            if isinstance(check, str) and pieces and len(pieces[-1]) >= 10:
                yield f"{path.name}:{node.lineno}", check, pieces[-1]


def test_each_entry_names_every_message_its_check_prints() -> None:
    found = list(finding_messages())
    assert len(found) > 60  # the scan sees the checks' findings
    missing = [f"{where} [{check}] {piece!r}" for where, check, piece in found
               if check in catalog.names() and piece not in explain.entry(check)]
    assert not missing, "messages doctor prints that its explain/<check>.md does not name:\n" + "\n".join(missing)
    from orchestrator.checks.ssh import WHAT

    assert all(what in explain.entry("ssh") for what in WHAT.values())


def up_finding_kinds() -> set[str]:
    kinds = set()
    for path in sorted((ROOT / "orchestrator/watch").glob("*.py")):  # the monitors make every finding
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Finding"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                kinds.add(str(node.args[0].value))
    return kinds


def test_every_finding_up_prints_has_an_entry() -> None:
    kinds = up_finding_kinds()
    assert {"straggler", "hang", "no progress", "host lost", "gpu idle", "memory creeping"} <= kinds
    have = anchors(DOCS / "troubleshooting.md")
    assert not {f"up-{k.replace(' ', '-')}" for k in kinds} - have
