"""Backends turn a launch plan into running processes and back into events (see base.py)."""
