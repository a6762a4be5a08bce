"""Where ddpctl keeps its state on a host and on a Slurm cluster: the directories, the marker files
and the names both the node agent and the control plane read (one definition, imported by both)."""

from __future__ import annotations

import os
import re
from pathlib import Path

STATE_ROOT_ENV = "DDPCTL_STATE_ROOT"  # overrides ~/.ddpctl (tests, a shared home)
STATE_DIR = ".ddpctl"  # under the home directory
RUNS = "runs"  # <state root>/runs/<job id>/node<rank>: a job's run state on a host
# A node's run state: the shipped modules a launch's program runs (SuperviseRequest.modules), written
# there for torchrun; its processes find the folder in this variable (orchestrator/launch/inline.py's RUNNER).
PROGRAM_DIR = "program"
PROGRAM_DIR_ENV = "DDPCTL_PROGRAM_DIR"

# A node's run state: `ddpctl down` stopped it (who, when), and the start of its stop reason then.
DOWN_MARK = "down.json"
STOPPED_BY_DOWN = "stopped by `ddpctl down`"
STOPPED_BY_SIGNAL = "stopped by a signal to torchrun from outside ddpctl"  # kill <torchrun's pid>, by hand

DOCTOR_MARKER_PREFIX = ".ddpctl-doctor-"  # doctor's checkpoint_dir markers: the agent removes only these
ATTEMPT_MARK = ".ddpctl-attempt"  # in [restart] checkpoint_dir: the run and attempt that own it now
SYNC_RECORD_DIR = ".ddpctl-sync"  # inside a synced copy's root; the sender never sends nor removes it

# Slurm: a ddpctl job is known by its comment (squeue's %k); its directory is on the shared home.
SLURM_JOB_COMMENT = "ddpctl"
SLURM_DOWN_MARK = "cancelled-by"  # in the job's directory: `ddpctl down` cancelled it (who, where, when)
SLURM_PORT_SPREAD = 1000  # the rendezvous port: base + job id % SPREAD, then the next free one
SLURM_PORT_TRIES = 200
SLURM_NODE_FILE = re.compile(r"^r(?P<run>\d+)-node(?P<node>\d+)\.out$")  # one node's output, per run
SLURM_REQUEUE_FILE = re.compile(r"^requeue-(?P<run>\d+)$")
SLURM_FOLLOW_PATTERN = r"^(r\d+-node\d+|batch)\.out$"  # the files `logs` and the backend follow


def state_root() -> Path:
    return Path(os.environ.get(STATE_ROOT_ENV) or Path.home() / STATE_DIR)


def node_state_dir(job_id: str, node_rank: int) -> Path:
    """runs/<job id>/node<rank>: keyed by node rank, because homes are often shared (NFS)."""
    return state_root() / RUNS / job_id / ("node%d" % node_rank)


def slurm_runs_dir(home: str) -> str:
    """Where the Slurm jobs' directories are on the cluster (home is shared with the nodes)."""
    return "%s/%s/%s" % (home.rstrip("/"), STATE_DIR, RUNS)


def slurm_state_dir(home: str, job_id: str) -> str:
    """A Slurm job's directory on the cluster."""
    return "%s/%s" % (slurm_runs_dir(home), job_id)
