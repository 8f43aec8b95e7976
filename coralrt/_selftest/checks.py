"""One self-test check: a name, a status, the reason and what was measured."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Check", "STATUSES", "CHIP_REASON", "ok", "fail", "skipped"]

STATUSES = ("ok", "fail", "skipped")

#: Why a check that needs the chip to execute Google's instructions is skipped
#: on a simulated stick (model outputs, latency of real programs, parameter
#: caching, comparisons with libedgetpu): it is never reported as passed.
CHIP_REASON = "the simulated stick cannot execute Google's Edge TPU programs"


@dataclass
class Check:
    name: str
    status: str                     # "ok" | "fail" | "skipped"
    summary: str                    # one plain-language sentence: what was found, or why not
    measurements: dict = field(default_factory=dict)
    needs_chip: bool = False        # its answer needs the chip to execute Google's programs

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "summary": self.summary,
                "reason": self.summary if self.status != "ok" else None,
                "needs_chip": self.needs_chip, "measurements": self.measurements}


def ok(name: str, summary: str, **measurements) -> Check:
    return Check(name, "ok", summary, measurements)


def fail(name: str, summary: str, **measurements) -> Check:
    return Check(name, "fail", summary, measurements)


def skipped(name: str, reason: str, *, needs_chip: bool = False, **measurements) -> Check:
    return Check(name, "skipped", reason, measurements, needs_chip)
