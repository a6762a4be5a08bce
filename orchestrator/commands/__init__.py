"""One module per CLI command: parse flags, build a config, call the core, render, exit code."""
