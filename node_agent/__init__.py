"""Code that runs on each host: facts, port owners, probes, and the torchrun supervisor.

Standard library only (psutil when present), python3 >= 3.8. The orchestrator ships this
package's source over the SSH channel's stdin, so nothing needs to be installed on a host.

Doctor starts this code on every host at once, so each import is paid hosts times over: the
annotations are for the type checker only (`TYPE_CHECKING = False`, then `if TYPE_CHECKING:` the
typing imports; `typing` would cost each agent start ~2.4 ms of CPU), and modules that only some
ops or sub-facts need are imported where they are used.
"""
