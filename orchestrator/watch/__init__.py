"""Seeing a running job: progress, stragglers, hangs, findings, and the report at the end."""
