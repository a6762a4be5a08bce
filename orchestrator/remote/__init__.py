"""The remote layer: transports (local, SSH), the per-host connection pool, and the node agent's
shipping, decoding and typed replies."""
