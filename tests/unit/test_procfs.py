"""node_agent.host.procfs: /proc/<pid>/stat lines (recorded, then live) parsed into ProcStat."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from node_agent.host.procfs import ProcStat, parse_stat, read_stat

# The fields after the comm, as a Linux 6.x kernel wrote them (cat's own line: state R ... starttime 131874).
TAIL = ("R 31425 31425 10003 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 131874 3133440 359 18446744073709551615 "
        "94095831752704 94095831772585 140725539953968 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 94095831788592 "
        "94095831790208 94096254373888 140725539957475 140725539957495 140725539957495 140725539958763 0\n")
INIT = ("1 (process_api) S 0 0 0 0 -1 4194560 35348 11880167 0 336 71 439 41210 6702 20 0 13 0 25 41947136 2978 "
        "18446744073709551615 1 1 0 0 0 0 0 4096 1256 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
ZOMBIE = "4242 (python3) Z 4200 4200 10003 0 -1 4227148 0 0 0 0 0 0 0 0 20 0 1 0 5000 0 0 18446744073709551615\n"


@pytest.mark.parametrize(("line", "expected"), [
    ("31427 (cat) " + TAIL, ProcStat(31427, "cat", "R", 31425, 31425, 131874)),
    (INIT, ProcStat(1, "process_api", "S", 0, 0, 25)),
    (ZOMBIE, ProcStat(4242, "python3", "Z", 4200, 4200, 5000)),
    ("31427 (tmux: server) " + TAIL, ProcStat(31427, "tmux: server", "R", 31425, 31425, 131874)),
    ("31427 (a) b (c) " + TAIL, ProcStat(31427, "a) b (c", "R", 31425, 31425, 131874)),
    # a comm that forges the fields a split at the first ")" would read: state Z, ppid 1, pgrp 1
    ("31429 (a) Z 1 1 (c) " + TAIL, ProcStat(31429, "a) Z 1 1 (c", "R", 31425, 31425, 131874)),
    ("31427 ()) " + TAIL, ProcStat(31427, ")", "R", 31425, 31425, 131874)),
    ("31427 (kworker/0:1-events) " + TAIL, ProcStat(31427, "kworker/0:1-events", "R", 31425, 31425, 131874)),
], ids=["plain", "init", "zombie", "spaces", "parens", "forged-fields", "only-paren", "kernel-thread"])
def test_parse_stat_splits_at_the_last_paren(line: str, expected: ProcStat) -> None:
    assert parse_stat(line) == expected


@pytest.mark.parametrize("line", [
    "",
    "31427 cat R 31425 31425",  # no parentheses
    "31427 (cat) R 31425 31425 10003",  # cut short before starttime
    "(cat) " + TAIL,  # no pid
    "31427 (cat) R x 31425 " + TAIL,  # a field that is not a number
], ids=["empty", "no-comm", "short", "no-pid", "not-a-number"])
def test_parse_stat_rejects_what_is_not_a_stat_line(line: str) -> None:
    with pytest.raises(ValueError):
        parse_stat(line)


def test_read_stat_of_this_process_agrees_with_the_kernel() -> None:
    stat = read_stat(os.getpid())
    assert stat is not None
    assert (stat.pid, stat.ppid, stat.pgrp, stat.state) == (os.getpid(), os.getppid(), os.getpgrp(), "R")
    assert stat.start_ticks > 0 and read_stat(os.getpid()) == stat


def test_read_stat_of_a_process_that_renamed_itself_to_forge_fields() -> None:
    """A process may set its comm to anything (15 bytes): the kernel's fields still come back."""
    code = ("import sys, time; open('/proc/self/comm', 'w').write('a) Z 1 1 (c'); "
            "print('ready', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        stat = read_stat(proc.pid)
        assert stat is not None
        assert (stat.comm, stat.ppid, stat.pgrp) == ("a) Z 1 1 (c", os.getpid(), os.getpgrp())
        assert stat.state in ("R", "S"), stat  # running or asleep, not the forged zombie
    finally:
        proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_read_stat_of_a_reaped_process_is_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    assert read_stat(proc.pid) is None


# state ... starttime 5000 (field 22), then fields 23..51 zero, and field 52: the wait status
KILLED_ZOMBIE = ("4243 (python3) Z 4200 4200 10003 0 -1 4227148 0 0 0 0 0 0 0 0 20 0 1 0 5000 0 0 " + "0 " * 27
                 + "{status}\n")


@pytest.mark.parametrize(("status", "killed_by"), [(9, 9), (11, 11), (134, 6), (3 << 8, None), (0, None)],
                         ids=["sigkill", "sigsegv", "sigabrt-core", "exit-3", "exit-0"])
def test_a_zombies_wait_status_tells_the_signal_that_ended_it(status: int, killed_by: int | None) -> None:
    stat = parse_stat(KILLED_ZOMBIE.format(status=status))
    assert (stat.state, stat.exit_status, stat.killed_by) == ("Z", status, killed_by)


def test_a_live_process_was_killed_by_nothing() -> None:
    stat = parse_stat("31427 (cat) " + TAIL)
    assert stat.exit_status == 0 and stat.killed_by is None
