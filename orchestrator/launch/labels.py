"""Which rank printed a line: torchrun's `[default<local rank>]:` prefix mapped to the global rank
(from the node rank with a static rendezvous, or as the rank reported it where c10d or Slurm
numbers the nodes), for a whole batch of one host's lines at once.

A batch is rendered with one `str.replace` per local rank over the joined text, not a Python step
per line: at 100,000 lines a second and more, per-line work in the control plane is what would
make a chatty job slower under ddpctl than by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import overload

from orchestrator.launch.plan import HostLaunch

ROLE = "default"  # torchrun's worker role (node_agent/runtime/ranklogs.py writes the same prefix)

Labelled = tuple[str | None, str]  # (rank label, or None for torchrun's own line; the text)


def labels_for(launch: HostLaunch, c10d: bool, known: Mapping[tuple[str, int], int] | None = None) -> dict[str, str]:
    """torchrun prefix -> rank label for each of the host's local ranks."""
    labels = {}
    for local in range(launch.nproc):
        if not c10d:
            label = str(launch.rank_of(local))
        else:
            rank = (known or {}).get((launch.host.name, local))
            label = f"local{local}" if rank is None else str(rank)
        labels[f"[{ROLE}{local}]:"] = label
    return labels


class RankLines(Sequence[Labelled]):
    """One host's batch of output lines, each with its rank label: a sequence of (label, text),
    worked out only when asked for, or rendered whole (`render`)."""

    def __init__(self, lines: Sequence[str], labels: Mapping[str, str]) -> None:
        self.lines = lines
        self.labels = labels
        self._pairs: list[Labelled] | None = None

    def pairs(self) -> list[Labelled]:
        if self._pairs is None:
            get = self.labels.get
            pairs: list[Labelled] = []
            for text in self.lines:
                if text[:1] == "[":
                    prefix, sep, rest = text.partition("]:")
                    label = get(prefix + sep) if sep else None
                    if label is not None:
                        pairs.append((label, rest))
                        continue
                pairs.append((None, text))
            self._pairs = pairs
        return self._pairs

    def __len__(self) -> int:
        return len(self.lines)

    @overload
    def __getitem__(self, index: int) -> Labelled: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Labelled]: ...

    def __getitem__(self, index: int | slice) -> Labelled | Sequence[Labelled]:
        return self.pairs()[index]

    def __iter__(self) -> Iterator[Labelled]:
        return iter(self.pairs())

    def render(self, prefix: Callable[[str | None], str]) -> str:
        """Every line after `prefix(its label)`, newline-terminated, as one string."""
        if not self.lines:
            return ""
        text = "\n" + "\n".join(self.lines)
        done = 0
        for tp, label in self.labels.items():
            found = text.count("\n" + tp)
            if found:
                text = text.replace("\n" + tp, "\n" + prefix(label))
                done += found
        if done == len(self.lines):
            return text[1:] + "\n"
        return "".join(f"{prefix(label)}{line}\n" for label, line in self.pairs())  # torchrun's own lines too


def split_rank(launch: HostLaunch, text: str, c10d: bool,
               known: Mapping[tuple[str, int], int] | None = None) -> Labelled:
    """One line's rank label and text."""
    return RankLines([text], labels_for(launch, c10d, known))[0]
