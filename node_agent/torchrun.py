"""torchrun as a node's supervisor starts it: torch.distributed.run's own main, unchanged, in a
process that skips the interpreter's final garbage collection when it exits.

The supervisor writes this file's source as `bin/torchrun` in the job's run state and starts
`python <state dir>/bin/torchrun ARGS` in place of `python -m torch.distributed.run ARGS` (the name
keeps it torchrun to `ps` and to kill-port). A process that has imported torch spends about 0.4 s
of CPU in that last collection; with every host's agent and ranks exiting at once on a few
cores, that was most of the time from a job's last line to its end. atexit handlers still run;
only objects in reference cycles still alive at exit are not finalized, which Python never
promised. Standard library only, Python 3.8 and newer.
"""

import atexit
import gc
import runpy

if __name__ == "__main__":
    atexit.register(gc.freeze)  # registered first, so it runs after every other handler
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
