"""An account in words: the one line `up` ends with, and the rows `ddpctl runs` shows."""

from __future__ import annotations

from orchestrator.account.compute import REDONE, Account, Part

SHOWN_FROM_S = 0.5  # a part that rounds to 0 s is not told


def seconds(value: float) -> str:
    """12 s, 3.4 min, 2.1 h: as a person reads a duration."""
    if value < 600:
        return f"{value:.0f} s"
    if value < 36000:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def percent(goodput: float | None) -> str:
    return "?" if goodput is None else f"{goodput * 100:.0f} %"


def line(account: Account) -> str:
    """`goodput 51 % (107 s of 210 s): 89 s to node0 (lost: 60 s detection, 16 s fencing, 12 s
    relaunch, 1 s re-done since step 121), 14 s start-up`."""
    head = (f"goodput {percent(account.goodput)} ({seconds(account.productive_s)} of "
            f"{seconds(account.wall_s)})") if account.stepped else \
        f"goodput unknown (no rank took an optimizer step the rank wrapper saw) in {seconds(account.wall_s)}"

    said = [_host(account, host, total) for host, total in account.by_host().items() if total >= SHOWN_FROM_S]
    said += [_kind(account, part) for part in account.parts if part.host is None and part.seconds >= SHOWN_FROM_S]
    if account.restarted and not account.redone.known:
        said.append("re-done work unknown (no [restart] checkpoint_dir to see)")
    return head + (": " + ", ".join(said) if said else "")


def _host(account: Account, host: str, total: float) -> str:
    causes: dict[str, list[Part]] = {}
    for part in account.parts:
        if part.host == host and part.seconds >= SHOWN_FROM_S:
            causes.setdefault(part.cause, []).append(part)
    inner = "; ".join(f"{cause}: " + ", ".join(_kind(account, p) for p in parts) if parts[0].kind != cause
                      else ", ".join(_kind(account, p) for p in parts) for cause, parts in causes.items())
    return f"{seconds(total)} to {host}" + (f" ({inner})" if inner else "")


def _kind(account: Account, part: Part) -> str:
    text = f"{seconds(part.seconds)} {part.kind}"
    if part.kind == REDONE and account.redone.since_step is not None:
        text += f" since step {account.redone.since_step}"
    elif part.host is None and part.cause and part.cause not in (part.kind, "start-up", "finishing"):
        text += f" ({part.cause})"
    return text


def biggest(account: Account) -> str:
    """The biggest loss, in a few words ("88 s to node0", "14 s start-up"); "" for none."""
    top = account.biggest()
    if top is None:
        return ""
    name, value = top
    return f"{seconds(value)} to {name}" if name in account.by_host() else f"{seconds(value)} {name}"
