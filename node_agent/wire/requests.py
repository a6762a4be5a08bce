"""The requests the control plane sends the node agent that carry more than a few keys, declared
once: the control plane builds them and sends `wire(request)` (node_agent/wire/replies.py); the agent
reads them back with `read`, which keeps the keys a class declares (a newer control plane's extra
keys are ignored) and gives each missing one its default.

The annotations are strings never evaluated here (python >= 3.8, no `typing` import on the host).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, Mapping, Tuple, Type, TypeVar

    R = TypeVar("R")


@dataclass(frozen=True)
class SuperviseRequest:
    """What a node's supervisor (node_agent/runtime/supervisor.py) runs: the supervise op's request, and a
    launch session's `START` line."""

    job_id: str
    job_name: str = ""
    run_id: str = ""  # the same for every attempt of a restarted job
    node_rank: int = 0
    node_rank_env: str = ""  # a scheduler numbers the nodes: read the rank from this variable (Slurm: SLURM_PROCID)
    launcher: Tuple[str, ...] = ()  # torchrun's argv up to the program
    program: Tuple[str, ...] = ()  # the script (or the inline program) and its arguments
    modules: Tuple[str, ...] = ()  # an inline program's modules (shipped with the agent), written out for it
    env: Dict[str, str] = field(default_factory=dict)  # the job's environment (it travels on the channel)
    cwd: str = ""  # where torchrun runs ("~/proj" is the login's home here, as in a shell)
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL when the job stops
    heartbeat_timeout: float = 20.0  # no heartbeat from the control plane this long: it is gone (0: never)
    detach: bool = False  # run on as a daemon; `ddpctl ps/logs/down` take over
    batch: bool = False  # a scheduler started this node: no control channel, its signals stop the job
    forward_signals: Tuple[str, ...] = ()  # signals passed on to torchrun (Slurm's requeue warning)
    nccl_debug: bool = False  # NCCL_DEBUG=INFO into a per-host file, parsed at the end
    wrap: bool = False  # each rank starts through node_agent/rank/rankwrap.py
    sample_every: float = 0.0  # seconds between the host's GPU/CPU samples (0: none)
    metrics_dir: str = ""  # node_exporter's textfile directory: the job's series go there ("": none)
    metrics_every: float = 5.0  # seconds between two writes of the textfile
    metrics_keep: float = 300.0  # the ended job's textfile stays this long, then is removed


def read(cls: Type[R], request: Mapping[str, Any]) -> R:
    """`cls` from a request's JSON object: its declared keys, a list where the field's default is a
    tuple as a tuple of strings, an object where it is a dict as a dict of strings; a key it lacks
    takes its default."""
    data = {}  # type: Dict[str, Any]
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name not in request:
            continue
        value = request[f.name]
        if isinstance(f.default, tuple):
            value = tuple(str(v) for v in value or ())
        elif f.default_factory is dict:
            value = {str(k): str(v) for k, v in (value or {}).items()}
        data[f.name] = value
    return cls(**data)
