"""Code that runs on each host: facts, port owners, probes, and the torchrun supervisor.

Standard library only (psutil when present), python3 >= 3.8. The orchestrator ships this
package's source over the SSH channel's stdin, so nothing needs to be installed on a host.
"""
