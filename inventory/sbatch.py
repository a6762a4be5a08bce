"""sbatch's own options in a job's `[slurm] extra_sbatch`: those ddpctl sets itself, or that change
the job's shape, are refused (naming the [slurm] key to use instead, or why ddpctl must own them);
those that only say when the job may start are left out of doctor's short check allocation.

sbatch reads an `#SBATCH` line as several options (`--exclusive --nodes=2`, a `#` starts a
comment) with getopt_long, which takes any unambiguous prefix of a long option (`--ntasks-per-n`)
and a short one with its value attached or clustered (`-N1`, `-HN2`): all are read that way here.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from inventory.errors import ConfigError
from inventory.tomlsource import Reporter


@dataclass(frozen=True)
class Owned:
    """An sbatch option ddpctl sets itself, or one that changes the shape of the job it runs."""

    sets: str  # what the option sets: "sets the node count"
    key: str = ""  # the [slurm] key ddpctl sets it from; "" where no key does
    why: str = ""  # where no key does: why ddpctl must own it
    value: str = "text"  # how the key's value is written: "text", "number", "true" or "false"
    short: str = ""  # its one-letter form


_ONE_TASK = "ddpctl runs one task per node, that node's torchrun (its ranks come from nproc_per_node)"
_OUTPUT = "ddpctl writes it to the job's state directory, where `ddpctl logs` reads it"
OWNED: dict[str, Owned] = {
    "nodes": Owned("sets the node count", "nodes", value="number", short="N"),
    "ntasks": Owned("sets the task count", why=_ONE_TASK, short="n"),
    "ntasks-per-node": Owned("sets the tasks per node", why=_ONE_TASK),
    "tasks-per-node": Owned("sets the tasks per node", why=_ONE_TASK),
    "ntasks-per-gpu": Owned("sets the tasks per GPU", why=_ONE_TASK),
    "ntasks-per-tres": Owned("sets the tasks per GPU", why=_ONE_TASK),
    "gpus-per-task": Owned("gives each task its own GPUs (hiding a node's GPUs from each other)",
                           "gpus_per_node", value="number"),
    "gpus": Owned("asks for GPUs for the whole job, not per node", "gpus_per_node", value="number", short="G"),
    "gpus-per-node": Owned("sets the GPUs per node", "gpus_per_node", value="number"),
    "cpus-per-task": Owned("sets the CPUs per task (per node: one task each)", "cpus_per_task", value="number",
                           short="c"),
    "mem": Owned("sets the memory per node", "mem"),
    "time": Owned("sets the time limit", "time", short="t"),
    "partition": Owned("sets the partition", "partition", short="p"),
    "account": Owned("sets the account", "account", short="A"),
    "qos": Owned("sets the QOS", "qos", short="q"),
    "constraint": Owned("sets the node features", "constraint", short="C"),
    "chdir": Owned("sets the job's directory", "workdir", short="D"),
    "signal": Owned("sets the early-warning signal", "signal"),
    "requeue": Owned("lets Slurm requeue the job", "requeue", value="true"),
    "no-requeue": Owned("stops Slurm requeueing the job", "requeue", value="false"),
    "output": Owned("sets where the batch output goes", why=_OUTPUT, short="o"),
    "error": Owned("sets where the batch errors go", why=_OUTPUT, short="e"),
    "open-mode": Owned("sets how the batch output file is opened", why=_OUTPUT),
    "job-name": Owned("names the job", why="ddpctl names it by its job id, by which `ddpctl ps/logs/down` "
                      "find it", short="J"),
    "comment": Owned("sets the job's comment", why="ddpctl marks its jobs there (`ddpctl ps` lists the jobs "
                     "whose comment is ddpctl)"),
    "parsable": Owned("changes what sbatch prints", why="ddpctl reads the job id from sbatch's output"),
    "wrap": Owned("replaces the batch script", why="ddpctl's batch script starts each node's torchrun"),
    "array": Owned("makes the job an array of jobs", why="ddpctl starts and follows one job", short="a"),
    "wait": Owned("makes sbatch wait for the job to end", why="ddpctl follows the job itself once submitted",
                  short="W"),
    "test-only": Owned("submits nothing", why="ddpctl follows the job it submits"),
    "clusters": Owned("sends the job to another cluster", why="ddpctl's squeue and scancel ask this cluster",
                      short="M"),
    "cluster": Owned("sends the job to another cluster", why="ddpctl's squeue and scancel ask this cluster"),
}
# Every long option of sbatch 22.05 (its getopt_long table): a word that starts several of them is
# refused by sbatch as ambiguous; one that starts only one is that option
SBATCH_OPTIONS = frozenset({
    "account", "acctg-freq", "array", "batch", "bb", "bbf", "begin", "chdir", "cluster",
    "cluster-constraint", "clusters", "comment", "constraint", "container", "context", "contiguous",
    "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu", "cpus-per-task", "deadline",
    "delay-boot", "dependency", "distribution", "error", "exclude", "exclusive", "export",
    "export-file", "extra-node-info", "get-user-env", "gid", "gpu-bind", "gpu-freq", "gpus",
    "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "help", "hint", "hold",
    "ignore-pbs", "input", "job-name", "kill-on-invalid-dep", "licenses", "mail-type", "mail-user",
    "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nice",
    "no-kill", "no-requeue", "nodefile", "nodelist", "nodes", "ntasks", "ntasks-per-core",
    "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket", "ntasks-per-tres", "open-mode", "output",
    "overcommit", "oversubscribe", "parsable", "partition", "power", "prefer", "priority", "profile",
    "propagate", "qos", "quiet", "reboot", "requeue", "reservation", "signal", "sockets-per-node",
    "spread-job", "switches", "tasks-per-node", "test-only", "thread-spec", "threads-per-core", "time",
    "time-min", "tmp", "uid", "usage", "use-min-nodes", "verbose", "version", "wait", "wait-all-nodes",
    "wckey", "wrap",
})
# Options sbatch refuses beside one ddpctl passes: option -> the [slurm] key whose option it clashes with
CLASHES = {"mem-per-cpu": "mem", "mem-per-gpu": "mem"}
# Options that only say when the job may start or whom Slurm tells: doctor's check allocation must
# start now, so they stay out of it (every other extra option applies to it as to the job)
WHEN = {"begin": "b", "dependency": "d", "hold": "H", "deadline": "", "time-min": "", "mail-type": "",
        "mail-user": "", "kill-on-invalid-dep": "", "delay-boot": ""}
# sbatch's short options without a value: in a cluster ("-HN2") the next letter is another option
_SHORT_FLAGS = frozenset("HkOQsvVhW")
_SHORT: dict[str, str] = {o.short: name for name, o in OWNED.items() if o.short}
_SHORT.update({short: name for name, short in WHEN.items() if short})


@dataclass(frozen=True)
class Given:
    """One option of an extra_sbatch item, as written: `--name[=value]` or `-X[value]`."""

    text: str
    name: str  # without dashes: a long name (perhaps a prefix) or one letter
    value: str | None
    long: bool

    def read_as(self) -> list[str]:
        """The sbatch options this may be: one, several (an ambiguous prefix, which sbatch refuses),
        or none (an option of another Slurm version, or none at all: sbatch decides)."""
        if not self.long:
            return [_SHORT[self.name]] if self.name in _SHORT else []
        if self.name in SBATCH_OPTIONS:  # a full name is never read as an abbreviation
            return [self.name]
        return sorted(n for n in SBATCH_OPTIONS if n.startswith(self.name))


def split_options(text: str) -> list[Given]:
    """The options of one #SBATCH line; a word after an option without `=` is its value."""
    tokens = shlex.split(text, comments=True)
    out: list[Given] = []
    i = 0
    while i < len(tokens):
        token, i = tokens[i], i + 1
        nxt = tokens[i] if i < len(tokens) and not tokens[i].startswith("-") else None
        given = _long(token, nxt) if token.startswith("--") else _short(token, nxt, out)
        if given is not None:
            out.append(given)
            i += given.text != token  # it took the next word as its value
    return out


def _long(token: str, nxt: str | None) -> Given | None:
    name, eq, value = token[2:].partition("=")
    if not name:
        return None
    if eq or nxt is None:
        return Given(token, name, value if eq else None, True)
    return Given(f"{token} {nxt}", name, nxt, True)


def _short(token: str, nxt: str | None, out: list[Given]) -> Given | None:
    """A short option, or a cluster of them ("-HN2"): value-less letters go to `out`, and the
    first letter that takes a value (the rest of the word, else the next word) is returned."""
    for j, letter in enumerate(token[1:], start=1):
        if letter in _SHORT_FLAGS:
            out.append(Given(token, letter, None, False))
            continue
        rest = token[j + 1:]
        if rest or nxt is None:
            return Given(token, letter, rest or None, False)
        return Given(f"{token} {nxt}", letter, nxt, False)
    return None


def check_extra_option(src: Reporter, key: str, text: str, set_keys: frozenset[str]) -> None:
    """Refuse an extra_sbatch item that sets what ddpctl sets (naming the [slurm] key to use) or that
    sbatch refuses beside an option ddpctl passes from the [slurm] keys in `set_keys`."""
    try:
        options = split_options(text)
    except ValueError as exc:  # an open quote: sbatch would read the line some other way
        raise src.error(key, f'"{text}" cannot be read as sbatch options: {exc}', "close the quote",
                        value=text) from None
    for given in options:
        read = given.read_as()
        if len(read) > 1 and any(name in OWNED or name in CLASHES for name in read):
            raise src.error(key, f'"{given.text}" may abbreviate ' + ", ".join(f"--{n}" for n in read)
                            + ": sbatch refuses a prefix that starts several options, and ddpctl sets some "
                            "of these itself", "write the option out in full", value=text)
        name = read[0] if len(read) == 1 else ""
        if name in OWNED:
            raise _owned_error(src, key, given, name)
        if name in CLASHES and CLASHES[name] in set_keys:
            raise src.error(key, f'sbatch refuses "{given.text}" beside --{CLASHES[name]}, which ddpctl '
                            f"passes from [slurm] {CLASHES[name]}",
                            f"keep one of them: drop this item or {CLASHES[name]} from [slurm]", value=text)


def _owned_error(src: Reporter, key: str, given: Given, name: str) -> ConfigError:
    rule = OWNED[name]
    text = f'"{given.text}"'
    if given.long and given.name != name:
        text += f" (sbatch reads it as --{name})"
    elif not given.long:
        text += f" (-{given.name} is --{name})"
    if not rule.key:
        return src.error(key, f"{text} {rule.sets}, which ddpctl must set itself: {rule.why}",
                         "drop this item", value=given.text)
    return src.error(key, f"{text} {rule.sets}, which ddpctl sets from [slurm] {rule.key}",
                     f"write {rule.key} = {_toml_value(rule, given.value)} in [slurm] and drop this item",
                     value=given.text)


def _toml_value(rule: Owned, value: str | None) -> str:
    if rule.value in ("true", "false"):
        return rule.value
    if value is None:
        return "N" if rule.value == "number" else '"..."'
    if rule.value == "number" and value.isascii() and value.isdigit():
        return value
    if rule.key == "signal":
        value = value.removeprefix("B:").removeprefix("R:")
    return json.dumps(value)


def allocation_options(extra: tuple[str, ...]) -> tuple[str, ...]:
    """The extra_sbatch items that apply to doctor's check allocation: all but those that say when
    the job may start or whom Slurm tells (the check must start now, and tells nobody)."""
    return tuple(item for item in extra
                 if not any(name in WHEN for given in split_options(item) for name in given.read_as()))
