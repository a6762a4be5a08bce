"""ddpctl's control plane: CLI, SSH transport, doctor checks, launch and teardown."""

__version__ = "0.1.0"
