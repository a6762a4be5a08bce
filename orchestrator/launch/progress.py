"""A running job's progress as the observer shows it: step, steps/s, step times, ETA, the slowest
rank (data only; orchestrator/watch/ computes it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Status:
    """The job's progress now, for the status line and the pulse."""

    step: int
    total: int | None
    rate: float | None  # steps per second (the ranks' median)
    p50_ms: float | None
    p95_ms: float | None
    slowest: str | None  # the last round's slowest rank, when it is noticeably slower
    quiet_s: float  # seconds since a rank last stepped

    @property
    def eta_s(self) -> float | None:
        if self.total is None or not self.rate or self.step >= self.total:
            return None
        return (self.total - self.step) / self.rate

    def text(self, quiet_from: float = 10.0) -> str:
        """One line; "no step for ..." once no rank has stepped for `quiet_from` seconds."""
        parts = [f"step {self.step}" + (f"/{self.total}" if self.total else "")]
        if self.rate is not None:
            parts.append(f"{self.rate:.3g} steps/s")
        if self.p50_ms is not None and self.p95_ms is not None:
            parts.append(f"step {_ms(self.p50_ms)} (p95 {_ms(self.p95_ms)})")
        if self.eta_s is not None:
            parts.append(f"ETA {duration(self.eta_s)}")
        if self.slowest:
            parts.append(f"slowest {self.slowest}")
        if self.quiet_s >= quiet_from and self.quiet_s >= 1:
            parts.append(f"no step for {duration(self.quiet_s)}")
        return " · ".join(parts)


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
