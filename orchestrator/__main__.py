"""`python -m orchestrator` is `ddpctl`."""

from orchestrator.cli import main

main()
