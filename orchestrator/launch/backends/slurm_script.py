"""The batch script a Slurm job runs (pure text; golden-tested).

One task per node (`--ntasks-per-node=1`), each task the node agent's supervisor for that node's
torchrun (node.sh: the job's setup lines, then the agent reading `node.in` on stdin: the agent and
its request, job env included, mode 0600: nothing of the env is on a command line). torchrun
rendezvous with c10d on the allocation's first node, on a port chosen per job there. With requeue,
the early signal reaches the batch shell, which passes it to every node (torchrun hands it to the
ranks as a Python signal) and requeues once they have ended.
"""

from __future__ import annotations

import shlex

from inventory.specs import SlurmSpec
from node_agent.wire.layout import SLURM_JOB_COMMENT, SLURM_PORT_SPREAD, SLURM_PORT_TRIES
from orchestrator.launch.plan import SLURM_RDZV_ENV, LaunchPlan


def sbatch_argv(state: str, workdir: str) -> list[str]:
    """The submission: paths go as arguments (they may hold spaces), the rest is in the script."""
    return ["sbatch", "--parsable", f"--chdir={workdir}", f"--output={state}/batch.out", "--open-mode=append",
            f"{state}/job.sbatch"]


def sbatch_options(plan: LaunchPlan, spec: SlurmSpec) -> list[str]:
    opts = [f"--job-name={plan.job_id}", f"--comment={SLURM_JOB_COMMENT}", f"--nodes={spec.nodes}",
            "--ntasks-per-node=1", *spec.resource_options()]
    opts += [f"--time={spec.time}"] if spec.time is not None else []
    opts += [f"--exclude={','.join(spec.exclude)}"] if spec.exclude else []  # a restart's faulty nodes
    if spec.requeue:
        opts += ["--requeue", f"--signal=B:{spec.signal}"]
    else:
        opts += ["--no-requeue"]
    return opts + list(spec.extra_sbatch)


def render_batch(plan: LaunchPlan, spec: SlurmSpec, state: str, base_port: int) -> str:
    q = shlex.quote
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {opt}" for opt in sbatch_options(plan, spec)]
    lines += [
        f"# ddpctl job {plan.job_id}: {spec.nodes} node(s) x {plan.hosts[0].nproc} rank(s), one torchrun "
        "per node, c10d rendezvous on the first node.",
        "set -u",
        f"S={q(state)}",
        'R="${SLURM_RESTART_COUNT:-0}"',
        'head="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        'if [ -z "$head" ]; then',
        '    echo "ddpctl: scontrol show hostnames \\"$SLURM_JOB_NODELIST\\" named no node: no rendezvous '
        'host (ddpctl never falls back to localhost)" >&2',
        "    exit 1",
        "fi",
        "# a port per job, so two jobs on one head node never share a rendezvous store",
        f'port=$(( {base_port} + SLURM_JOB_ID % {SLURM_PORT_SPREAD} ))',
        f'for _ in $(seq {SLURM_PORT_TRIES}); do',
        '    (exec 3<>"/dev/tcp/$head/$port") 2>/dev/null || break',
        "    port=$((port + 1))",
        "done",
        f'export {SLURM_RDZV_ENV}="$head:$port"',
        'export DDPCTL_STATE_ROOT=' + q(state.rsplit("/runs/", 1)[0]),
        f'echo "ddpctl: run $R of Slurm job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, rendezvous ${SLURM_RDZV_ENV}"',
        f"srun --kill-on-bad-exit=1 --nodes={spec.nodes} --ntasks-per-node=1 --input=\"$S/node.in\" "
        '--output="$S/r$R-node%t.out" bash "$S/node.sh" &',
        "step=$!",
    ]
    if spec.requeue:
        sig = spec.signal_name
        lines += [
            f"# SIG{sig} {spec.signal_lead_s}s before the time limit (or on preemption): every node's ranks get it;",
            "# the job is requeued once they have ended (the rerun sees SLURM_RESTART_COUNT)",
            "on_signal() {",
            f'    echo "ddpctl: got SIG{sig}: passing it to the ranks, then requeueing"',
            '    : > "$S/requeue-$R"',
            f'    kill -{sig} "$step"',
            "}",
            f"trap on_signal {sig}",
        ]
    lines += [
        "while :; do",
        '    wait "$step"; rc=$?',
        '    kill -0 "$step" 2>/dev/null || break',
        "done",
    ]
    if spec.requeue:
        lines += ['if [ -e "$S/requeue-$R" ]; then scontrol requeue "$SLURM_JOB_ID"; fi']
    lines += ['exit "$rc"', ""]
    return "\n".join(lines)
