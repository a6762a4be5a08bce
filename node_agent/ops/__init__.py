"""The agent's operations, one module per op or group (facts, ports, probes, top, stacks, prune,
jobs, logs, sync, GPU health, the Slurm node check): each a function of its request."""
