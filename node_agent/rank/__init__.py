"""Code that runs inside a rank (the rank wrapper: step accounting, records) and torchrun's shim.
The supervisor writes them next to the job's state and they run as plain scripts: standard library
only, importing nothing of node_agent."""
