"""alert-forwarder's I/O: deliver the other functions' findings to Alertmanager and webhooks, where
operators already look, and keep Alertmanager's alerts in step with the findings on record.

Reads top to bottom: parse (which findings a reply event carries; received.py) → decide (pure: per finding,
what each receiver is sent, or a drop with its reason) → act (delivery.py: each finding's record read, the
notice claimed on it, sent, and each receiver's receipt written) → report (the log line; wording.py). A
PingSource tick is a refresh (tick.py): the findings on record are re-posted to Alertmanager page by page,
as Prometheus re-sends its alerts, so that an Alertmanager that restarted or lost a post holds the right
alerts again within a tick.

A receiver that is down or throttling answers 503, one that refuses the alert 502: the broker retries and,
after its retries, dead-letters the finding, so none is lost silently; what a receiver accepted is not sent
to it again on those retries.
"""
from __future__ import annotations

from collections.abc import Mapping

import orjson

from functions.alert_forwarder import delivery, tick, wording
from functions.alert_forwarder.decide import DROP, Facts, decide, given_severity
from functions.alert_forwarder.received import PREFIX, findings
from functions.alert_forwarder.settings import FUNCTION, Settings
from shared.declaration import SEVERITIES
from shared.environ import environ_get
from shared.intake import MAX_SUBJECT, Incoming
from shared.runtime import KubeContext, Outcome


# -- the flow -------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext[Settings]) -> Outcome:
    if event.family == "ping":
        return tick.refresh(ctx)
    verdict = decide(Facts(event.type, findings(event)), ctx.settings, ctx.clock())
    if verdict.action == DROP:
        return Outcome("drop", subject=event.subject, reason=wording.dropped(verdict, ctx.settings))
    done = delivery.deliver(event, verdict.plans, ctx)
    done.raise_errors()
    return Outcome("forward", effect="+".join(sorted(done.receivers)) or "none", subject=event.subject,
                   reason=wording.forwarded(done.plans, done.sent, len(verdict.below), done.stopped))


def worth_decoding(headers: Mapping[str, str], body: bytes, settings: Settings) -> bool | Outcome:
    """The prefilter: a finding below MIN_SEVERITY (most of what arrives is info) answered with the drop the
    handler would come to, from its data decoded and nothing built from it (no event, no finding, no alert).
    Only an event the handler would certainly drop, with this reason, is answered here: a binary-mode reply of
    another function (application/json, specversion 1.0, id, source, a subject intake accepts) whose data is
    one finding, or a summary of findings, each naming a severity (decide.given_severity) below MIN_SEVERITY.
    Anything else, a finding without a severity (its category's default applies), a malformed or odd one
    included, is decoded and handled the long way, which says what is wrong with it. The severity is read from
    the data, never from a header: a header that said "info" would drop whatever the finding says it is."""
    floor = _RANK[settings.min_severity]
    get = environ_get(headers)  # each header a dict lookup in the WSGI environ, where the runtime gives one
    event_type = get("HTTP_CE_TYPE")
    if not floor or get("CONTENT_TYPE") != "application/json" or event_type is None \
            or not event_type.startswith(PREFIX) or event_type.startswith(_OWN) \
            or get("HTTP_CE_SPECVERSION") != "1.0" or not get("HTTP_CE_ID") or not get("HTTP_CE_SOURCE"):
        return True
    subject = get("HTTP_CE_SUBJECT")
    if subject is not None and (len(subject) > MAX_SUBJECT or not subject.isprintable()):
        return True
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return True
    if data.__class__ is not dict:
        return True
    items = data.get("findings")
    if items is None:
        items = (data,)
    elif items.__class__ is not list or not items:
        return True
    first = ""
    for item in items:
        if item.__class__ is not dict:
            return True
        given = item.get("severity")
        severity = _GIVEN.get(given) if given.__class__ is str else None  # decide.given_severity, remembered
        if severity is None:
            severity = given_severity(given)
            if severity is None or _RANK[severity] >= floor:
                return True
            # The spellings seen (a sender's own are few); a flood of odd ones is not kept.
            if len(_GIVEN) < 64 and isinstance(given, str):
                _GIVEN[given] = severity
        elif _RANK[severity] >= floor:
            return True
        identity = item.get("identity")
        if identity.__class__ is dict:  # the handler makes labels of its values: a nested one is its to refuse
            for value in identity.values():
                if value.__class__ is dict or value.__class__ is list:
                    return True
        first = first or severity
    drop = _DROPS.get((first, settings.min_severity))
    if drop is None:  # one per severity and threshold: the log line takes the subject from the request
        drop = _DROPS[first, settings.min_severity] = Outcome("drop", reason=wording.below_threshold(first, settings))
    return drop


_OWN = f"{PREFIX}{FUNCTION}."  # alert-forwarder's own replies: decide drops them for another reason
_DROPS: dict[tuple[str, str], Outcome] = {}
_RANK = {severity: rank for rank, severity in enumerate(SEVERITIES)}
_GIVEN: dict[str, str] = {}  # a severity as a finding writes it ("info", " INFO ", "notice") → given_severity's
