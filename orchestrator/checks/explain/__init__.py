"""What each doctor finding means and how to fix it: one Markdown entry per check, in this folder
(`<check>.md`), shipped with the package.

`ddpctl doctor --explain CHECK` prints an entry; every finding doctor prints ends with a pointer to
its check's entry; docs/troubleshooting.md carries the same entries, copied in by `python -m
orchestrator.checks.explain --write-docs` (tests/unit/test_docs.py keeps the copy equal). The entries
follow the checks' order, and a check is named by its name or its column's header, as each check's
spec says (orchestrator/checks/catalog.py)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from orchestrator.checks import catalog

DOCS_PAGE = "docs/troubleshooting.md"
BEGIN = "<!-- BEGIN doctor findings"
END = "<!-- END doctor findings -->"


def resolve(name: str) -> str | None:
    """The check `name` names (its own name or its column's header, any case); None if none."""
    wanted = name.strip().lower()
    return next((s.name for s in catalog.specs() if wanted in (s.name, s.header)), None)


def entry(check: str) -> str:
    """The Markdown entry of `check` (a declared check)."""
    return resources.files(__name__).joinpath(f"{check}.md").read_text(encoding="utf-8")


def anchor(check: str) -> str:
    return f"doctor-{check}"


def pointer(check: str) -> str:
    """What a finding of `check` ends with: the command that prints its entry."""
    return f"ddpctl doctor --explain {check}"


def docs_link(check: str) -> str:
    return f"{DOCS_PAGE}#{anchor(check)}"


def docs_region() -> str:
    """Every entry as docs/troubleshooting.md carries it: each under its anchor, headings two
    levels down (the page's own `## Doctor findings` holds them)."""
    parts = []
    for check in catalog.names():
        text = re.sub(r"^(#+) ", lambda m: "#" * (len(m.group(1)) + 2) + " ", entry(check).strip(),
                      flags=re.MULTILINE)
        parts.append(f'<a id="{anchor(check)}"></a>\n\n{text}\n')
    return "\n".join(parts)


def with_region(page: str) -> str:
    """`page` (docs/troubleshooting.md's text) with its generated region replaced by docs_region()."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOCS_PAGE} has no '{BEGIN} ...' ... '{END}' region")
    head = page[:page.index("\n", start) + 1]
    return f"{head}\n{docs_region()}\n{page[end:]}"


def write_docs(root: Path) -> bool:
    """Rewrite the region in `root`/docs/troubleshooting.md; True if it changed."""
    path = root / DOCS_PAGE
    old = path.read_text(encoding="utf-8")
    new = with_region(old)
    if new != old:
        path.write_text(new, encoding="utf-8")
    return new != old
