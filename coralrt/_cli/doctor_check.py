"""The result of one ``coralrt doctor`` check."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Check", "STATUSES"]

STATUSES = ("ok", "warn", "fail", "skip", "info")


@dataclass
class Check:
    """``status``: one of :data:`STATUSES`; ``found``: what was found; ``fix``:
    the exact remedy when the status is not ``ok`` (may span lines)."""

    name: str
    status: str
    found: str
    fix: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")

    def to_dict(self) -> dict:
        return asdict(self)
