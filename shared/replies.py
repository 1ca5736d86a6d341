"""The CloudEvents a function answers with, so that other functions (and alerts) can follow up.

Type `io.vmevents.<function>.<what>`, source `/vmevents/<function>`, subject the object's API
path, data a JSON object. The id is derived from what the reply is about, so a redelivered event
produces a reply with the same id and consumers can deduplicate.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

_NAMESPACE = uuid.UUID("6f1c9a6e-2f53-4c44-9a8e-7d0b3c1e5a10")


@dataclass(frozen=True)
class Reply:
    type: str
    subject: str
    data: dict[str, Any]
    key: str  # what makes two replies "the same" (e.g. the VMI's uid and the action)

    @property
    def id(self) -> str:
        """The CloudEvent id: the same type and key always give the same id."""
        return str(uuid.uuid5(_NAMESPACE, f"{self.type}\x00{self.key}"))

    def headers_and_body(self, function: str) -> tuple[dict[str, str], bytes]:
        """Binary-mode CloudEvent: attributes in ce-* headers, the data as the JSON body."""
        headers = {
            "ce-specversion": "1.0",
            "ce-id": self.id,
            "ce-type": self.type,
            "ce-source": f"/vmevents/{function}",
            "ce-subject": self.subject,
            "Content-Type": "application/json",
        }
        return headers, json.dumps(self.data, sort_keys=True).encode()


def reply_type(function: str, what: str) -> str:
    return f"io.vmevents.{function}.{what}"
