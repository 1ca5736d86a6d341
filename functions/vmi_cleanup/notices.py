"""vmi-cleanup's report step: the cleanup's Event and reply, and what a later delivery or tick says of a cleanup
whose own delivery could not (handler.py acts; this module tells).

An act's Event (`VMICleanedUp`) is counted once per VMI uid and keeps the delivery that reported it and its reply
(wording.ACTED_ON, wording.REPLY): a redelivery of that event answers with that reply again (`gone`), and two
deliveries whose DELETEs both lost their answer announce it once. A DELETE's intent, kept before it was sent
(intents.py), lets a delivery or tick that finds its VMI deleting or gone report it (`report_intent`,
`settle_intents`).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from functions.vmi_cleanup import intents, wording
from functions.vmi_cleanup import memory as memories
from functions.vmi_cleanup.decide import Action, Verdict
from functions.vmi_cleanup.settings import Settings
from shared import kubevirt as kv
from shared.errors import VmeventsError
from shared.finding import report
from shared.kinds import VMI
from shared.kube import Forbidden
from shared.replies import Reply
from shared.runtime import KubeContext, Outcome

ACTED_ON, REPLY = wording.ACTED_ON, wording.REPLY


def ended(fresh: dict[str, Any] | None, meta: Mapping[str, Any]) -> bool:
    """The VMI of `meta` is gone, replaced, or being deleted (KubeVirt's finalizer still on it)."""
    return fresh is None or kv.meta(fresh).get("uid") != meta["uid"] or bool(kv.meta(fresh).get("deletionTimestamp"))


def cleaned(verdict: Verdict, vmi: dict[str, Any], vm: dict[str, Any] | None, ctx: KubeContext[Settings],
            effect: str, basis: memories.Basis | None = None, delivery: str | None = None) -> Outcome:
    """The Event and the reply. An act's Event is counted once per VMI (a dry run's each time it is decided, with
    the basis of its verdict: memory.py): counted for this VMI already, another delivery acted and reported (two
    DELETEs that lost their answers cannot tell whose was applied), and nothing is announced. An act's Event keeps
    the delivery that acted and its reply, for a redelivery of that event (`gone`)."""
    dry = wording.is_dry_run(effect)
    reason = wording.DRY_RUN if dry else wording.CLEANED_UP
    reply = report(wording.finding(effect, vmi, vm, verdict), "cleaned")
    kept = {ACTED_ON: delivery, REPLY: json.dumps(asdict(reply), sort_keys=True)} if delivery and not dry else None
    meta = kv.meta(vmi)
    if not ctx.recorder.record(vm or vmi, "Normal", reason, wording.event_message(effect, vmi, verdict), ctx.clock(),
                               once_for=None if dry else meta.get("uid"), annotations=kept,
                               refresh={memories.BASIS: basis.encode()} if basis else None):
        return gone(ctx, meta["namespace"], meta["name"], meta.get("uid"), delivery, kv.api_path(vmi),
                    "the VMI was deleted; another delivery reported it")
    return Outcome(verdict.action.value, effect=effect, subject=kv.api_path(vmi), reason=verdict.reason, reply=reply)


def gone(ctx: KubeContext[Settings], namespace: str, name: str | None, uid: str | None, delivery: str | None,
         subject: str | None, reason: str) -> Outcome:
    """Nothing (more) to do. When this is a redelivery of the event whose delivery cleaned the VMI up, that
    delivery's reply again, same id: the broker redelivers an event whose reply it could not take in (the
    channel's reply to the broker's ingress failed), and only this answer can still announce the cleanup."""
    event = ctx.recorder.recorded_once(namespace, name, "Normal", wording.CLEANED_UP, uid) if name and uid else None
    annotations = ((event or {}).get("metadata") or {}).get("annotations") or {}
    if delivery and annotations.get(ACTED_ON) == delivery:
        try:
            reply = Reply(**json.loads(annotations[REPLY]))
        except (KeyError, TypeError, ValueError):
            reply = None
        if reply is not None:
            return Outcome("gone", subject=subject, reply=reply,
                           reason=f"{reason}; this event's earlier delivery cleaned it up: its notice again")
    if event is None and not ctx.settings.dry_run:  # nobody reported it: a DELETE of ours whose answer was lost?
        reported = report_intent(ctx, intents.find(ctx.kube, ctx.settings.intents, namespace, name, uid), delivery)
        if reported is not None:
            return reported
    return Outcome("gone", subject=subject, reason=reason)


def report_intent(ctx: KubeContext[Settings], kept: intents.Intent | None, delivery: str | None) -> Outcome | None:
    """Report the cleanup a kept intent stands for, its VMI found deleting or gone: the Event (counted once for the
    VMI's uid, keeping this delivery and the reply) and the reply, as the DELETE's own delivery would have; None
    when there is no intent, or someone reported it already (then only the intent is removed)."""
    if kept is None:
        return None
    notes = {ACTED_ON: delivery, REPLY: json.dumps(kept.reply, sort_keys=True)} if delivery else None
    first = ctx.recorder.record(kept.involved, "Normal", wording.CLEANED_UP, kept.message, ctx.clock(),
                                once_for=kept.uid, annotations=notes)
    intents.forget(ctx.kube, ctx.settings.intents, kept)
    if not first:
        return None
    return Outcome(Action.DELETE_VMI.value, effect="deleted-vmi", subject=kept.reply.get("subject"),
                   reason=f"a DELETE whose answer was lost (delivery {kept.delivery or 'of a re-scan'}) was applied",
                   reply=Reply(**kept.reply))


def settle_intents(ctx: KubeContext[Settings]) -> list[Reply]:
    """A tick's look at the intents kept (one GET, and one per intent): report those whose VMI is deleting, gone or
    replaced; remove those whose DELETE can no longer be applied (the VMI changed since, or HELD_AT_MOST passed with
    it unchanged); leave the rest (a DELETE may still be held, or in flight). A failure is that intent's alone."""
    replies = []
    for kept in intents.load(ctx.kube, ctx.settings.intents):
        try:
            vmi = ctx.kube.get(VMI, kept.namespace, kept.name)
            if ended(vmi, {"uid": kept.uid}):
                done = report_intent(ctx, kept, None)
                if done is not None and done.reply is not None:
                    replies.append(done.reply)
            elif kv.meta(vmi).get("resourceVersion") != kept.resource_version or kept.expired(ctx.clock()):
                intents.forget(ctx.kube, ctx.settings.intents, kept)
        except Forbidden:
            raise
        except VmeventsError:
            continue  # that intent's alone: the next tick looks again
    return replies
