"""`python -m orchestrator.checks.explain --write-docs`: copy the entries into docs/troubleshooting.md."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.checks.explain import DOCS_PAGE, write_docs


def main(argv: list[str]) -> int:
    if argv != ["--write-docs"]:
        print("usage: python -m orchestrator.checks.explain --write-docs", file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parents[3]
    changed = write_docs(root)
    print(f"{DOCS_PAGE}: {'updated' if changed else 'already up to date'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
