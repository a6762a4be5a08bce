"""Doctor's checks and the facts they read: the context a job gives (context.py), one agent session
per host that gathers facts and runs the TCP probe (gather.py), the addresses and interfaces the
ranks will use (addressing.py), and pure checks, facts -> findings, each declaring its spec in its
own module (spec.py; catalog.py finds them and builds every list of checks, registry.py runs them).
`ddpctl doctor` (orchestrator/doctor/) and the launch's pre-launch round trip
(orchestrator/launch/preflight.py) both run them; nothing here launches a job."""
