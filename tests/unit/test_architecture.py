"""The layout's one-way arrows, checked on the source: every arrow between packages points down the
layers (docs/architecture.md draws them), no module import circle anywhere, commands never reach into
node_agent, nothing imports orchestrator, inventory stays pure, node_agent stays standard-library
only, and each agent reply is defined once."""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def top_level(folder: str) -> dict[Path, set[str]]:
    return {p: {name.split(".")[0] for name in imports(p)} for p in sorted((ROOT / folder).rglob("*.py"))}


def test_nothing_under_commands_imports_node_agent() -> None:
    offenders = [str(p.relative_to(ROOT)) for p, mods in top_level("orchestrator/commands").items()
                 if "node_agent" in mods]
    assert offenders == []


@pytest.mark.parametrize("folder", ["inventory", "node_agent", "train_jobs"])
def test_nothing_imports_orchestrator(folder: str) -> None:
    offenders = [str(p.relative_to(ROOT)) for p, mods in top_level(folder).items() if "orchestrator" in mods]
    assert offenders == []


def test_inventory_is_pure() -> None:
    banned = {"subprocess", "socket", "paramiko", "fabric", "node_agent"}
    offenders = {str(p.relative_to(ROOT)): mods & banned for p, mods in top_level("inventory").items() if mods & banned}
    assert offenders == {}


def test_node_agent_needs_only_the_standard_library_and_optional_psutil() -> None:
    allowed = set(sys.stdlib_module_names) | {"node_agent", "psutil", "__future__"}
    offenders = {str(p.relative_to(ROOT)): mods - allowed for p, mods in top_level("node_agent").items()
                 if mods - allowed}
    assert offenders == {}


def test_node_agent_and_the_programs_shipped_with_it_parse_as_python_3_8() -> None:
    """Every host runs it on its own python3, 3.8 or newer: no syntax of a later Python (a match
    statement, parenthesized context managers, `except*`). mypy checks the types, but no mypy that
    runs here can target 3.8; tests/unit/test_agent_shipping.py runs the ops on a real 3.8. The
    train_jobs programs ddpctl ships with it are compiled into the same cache on that Python."""
    from orchestrator.remote.programs import SHIPPED, TRAIN_JOBS

    paths = [*sorted((ROOT / "node_agent").rglob("*.py")), *(TRAIN_JOBS / rel for rel in SHIPPED)]
    for path in paths:
        ast.parse(path.read_text(), str(path), feature_version=(3, 8))


def test_the_agent_wire_is_decoded_only_in_the_remote_layer() -> None:
    users = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "orchestrator").rglob("*.py"))
             if "node_agent.wire.protocol" in imports(p)]
    assert users == ["orchestrator/remote/agent.py"]


def keyed(tree: ast.AST, receiver: Callable[[ast.expr], bool] = lambda _: True) -> list[int]:
    """Lines that read a key by hand from what `receiver` accepts: `x["key"]`, `x.get("key")`,
    `"key" in x`."""
    def text(node: ast.expr) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    return sorted({n.lineno for n in ast.walk(tree)
                   if (isinstance(n, ast.Subscript) and text(n.slice) and receiver(n.value))
                   or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get"
                       and bool(n.args) and text(n.args[0]) and receiver(n.func.value))
                   or (isinstance(n, ast.Compare) and text(n.left) and isinstance(n.ops[0], ast.In | ast.NotIn)
                       and receiver(n.comparators[0]))})


def test_each_agent_reply_is_defined_once() -> None:
    """Practice 15: the control plane declares no class of its own named like a node_agent reply,
    and the wire module reads no reply key by hand (`x["key"]`, `x.get("key")`, `"key" in x`): it
    decodes the replies from node_agent/wire/replies*.py by their annotations, the facts too."""
    replies = {n.name for p in sorted((ROOT / "node_agent" / "wire").glob("replies*.py"))
               for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)}
    mirrored = {f"{p.relative_to(ROOT)}:{n.name}" for p in sorted((ROOT / "orchestrator").rglob("*.py"))
                for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef) and n.name in replies}
    assert mirrored == set()
    assert keyed(ast.parse((ROOT / "orchestrator/remote/wire.py").read_text())) == []


def facts_reader(node: ast.expr) -> bool:
    """What the control plane names a host's facts: `hf`, `facts`, or any `x.facts`."""
    return (isinstance(node, ast.Name) and node.id in ("hf", "facts")) or \
        (isinstance(node, ast.Attribute) and node.attr == "facts")


def test_the_facts_are_read_by_attribute_never_by_key() -> None:
    """The facts op's answer is typed (node_agent/wire/replies_facts.py): HostFacts offers no lookup by
    name, and nothing in the control plane reads a sub-fact by key (`hf.get("resolution")`,
    `hf.facts["gpus"]`, `"gpus" in hf.facts`)."""
    wire = ast.parse((ROOT / "orchestrator/remote/wire.py").read_text())
    host_facts = next(n for n in wire.body if isinstance(n, ast.ClassDef) and n.name == "HostFacts")
    methods = {n.name for n in host_facts.body if isinstance(n, ast.FunctionDef)}
    assert methods & {"get", "__getitem__", "__contains__", "__getattr__"} == set()
    fields = {n.target.id: ast.unparse(n.annotation) for n in host_facts.body
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert fields["facts"] == "Facts"
    offenders = {f"{p.relative_to(ROOT)}:{line}" for p in sorted((ROOT / "orchestrator").rglob("*.py"))
                 for line in keyed(ast.parse(p.read_text()), facts_reader)}
    assert offenders == set()


# -- the layers -------------------------------------------------------------------------------

SOURCES = ("orchestrator", "inventory", "node_agent", "train_jobs")

# Top to bottom. A package imports only packages of a lower layer (never one of its own layer but
# itself): the CLI and the Python API on top, inventory and node_agent below everything.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("orchestrator.__main__",),
    ("orchestrator.cli",),  # the typer app: finds each command in commands/
    ("orchestrator.commands",),  # one module per command: flags, one call, rendering
    ("orchestrator",),  # the package's root: lazily re-exports the Python API
    ("orchestrator.api",),
    ("orchestrator.run_up",),  # run_up: dry run, detach, restarts, plain launch; the CLI's and the API's
    ("orchestrator.restarts",),
    ("orchestrator.doctor",),  # doctor's runner: the checks, and the jobs it launches (smoke, bandwidth)
    ("orchestrator.watch",),  # the monitors that plug into supervision: progress, straggler, hang, watchdog
    ("orchestrator.launch",),  # plan, pre-launch round trip, the supervision core, the backends
    ("orchestrator.checks", "orchestrator.hostops", "orchestrator.sync"),
    ("orchestrator.remote",),
    ("orchestrator.account",),  # where a run's time went: its events and the account computed from them
    ("orchestrator.errors", "orchestrator.sizes"),  # errors that name a host; byte sizes as text
    # node_agent by role: its entry (__main__'s table of ops), the ops, the node runtime (the
    # supervisor), code that runs inside a rank, what the ops and the runtime read of the host, and
    # the wire it shares with the control plane. train_jobs: the programs ddpctl ships with its agent
    # (the control plane reads the deep check's pure rules from them; see test_the_control_plane_...).
    ("node_agent",),
    ("node_agent.ops",),
    ("node_agent.runtime",),
    ("node_agent.rank", "node_agent.host"),
    ("inventory", "node_agent.wire", "train_jobs"),
)
UNITS = {unit: rank for rank, layer in enumerate(LAYERS) for unit in layer}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for folder in SOURCES for p in sorted((ROOT / folder).rglob("*.py"))}


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """Every module of ours that `name` imports, anywhere in its body (a lazy import is an arrow too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        yield from (t for t in targets if t in known)


def unit_of(name: str) -> str:
    """The layer unit a module belongs to: its longest prefix named in LAYERS."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in UNITS:
            return ".".join(parts[:n])
    raise AssertionError(f"{name} is in no layer: add its package to LAYERS")


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imported(name, path, known)) - {name} for name, path in known.items()}


def test_every_module_is_in_a_layer() -> None:
    for name in modules():
        unit_of(name)


def test_every_arrow_between_packages_points_down() -> None:
    upward = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets
                    if unit_of(a) != unit_of(b) and UNITS[unit_of(b)] <= UNITS[unit_of(a)])
    assert upward == []


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (iterative: the graph is a few hundred nodes)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_anywhere() -> None:
    assert strongly_connected(graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_control_plane_imports_only_the_pure_modules_of_train_jobs() -> None:
    """train_jobs holds programs that import torch; the control plane never does, so what it
    imports from there (the deep check's schedule and verdict rules) imports no torch, even
    through another module."""
    known, edges = modules(), graph()
    reached: set[str] = set()
    todo = [t for name, targets in edges.items() if name.startswith("orchestrator") for t in targets
            if t.startswith("train_jobs")]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += edges.get(name, ())
    assert reached, "the control plane imports nothing of train_jobs: drop this test"
    heavy = {"torch", "numpy"}
    assert {name: sorted(top_level_of(known[name]) & heavy) for name in sorted(reached)
            if top_level_of(known[name]) & heavy} == {}


def top_level_of(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imports(path)}
