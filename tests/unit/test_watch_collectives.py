"""The hang verdict from the ranks' flight records (orchestrator/hostops/collectives.py): the
rank wrapper's trimmed entries parsed, then which collective the job is stuck in and which rank
never entered it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from orchestrator.hostops.collectives import Collective, CollectiveVerdict, RankRecords, parse_entries, verdict

DEFAULT_PG = ["0", "default_pg"]
HOSTS = {0: "node0", 1: "node0", 2: "node1", 3: "node1"}
WHERE = "`load_batch` at train.py:88"


def entry(seq: int, op: str = "all_reduce", retired: bool = True, pg: Sequence[str] = DEFAULT_PG,
          backend: str = "gloo", p2p: bool = False) -> dict[str, Any]:
    """One entry as the rank wrapper writes it into its dump (node_agent/rank/rankwrap.py FR_KEYS)."""
    return {"collective_seq_id": 0 if p2p else seq, "p2p_seq_id": seq if p2p else 0, "pg_id": int(pg[0]),
            "process_group": list(pg), "profiling_name": f"{backend}:{op}", "retired": retired, "is_p2p": p2p,
            "input_sizes": [[3]]}


def upto(last: int, in_flight: bool = False, op: str = "all_reduce",
         pg: Sequence[str] = DEFAULT_PG) -> list[dict[str, Any]]:
    """A rank's entries #1..#last of a group, every one returned but the last when in_flight."""
    return [entry(seq, op, retired=not (in_flight and seq == last), pg=pg) for seq in range(1, last + 1)]


def rank(r: int, entries: list[dict[str, Any]] | None, where: str | None = None, why: str | None = None) -> RankRecords:
    return RankRecords(HOSTS[r], r, parse_entries(entries) if entries is not None else None, where, why)


# -- parse_entries ----------------------------------------------------------------------------------


def test_an_entry_is_parsed_with_the_backends_prefix_dropped() -> None:
    parsed = parse_entries([{"collective_seq_id": 16, "p2p_seq_id": 0, "pg_id": 0,
                             "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce",
                             "retired": False, "is_p2p": False, "input_sizes": [[3]]}])
    assert parsed == (Collective("0", 16, "all_reduce", False, "[[3]]"),)


def test_point_to_point_and_unnumbered_entries_are_left_out() -> None:
    entries = [entry(1), entry(5, "send", p2p=True), entry(2, "recv", p2p=True),
               {"collective_seq_id": 0, "profiling_name": "nccl:barrier"},
               {"collective_seq_id": "3", "profiling_name": "nccl:all_reduce"}, entry(2, backend="nccl")]
    parsed = parse_entries(entries)
    assert [(c.seq, c.op) for c in parsed] == [(1, "all_reduce"), (2, "all_reduce")]


def test_the_group_falls_back_to_pg_id_and_a_nameless_op_is_a_collective() -> None:
    (c,) = parse_entries([{"collective_seq_id": 4, "pg_id": 2, "retired": True}])
    assert (c.group, c.seq, c.op, c.done, c.sizes) == ("2", 4, "collective", True, "")


# -- verdict ----------------------------------------------------------------------------------------


def test_one_rank_behind_is_named_with_its_host_and_where_it_is() -> None:
    ranks = [rank(0, upto(16, in_flight=True)), rank(1, upto(15), WHERE),
             rank(2, upto(16, in_flight=True)), rank(3, upto(16, in_flight=True))]
    found = verdict(ranks)
    assert found is not None
    assert found.text == ("all_reduce #16 on the default group: ranks 0, 2, 3 entered, rank 1 never did (node0)"
                          " — rank 1 is in `load_batch` at train.py:88")
    assert (found.group, found.seq, found.op, found.entered, found.missing) == ("0", 16, "all_reduce", (0, 2, 3), (1,))


def test_the_rank_order_of_the_input_does_not_matter() -> None:
    ranks = [rank(3, upto(16, in_flight=True)), rank(1, upto(15), WHERE), rank(2, upto(16, in_flight=True)),
             rank(0, upto(16, in_flight=True))]
    found = verdict(ranks)
    assert found is not None and found.entered == (0, 2, 3) and "ranks 0, 2, 3 entered" in found.text


def test_a_rank_further_behind_says_its_last_collective() -> None:
    ranks = [rank(0, upto(16, in_flight=True)), rank(1, upto(16, in_flight=True)),
             rank(2, upto(14), WHERE), rank(3, upto(16, in_flight=True))]
    found = verdict(ranks)
    assert found is not None
    assert found.text == ("all_reduce #16 on the default group: ranks 0, 1, 3 entered, rank 2 never did (node1)"
                          " — rank 2 is in `load_batch` at train.py:88; its last was all_reduce #14")
    assert found.missing == (2,)


def test_a_rank_without_a_stack_says_so() -> None:
    ranks = [rank(0, upto(3, in_flight=True)), rank(1, upto(2))]
    found = verdict(ranks)
    assert found is not None and found.text.endswith("— rank 1 gave no stack")


def test_a_stopped_rank_is_missing_and_did_not_answer() -> None:
    why = "the process is stopped (SIGSTOP): it cannot answer"
    ranks = [rank(0, upto(16, in_flight=True)), rank(1, None, why=why),
             rank(2, upto(16, in_flight=True)), rank(3, upto(16, in_flight=True))]
    found = verdict(ranks)
    assert found is not None
    assert found.text == ("all_reduce #16 on the default group: ranks 0, 2, 3 entered, rank 1 never did (node0)"
                          f" — rank 1 did not answer: {why}")
    assert (found.entered, found.missing) == ((0, 2, 3), (1,))


def test_a_behind_rank_and_a_silent_one_are_both_missing() -> None:
    ranks = [rank(0, upto(16, in_flight=True)), rank(1, upto(15), WHERE),
             rank(2, None, why="did not answer in 5 s"), rank(3, upto(16, in_flight=True))]
    found = verdict(ranks)
    assert found is not None
    assert "ranks 0, 3 entered, ranks 1, 2 never did (node0, node1)" in found.text
    assert "rank 1 is in `load_batch`" in found.text and "rank 2 did not answer: did not answer in 5 s" in found.text
    assert found.missing == (1, 2)


def test_every_rank_in_the_same_collective_not_returned() -> None:
    ranks = [rank(r, upto(16, in_flight=True)) for r in range(4)]
    found = verdict(ranks)
    assert found is not None
    assert found.text.startswith("all_reduce #16 on the default group: every rank entered it and none returned")
    assert (found.seq, found.op, found.entered, found.missing) == (16, "all_reduce", (0, 1, 2, 3), ())


def test_every_rank_returned_is_no_verdict() -> None:
    assert verdict([rank(r, upto(16)) for r in range(4)]) is None


def test_different_ops_at_the_same_seq_differ_between_the_ranks() -> None:
    ranks = [rank(0, [*upto(15), entry(16, "all_reduce", retired=False)]),
             rank(1, [*upto(15), entry(16, "all_reduce", retired=False)]),
             rank(2, [*upto(15), entry(16, "broadcast", retired=False)]),
             rank(3, [*upto(15), entry(16, "broadcast", retired=False)])]
    found = verdict(ranks)
    assert found is not None
    assert found.text == ("collective #16 on the default group differs between the ranks: ranks 0, 1 in "
                          "all_reduce; ranks 2, 3 in broadcast (they call collectives in a different order)")
    assert found.op is None and found.entered == (0, 1, 2, 3)


def test_a_subgroup_with_some_of_the_ranks() -> None:
    evens = ["1", "evens"]
    ranks = [rank(0, [*upto(10), *upto(5, in_flight=True, pg=evens)]),
             rank(1, upto(10)),
             rank(2, [*upto(10), *upto(4, pg=evens)], WHERE),
             rank(3, upto(10))]
    found = verdict(ranks)
    assert found is not None
    assert found.text == ("all_reduce #5 on process group 1: rank 0 entered, rank 2 never did (node1)"
                          " — rank 2 is in `load_batch` at train.py:88")
    assert (found.group, found.seq, found.entered, found.missing) == ("1", 5, (0,), (2,))


def test_the_default_group_is_judged_before_a_subgroup() -> None:
    evens = ["1", "evens"]
    ranks = [rank(0, [*upto(10, in_flight=True), *upto(5, in_flight=True, pg=evens)]),
             rank(1, upto(9), WHERE),
             rank(2, [*upto(10, in_flight=True), *upto(4, pg=evens)])]
    found = verdict(ranks)
    assert found is not None and found.group == "0" and found.missing == (1,)


def test_a_subgroup_member_that_never_entered_its_first_collective_is_named_from_the_groups_the_ranks_told() -> None:
    """Membership comes from the groups each rank's wrapper reports (c10d's own table), not from the
    entries alone: rank 2 is a member of group 1 that never reached its first collective."""
    evens = ["1", "evens"]
    groups = {"0": (0, 1, 2, 3), "1": (0, 2)}
    ranks = [replace(rank(0, [*upto(10), *upto(1, in_flight=True, pg=evens)]), groups=groups),
             replace(rank(1, upto(10)), groups=groups),
             replace(rank(2, upto(10), WHERE), groups=groups),
             replace(rank(3, upto(10)), groups=groups)]
    found = verdict(ranks)
    assert found is not None and found.group == "1" and found.missing == (2,)
    assert "every rank entered it" not in found.text and "rank 2 never did" in found.text


def test_without_the_groups_a_subgroups_members_are_the_ranks_with_its_entries() -> None:
    evens = ["1", "evens"]
    ranks = [rank(0, [*upto(10), *upto(1, in_flight=True, pg=evens)]), rank(1, upto(10)), rank(2, upto(10), WHERE)]
    found = verdict(ranks)
    assert found is not None and found.group == "1" and found.missing == ()


def test_point_to_point_entries_do_not_count() -> None:
    """Rank 1's sends and receives are numbered apart from the collectives: it is still behind."""
    ranks = [rank(0, upto(16, in_flight=True)),
             rank(1, [*upto(15), entry(16, "send", retired=False, p2p=True), entry(17, "recv", p2p=True)], WHERE),
             rank(2, upto(16, in_flight=True)), rank(3, upto(16, in_flight=True))]
    found = verdict(ranks)
    assert found is not None and found.seq == 16 and found.missing == (1,)


def test_no_answers_at_all_is_no_verdict() -> None:
    assert verdict([rank(r, None, why="the flight recorder is off") for r in range(4)]) is None
    assert verdict([]) is None


def test_silent_ranks_beside_ranks_with_no_collectives_are_listed() -> None:
    found = verdict([rank(0, []), rank(1, None, why="timed out")])
    assert found is not None
    assert found.text == "rank 1 on node0 did not answer: timed out"
    assert found.missing == (1,) and found.seq is None


def test_to_json_round_trips_every_field() -> None:
    ranks = [rank(0, upto(16, in_flight=True)), rank(1, upto(15), WHERE),
             rank(2, upto(16, in_flight=True)), rank(3, upto(16, in_flight=True))]
    found = verdict(ranks)
    assert found is not None
    data = json.loads(json.dumps(found.to_json()))
    assert data == {"text": found.text, "group": "0", "seq": 16, "op": "all_reduce", "entered": [0, 2, 3],
                    "missing": [1]}
    again = CollectiveVerdict(data["text"], data["group"], data["seq"], data["op"], tuple(data["entered"]),
                              tuple(data["missing"]))
    assert again == found


def test_a_silent_rank_is_not_said_to_have_missed_a_collective_its_peers_returned_from() -> None:
    """The others could only return from #16 if rank 1 entered it: rank 1 is silent, not behind."""
    ranks = [rank(0, upto(16)), rank(1, None, why="the process is stopped (state T)"), rank(2, upto(16)),
             rank(3, upto(16))]
    found = verdict(ranks)
    assert found is not None and found.seq is None and found.missing == (1,)
    assert found.text == "rank 1 on node0 did not answer: the process is stopped (state T)"
