"""The launch pipeline: plan (pure), pre-flight facts, the core that runs a plan through a backend
(SSH today) and supervises it, and the collective jobs doctor runs through it."""
