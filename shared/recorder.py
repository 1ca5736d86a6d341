"""Kubernetes Events about what a function did or found, deduplicated and best-effort.

The same Event again raises `count` on the existing object instead of creating another one, as
client-go's EventCorrelator does: the name is derived from what makes two Events "the same"
(involved object, type, reason, message). Recording is best-effort: a failure is logged and never
fails the handling (kopf `events.py`), except RBAC's refusal (`Forbidden`): a missing grant is the
configuration's failure, which no retry mends, and it must reach the dead letter (a 500) rather than leave
every finding unrecorded in silence.
"""
from __future__ import annotations

import hashlib
import logging
import random
import time
from datetime import datetime

from shared.errors import VmeventsError
from shared.kinds import EVENT
from shared.kube import Conflict, Forbidden, Kube

log = logging.getLogger("vmevents.recorder")
COUNT_ATTEMPTS = 8
# On an Event recorded `once_for` something: the last thing it was counted for.
COUNTED_FOR = "vmevents.io/counted-for"


def _timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _counted_for(event: dict) -> str | None:
    return ((event.get("metadata") or {}).get("annotations") or {}).get(COUNTED_FOR)


def event_name(involved: dict, event_type: str, reason: str, message: str, once_for: str | None = None) -> str:
    """The Event's name: the same for the same Event, so that it is counted again. One recorded `once_for`
    something is named by that alone (with the involved object's name, type and reason), so that it can be found
    again from what it was counted for (once_event_name)."""
    meta = involved["metadata"]
    if once_for is not None:
        return once_event_name(meta["name"], event_type, reason, once_for)
    key = "\x00".join((meta.get("uid", ""), meta["name"], event_type, reason, message))
    return f"{meta['name']}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def once_event_name(involved_name: str, event_type: str, reason: str, once_for: str) -> str:
    key = "\x00".join(("once", involved_name, event_type, reason, once_for))
    return f"{involved_name}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"


class Recorder:
    def __init__(self, kube: Kube, component: str):
        self.kube = kube
        self.component = component

    def record(self, involved: dict, event_type: str, reason: str, message: str, now: datetime, *,
               annotations: dict[str, str] | None = None, once_for: str | None = None,
               refresh: dict[str, str] | None = None) -> bool:
        """Record (or count again) an Event on `involved`. Never raises, but Forbidden. `annotations` go on a new
        Event's metadata (machine-readable facts a function reads back later); they are not part of
        what makes two Events the same. `refresh`: annotations written on a new Event and again each time it is
        counted (what it was last recorded about, e.g. a dry run's objects' versions). `once_for` (e.g. the uid of
        the VMI an act was about): count the Event once for it, as when one act is reported by two deliveries that
        cannot tell which of them did it; the Event keeps the last one it was counted for (COUNTED_FOR). False
        when it was counted for it already (the count stays), True otherwise (also when the Event could not be
        recorded: best-effort)."""
        try:
            return self._record(involved, event_type, reason, message, now, annotations, once_for, refresh)
        except Forbidden:
            raise
        except VmeventsError as exc:
            log.warning("could not record Event %s on %s/%s: %s", reason,
                        involved["metadata"].get("namespace"), involved["metadata"]["name"], exc.message)
            return True

    def record_once(self, involved: dict, event_type: str, reason: str, message: str, now: datetime, *,
                    annotations: dict[str, str] | None = None) -> dict | None:
        """Record an Event that marks a one-time transition: None when this call recorded it (or could not:
        best-effort, as record), else the Event someone recorded before, whose count stays as it is."""
        body = self._body(involved, event_type, reason, message, now, annotations)
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            self.kube.create(EVENT, namespace, body)
        except Conflict:  # AlreadyExists
            try:
                return self.kube.get(EVENT, namespace, name)
            except Forbidden:
                raise
            except VmeventsError as exc:
                log.warning("could not read back Event %s/%s: %s", namespace, name, exc.message)
        except Forbidden:
            raise
        except VmeventsError as exc:
            log.warning("could not record Event %s on %s/%s: %s", reason, namespace, involved["metadata"]["name"],
                        exc.message)
        return None

    def recorded_once(self, namespace: str, involved_name: str, event_type: str, reason: str,
                      once_for: str) -> dict | None:
        """The Event recorded `once_for` that thing on the object named so, or None."""
        event = self.kube.get(EVENT, namespace, once_event_name(involved_name, event_type, reason, once_for))
        return event if event is not None and _counted_for(event) == once_for else None

    def _record(self, involved: dict, event_type: str, reason: str, message: str, now: datetime,
                annotations: dict[str, str] | None = None, once_for: str | None = None,
                refresh: dict[str, str] | None = None) -> bool:
        written = dict(refresh or {})
        if once_for is not None:
            written[COUNTED_FOR] = once_for
        body = self._body(involved, event_type, reason, message, now, {**(annotations or {}), **written},
                          once_for)
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            self.kube.create(EVENT, namespace, body)
        except Conflict:  # AlreadyExists: the same Event again
            return self._count_again(namespace, name, body, body["lastTimestamp"], once_for, written)
        return True

    def _body(self, involved: dict, event_type: str, reason: str, message: str, now: datetime,
              annotations: dict[str, str] | None, once_for: str | None = None) -> dict:
        meta = involved["metadata"]
        namespace = meta.get("namespace") or "default"
        name = event_name(involved, event_type, reason, message, once_for)
        stamp = _timestamp(now)
        metadata = {"name": name, "namespace": namespace}
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1", "kind": "Event", "metadata": metadata,
            "involvedObject": {"apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"),
                               "name": meta["name"], "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": event_type, "reason": reason, "message": message,
            "source": {"component": self.component},
            "reportingComponent": f"vmevents.io/{self.component}",
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        return body

    def _count_again(self, namespace: str, name: str, body: dict, stamp: str, once_for: str | None = None,
                     written: dict[str, str] | None = None) -> bool:
        """count + 1 on the existing Event. Two deliveries may do this at once: the resourceVersion
        precondition makes the loser re-read and try again (after a short random pause, so that
        racers spread out), and no count is lost; with `once_for`, the loser then sees the winner's
        count for the same thing and leaves it (False)."""
        for attempt in range(COUNT_ATTEMPTS):
            if attempt:
                time.sleep(random.uniform(0, 0.01 * attempt))
            existing = self.kube.get(EVENT, namespace, name)
            try:
                if existing is None:
                    self.kube.create(EVENT, namespace, body)
                elif once_for is not None and _counted_for(existing) == once_for:
                    return False
                else:
                    metadata: dict = {"resourceVersion": existing["metadata"]["resourceVersion"]}
                    if written:
                        metadata["annotations"] = dict(written)
                    self.kube.merge_patch(EVENT, namespace, name, {
                        "count": int(existing.get("count") or 1) + 1, "lastTimestamp": stamp, "metadata": metadata})
                return True
            except Conflict:
                continue
        raise Conflict(f"Event {namespace}/{name} kept changing; its count was not raised")
