"""A test that needs what this machine may lack (a cluster, Slurm, Chromium, promtool): skipped here,
failed under DDPCTL_REQUIRE_CLUSTER=1 (CI, where .ci/run installs all of it)."""

from __future__ import annotations

import os
from typing import NoReturn


def missing(reason: str) -> NoReturn:
    """Skip the test for `reason`, or fail it under DDPCTL_REQUIRE_CLUSTER=1."""
    import pytest

    if os.environ.get("DDPCTL_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"DDPCTL_REQUIRE_CLUSTER=1 but {reason}", pytrace=False)
    pytest.skip(reason)
