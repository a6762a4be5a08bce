"""Restarts around the launch core: one budget for the whole job, the failure classes, spares and
exclusions, each attempt a launch of its own (loop.py), and a detached run's restart loop on its
first host (detached.py)."""
