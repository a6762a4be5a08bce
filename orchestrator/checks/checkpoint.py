"""Check: [restart] checkpoint_dir can be created and written on every host, and whether the hosts
share it (a restart resumes from it: on another host it must see the same files).

Each host creates the directory where it is missing and writes a marker file in it, named for
the host, that the control plane chose for this run. The markers stay until doctor ends its
sessions, which it does only once every host has sent its facts; each host then looks for the
others' markers and removes its own (node_agent/ops/facts.py). A host seeing another's marker proves
they share the directory, so the relation counts both ways: of two hosts that share it, the one
that looks first always sees the other's marker.
"""

from __future__ import annotations

from orchestrator.checks.base import fail, info, listing, ok, skip, warn
from orchestrator.checks.model import Finding, Observations
from orchestrator.checks.spec import CheckSpec, Runs, implements
from orchestrator.remote.wire import CheckpointFact

CHECK = "checkpoint"
# A column only for a job with a checkpoint_dir.
SPEC = CheckSpec(CHECK, order=70, runs=Runs.NODE, column="ckpt", shown=lambda ctx: ctx.checkpoint_dir is not None)
SHARED_FIX = ("set [restart] checkpoint_dir to a path on a filesystem every host mounts (NFS, "
              "Lustre, a shared volume), e.g. an absolute path under the shared mount")


@implements(SPEC)
def check(obs: Observations) -> list[Finding]:
    ctx = obs.ctx
    if ctx.checkpoint_dir is None:
        return [skip(CHECK, None, "the job sets no [restart] checkpoint_dir")]
    out: list[Finding] = []
    writable: dict[str, CheckpointFact] = {}
    for host in (h.name for h in ctx.hosts if h.name in obs.facts):
        hf = obs.facts[host]
        ck = hf.facts.checkpoint
        if ck is None:
            out.append(warn(CHECK, host, f"could not check checkpoint_dir {ctx.checkpoint_dir} on {host}",
                            hf.errors.get(CHECK) or "the node agent sent no checkpoint fact"))
        elif not ck.writable:
            out.append(unwritable(host, ck))
        else:
            writable[host] = ck
            if ck.cleanup_error:
                out.append(warn(CHECK, host, f"doctor could not remove its marker file in {ck.path} on {host}",
                                ck.cleanup_error, f"delete {ck.path}/.ddpctl-doctor-* on {host}"))
    out += [ok(CHECK, host, f"checkpoint_dir {ck.path} is writable"
               + (" (doctor created it)" if ck.existed is False else ""))
            for host, ck in writable.items()]
    if len(ctx.hosts) > 1:
        out += sharing(writable, len(ctx.hosts))
    return out


def unwritable(host: str, ck: CheckpointFact) -> Finding:
    error = ck.error or "unknown error"
    if ck.step == "timeout":
        return fail(CHECK, host, f"checkpoint_dir {ck.path} on {host} did not answer: {error}", error,
                    f"check the filesystem that holds {ck.path} on {host} (a hung network mount?)")
    doing = "create" if ck.step == "mkdir" else "write a file in"
    return fail(CHECK, host, f"cannot {doing} checkpoint_dir {ck.path} on {host}: {error}", error,
                f"on {host}: mkdir -p {ck.path} and give the job's user write access to it (and free "
                "space), or set [restart] checkpoint_dir to a writable path")


def sharing(writable: dict[str, CheckpointFact], hosts: int) -> list[Finding]:
    """Which of the hosts that wrote their marker share the directory (a host that could not
    look is reported, not guessed)."""
    out = [info(CHECK, host, f"could not tell whether {host} shares checkpoint_dir {ck.path} with the other hosts",
                ck.list_error or "")
           for host, ck in writable.items() if ck.seen is None]
    looked = {host: ck for host, ck in writable.items() if ck.seen is not None}
    if len(looked) < 2:
        return out
    groups = shared_groups({host: set(ck.seen or ()) for host, ck in looked.items()})
    paths = sorted({ck.path for ck in looked.values()})
    where = paths[0] if len(paths) == 1 else "checkpoint_dir"
    evidence = "; ".join(f"{host} saw the marker of " + (listing(ck.seen) if ck.seen else "no other host")
                         for host, ck in looked.items())
    if len(groups) == 1:
        whom = f"all {hosts} hosts" if len(looked) == hosts else f"the {len(looked)} hosts that checked it (of {hosts})"
        out.append(ok(CHECK, None, f"{where} is shared by {whom}", evidence))
    elif all(len(g) == 1 for g in groups):
        out.append(warn(CHECK, None, f"{where} is host-local on each host: a restart on another host starts "
                        "from scratch (or from what that host has)", evidence, SHARED_FIX))
    else:
        parts = [f"{listing(g)} share it" if len(g) > 1 else f"{g[0]} has its own" for g in groups]
        out.append(warn(CHECK, None, f"{where} is shared by some hosts only ({'; '.join(parts)}): a restart "
                        "on a host outside a rank's group starts from scratch (or from what that host has)",
                        evidence, SHARED_FIX))
    return out


def shared_groups(seen: dict[str, set[str]]) -> list[list[str]]:
    """The hosts grouped by the directory they share, in host order: a host that saw another's
    marker shares it with that host (both ways), and sharing is transitive."""
    parent = {host: host for host in seen}

    def root(host: str) -> str:
        while parent[host] != host:
            parent[host] = parent[parent[host]]
            host = parent[host]
        return host

    for host, peers in seen.items():
        for peer in peers:
            if peer in parent:
                parent[root(peer)] = root(host)
    groups: dict[str, list[str]] = {}
    for host in seen:
        groups.setdefault(root(host), []).append(host)
    return list(groups.values())
