"""Check: on each host with a metrics_dir (the inventory's [defaults.metrics] / a host's metrics
textfile_dir), is it a directory the login user can write in, and does a node_exporter there read it
(its --collector.textfile.directory)? A running job writes its series there
(ddpctl-<job id>-node<rank>.prom) for node_exporter's textfile collector.

Warnings at worst, before a launch too: with a broken metrics_dir the job still trains, only its
metrics go nowhere. Hosts without a metrics_dir are not checked.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.checks.base import info, listing, ok, skip, warn
from orchestrator.checks.model import Finding, Observations
from orchestrator.checks.spec import CheckSpec, Runs, implements
from orchestrator.remote.wire import MetricsDirFact, MetricsReader

CHECK = "metrics_dir"
# A column only where some host has a metrics_dir.
SPEC = CheckSpec(CHECK, order=85, runs=Runs.NODE | Runs.LAUNCH, column="metr",
                 shown=lambda ctx: any(h.metrics_dir for h in ctx.hosts))
FLAG = "--collector.textfile.directory"
INVENTORY_FIX = "or set [defaults.metrics] textfile_dir (or the host's metrics = {textfile_dir = ...}) in the inventory"
UNSEEN = ("a node_exporter in another PID namespace, or hidden by /proc's hidepid, is not seen; "
          "one in a container may read the directory under another path")


@implements(SPEC)
def check(obs: Observations) -> list[Finding]:
    hosts = [h for h in obs.ctx.hosts if h.metrics_dir]
    if not hosts:
        return [skip(CHECK, None, "no host has a metrics_dir ([defaults.metrics] textfile_dir)")]
    out: list[Finding] = []
    for host in (h for h in hosts if h.name in obs.facts):
        hf = obs.facts[host.name]
        md = hf.facts.metrics_dir
        if md is None:
            out.append(warn(CHECK, host.name, f"could not check metrics_dir {host.metrics_dir} on {host.name}",
                            hf.errors.get(CHECK) or "the node agent sent no metrics_dir fact"))
        else:
            out += judge(host.name, md)
    return out


def judge(host: str, md: MetricsDirFact) -> list[Finding]:
    """One host's findings: the directory first; who reads it only once the job could write there."""
    broken = unusable(host, md)
    if broken is not None:
        return [broken]
    out = [] if not md.cleanup_error else [
        warn(CHECK, host, f"doctor could not remove its test file in metrics_dir {md.path} on {host}",
             md.cleanup_error, f"delete {md.path}/.ddpctl-doctor-* on {host}")]
    return [*out, readers(host, md)]


def unusable(host: str, md: MetricsDirFact) -> Finding | None:
    """Why the job could not write its textfile in the directory (None: it can)."""
    evidence = exporter_text(md.exporters or ())
    if md.step == "timeout":
        return warn(CHECK, host, f"metrics_dir {md.path} on {host} did not answer: {md.error}", md.error or "",
                    f"check the filesystem that holds {md.path} on {host} (a hung network mount?)")
    if not md.exists:
        return warn(CHECK, host, f"metrics_dir {md.path} does not exist on {host}: the job's metrics would go "
                    "nowhere", evidence, f"on {host}: mkdir -p {md.path} (and run node_exporter with "
                    f"{FLAG}={md.path}), {INVENTORY_FIX}")
    if not md.is_dir:
        return warn(CHECK, host, f"metrics_dir {md.path} on {host} is not a directory: the job's metrics would go "
                    "nowhere", evidence, f"on {host}: point node_exporter's {FLAG} at a directory, {INVENTORY_FIX}")
    if md.writable:
        return None
    error = md.error or "unknown error"
    return warn(CHECK, host, f"{md.user or 'the login user'} cannot write in metrics_dir {md.path} on {host}: "
                "the job's metrics would go nowhere", error,
                f"on {host}: sudo chown {md.user or '$USER'} {md.path} (or chmod g+w it for a group of that "
                f"user's), {INVENTORY_FIX}")


def readers(host: str, md: MetricsDirFact) -> Finding:
    """Whether a node_exporter on the host reads the (writable) directory."""
    where = f"metrics_dir {md.path}"
    if md.exporters is None:
        return info(CHECK, host, f"{where} is writable; could not tell whether a node_exporter on {host} reads it",
                    md.proc_error or "the node agent could not read /proc")
    found = md.exporters
    reading = [e for e in found if e.reads]
    if reading:
        return ok(CHECK, host, f"{where} is writable by {md.user} and node_exporter reads it",
                  exporter_text(reading))
    run_fix = f"run node_exporter on {host} with {FLAG}={md.path}, {INVENTORY_FIX}"
    if not found:
        return warn(CHECK, host, f"no node_exporter process on {host}: nothing reads {where}",
                    f"no process in /proc whose argv[0] names node_exporter; {UNSEEN}", run_fix)
    if any(e.reads is None for e in found):
        return info(CHECK, host, f"could not tell whether node_exporter on {host} reads {where}",
                    f"{exporter_text(found)}; a process of another user: its /proc/PID/root is not {md.user}'s "
                    f"to read, and a node_exporter in a container may see {md.path} under another path",
                    f"check that directory's mount in node_exporter's container, or {run_fix}")
    looked = any(e.dirs and not e.disabled for e in found)
    return warn(CHECK, host, f"node_exporter on {host} does not read {where}: it runs with "
                + listing(flags_of(e) for e in found), exporter_text(found)
                + (f"; {md.path} is none of its directories, seen through its /proc/PID/root" if looked else ""),
                run_fix)


def flags_of(reader: MetricsReader) -> str:
    if reader.disabled:
        return "--no-collector.textfile"
    if not reader.dirs:
        return f"no {FLAG}"
    return " ".join(f"{FLAG}={d}" for d in reader.dirs)


def exporter_text(found: Sequence[MetricsReader]) -> str:
    """The node_exporter processes seen, with what each reads ("" where there is none)."""
    return "; ".join(f"node_exporter pid {e.pid}: {flags_of(e)}" for e in found)
