"""The node runtime: the supervisor that runs torchrun and records its run state, its uplink to
the control plane, attach, the restarts loop of a detached job, and ending a node."""
