"""What each receiver has accepted of a finding, kept on the finding's own Event (shared/ledger.py), and who is
sending to them now. Pure: the values of two annotations, read and written; delivery.py does the I/O.

A receiver's **receipt** is the last transition of the finding it accepted, as a position in the finding's life:
episode 1 firing < episode 1 resolved < episode 2 firing < ... A notice is sent to a receiver only up to where
the receipt does not already reach, so a receiver that accepted a notice is not sent it again when another receiver
failed and the broker redelivers, and a firing notice that arrives after its episode's resolution was sent (a
redelivery, a slower replica) is not sent at all. A **claim** says that one delivery is sending the finding's
messages now: it is written with the Event's resourceVersion as precondition before anything is sent, so of two
deliveries at once only one sends, and it lapses at `until`, so a delivery that died does not hold the finding.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from functions.alert_forwarder.received import Received

RECEIPTS = "vmevents.io/alert-receipts"  # annotation: {"<target id>": "<episode>/<firing|resolved>", ...}
CLAIM = "vmevents.io/alert-claim"        # annotation: {"by": "<the delivery's token>", "until": "<RFC 3339>"}
FIRING, RESOLVED = "firing", "resolved"
_STAGES = (FIRING, RESOLVED)


@dataclass(frozen=True, order=True)
class Position:
    """A place in a finding's life: an episode, and whether it was announced firing or resolved there."""

    episode: int
    stage: int  # 0: firing, 1: resolved

    @property
    def resolved(self) -> bool:
        return self.stage == 1

    def __str__(self) -> str:
        return f"{self.episode}/{_STAGES[self.stage]}"


def firing(episode: int) -> Position:
    return Position(episode, 0)


def resolved(episode: int) -> Position:
    return Position(episode, 1)


NOWHERE = Position(0, 1)  # before every episode: what a receiver with no receipt has accepted


@dataclass(frozen=True)
class Claim:
    by: str
    until: datetime


@dataclass(frozen=True)
class OnRecord:
    """A finding's Event as a notice's delivery reads it: the episode on record and its state, what each receiver
    has accepted, who is sending now, and the version every write to it is conditioned on."""

    namespace: str
    name: str
    resource_version: str
    finding: Received           # the finding as on record (its state: detected while open, else resolved)
    episode: int
    open: bool
    opened_at: datetime | None
    receipts: Mapping[str, Position] = field(default_factory=dict)
    claim: Claim | None = None

    @property
    def position(self) -> Position:
        return firing(self.episode) if self.open else resolved(self.episode)

    def accepted(self, target: str) -> Position:
        return self.receipts.get(target, NOWHERE)


def read_receipts(text: Any) -> dict[str, Position]:
    """The receipts an annotation holds; what is unreadable in it counts as nothing accepted."""
    try:
        given = json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}
    found = {}
    for target, value in (given.items() if isinstance(given, dict) else ()):
        episode, _, stage = str(value).partition("/")
        if episode.isdigit() and stage in _STAGES:
            found[str(target)] = Position(int(episode), _STAGES.index(stage))
    return found


def write_receipts(receipts: Mapping[str, Position]) -> str:
    return json.dumps({target: str(position) for target, position in sorted(receipts.items())},
                      separators=(",", ":"))


def advance(receipts: Mapping[str, Position], reached: Mapping[str, Position]) -> dict[str, Position]:
    """The receipts once `reached` were accepted: each receiver's furthest position (a receipt never goes back)."""
    merged = dict(receipts)
    for target, position in reached.items():
        merged[target] = max(position, merged.get(target, NOWHERE))
    return merged


def read_claim(text: Any) -> Claim | None:
    try:
        given = json.loads(text) if isinstance(text, str) and text else None
        if not isinstance(given, dict) or not given.get("by"):
            return None
        until = datetime.fromisoformat(str(given["until"]).replace("Z", "+00:00"))
    except (ValueError, KeyError):
        return None
    return Claim(str(given["by"]), until) if until.tzinfo is not None else None


def write_claim(claim: Claim) -> str:
    return json.dumps({"by": claim.by, "until": claim.until.isoformat(timespec="seconds").replace("+00:00", "Z")},
                      separators=(",", ":"))
