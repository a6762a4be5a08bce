"""`ddpctl doctor --deep`'s active host checks: a timed matrix multiply per host and GPU, and
point-to-point link rounds between the hosts (schedule.py plans them, check.py runs them)."""
