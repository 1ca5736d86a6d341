"""The DELETEs vmi-cleanup sends, kept before they are sent, so that a cleanup is announced whoever hears of it.

A DELETE whose answer is lost may still be applied: with etcd away, kube-apiserver holds it and applies it when etcd
is back, up to its request timeout (60 s by default: docs/facts.md §8). The delivery that sent it cannot wait that
long (the broker gives up after 30 s), and whoever comes next finds the VMI deleting or gone with nothing saying
whose DELETE that was: the cleanup happened and nobody announced it (issue 34). So before the DELETE, its intent is
kept: the VMI's uid and resourceVersion (the DELETE's preconditions), the delivery, and what the cleanup will say
(the Event's object and message, the reply). Any later delivery or tick that finds that uid gone, replaced or
deleting reports it from the intent, once: the cleanup's Event is counted once per VMI uid (notices.py), and
the reply's id comes from the VMI's uid, whoever sends it.

The intents live in one ConfigMap in vmevents' namespace (`CLEANUP_INTENTS`), one key per VMI uid, as device-conflict
and migration-report keep their state (shared/configmaps.py). An intent is written with a JSON merge patch of its
key (deliveries at once write their own keys without a conflict), and removed with a JSON patch that first tests it
is still the one read (a newer intent of the same VMI, sent by another delivery, stays). One is removed when its
DELETE was answered, when it was reported, and by a tick when it can no longer be applied: its VMI changed since
(its resourceVersion is not the precondition's) or it is older than HELD_AT_MOST with the VMI unchanged.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from shared.configmaps import CONFIG_MAP
from shared.errors import VmeventsError
from shared.finding import stamp
from shared.kube import Conflict, Forbidden, Kube, NotFound, Vanished

log = logging.getLogger("vmevents.vmi-cleanup")
# kube-apiserver gives up on a request after --request-timeout (60 s by default; docs/facts.md §8): a DELETE older
# than that is applied or never will be. The margin covers two pods' clocks and a slow reply.
HELD_AT_MOST = timedelta(minutes=5)


@dataclass(frozen=True)
class Intent:
    """A DELETE about to be sent, and what its cleanup says."""

    uid: str
    namespace: str
    name: str
    resource_version: str            # the DELETE's precondition: a VMI at another version was not deleted by it
    delivery: str | None             # the CloudEvent whose delivery sends it (None: a re-scan)
    at: str                          # when it was kept
    involved: dict[str, Any]         # the object its Event is recorded on (the VM, or a standalone VMI)
    message: str                     # the Event's message
    reply: dict[str, Any]            # the reply (shared.replies.Reply as a dict)

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> Intent | None:
        """An intent as kept; None for a value that is not one (it is then left alone, never acted on)."""
        try:
            fields = json.loads(text)
            return cls(**fields) if isinstance(fields, dict) else None
        except (TypeError, ValueError):
            return None

    def kept_at(self) -> datetime | None:
        try:
            return datetime.fromisoformat(self.at.replace("Z", "+00:00"))
        except ValueError:
            return None

    def expired(self, now: datetime) -> bool:
        kept = self.kept_at()
        return kept is None or now - kept > HELD_AT_MOST


def intent(vmi: Mapping[str, Any], involved: Mapping[str, Any], delivery: str | None, now: datetime, message: str,
           reply: dict[str, Any]) -> Intent:
    meta, target = vmi["metadata"], involved["metadata"]
    return Intent(meta["uid"], meta["namespace"], meta["name"], meta["resourceVersion"], delivery, stamp(now),
                  {"apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"),
                   "metadata": {"name": target["name"], "namespace": target.get("namespace"),
                                "uid": target.get("uid")}}, message, reply)


def keep(kube: Kube, where: tuple[str, str], kept: Intent) -> None:
    """Write the intent before its DELETE is sent; a failure is raised (then no DELETE is sent)."""
    namespace, name = where
    for _ in range(3):
        try:
            kube.merge_patch(CONFIG_MAP, namespace, name, {"data": {kept.uid: kept.encode()}})
            return
        except Vanished:  # no ConfigMap yet (a PATCH's 404): create it with this intent
            pass
        try:
            kube.create(CONFIG_MAP, namespace, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "labels": {
                    "app.kubernetes.io/part-of": "vmevents", "app.kubernetes.io/managed-by": "vmi-cleanup"}},
                "data": {kept.uid: kept.encode()}})
            return
        except Conflict:  # created meanwhile by another delivery: patch it
            continue
    raise Conflict(f"ConfigMap {namespace}/{name} could not be written")


def forget(kube: Kube, where: tuple[str, str], kept: Intent) -> None:
    """Remove the intent if it is still the one kept (a newer one of the same VMI stays). Best-effort: one left
    behind is settled by a tick. RBAC's refusal is raised: the configuration's failure."""
    namespace, name = where
    path = "/data/" + kept.uid.replace("~", "~0").replace("/", "~1")
    try:
        kube.json_patch(CONFIG_MAP, namespace, name, [{"op": "test", "path": path, "value": kept.encode()},
                                                      {"op": "remove", "path": path}])
    except (Conflict, NotFound):
        pass  # replaced by a newer intent, removed already, or no ConfigMap at all
    except Forbidden:
        raise
    except VmeventsError as exc:
        log.warning("could not remove the intent of VMI %s/%s (%s) from %s/%s: %s", kept.namespace, kept.name,
                    kept.uid, namespace, name, exc.message)


def load(kube: Kube, where: tuple[str, str]) -> list[Intent]:
    """Every intent kept (one GET; none without the ConfigMap)."""
    found = kube.get(CONFIG_MAP, *where)
    data = (found or {}).get("data") or {}
    kept = [Intent.decode(text) for text in data.values() if isinstance(text, str)]
    return sorted((i for i in kept if i is not None), key=lambda i: (i.namespace, i.name, i.uid))


def find(kube: Kube, where: tuple[str, str], namespace: str, name: str | None, uid: str | None) -> Intent | None:
    """The intent of the VMI with this uid, else (no uid known) of the last one kept for this namespace and name."""
    matching = [i for i in load(kube, where) if i.uid == uid or (uid is None and i.namespace == namespace
                                                                  and i.name == name)]
    return max(matching, key=lambda i: i.at) if matching else None
