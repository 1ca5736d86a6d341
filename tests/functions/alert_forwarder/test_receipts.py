"""What each receiver is sent of a notice (issue 34, points 2 and 3), decided from the finding's record and the
receipts on it: pure, every case at once. The API, the claims and real receivers: test_delivery.py and
test_exactly_once.py."""
from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from functions.alert_forwarder.decide import BUSY, ENDED, OTHER_LIFE, SEND, SENT, UNREAD, Facts, decide
from functions.alert_forwarder.receipts import (
    NOWHERE,
    Claim,
    OnRecord,
    Position,
    advance,
    firing,
    read_claim,
    read_receipts,
    resolved,
    write_claim,
    write_receipts,
)
from functions.alert_forwarder.received import findings, on_record
from functions.alert_forwarder.settings import ALERTMANAGER, WEBHOOK, Receiver, Settings
from shared.intake import Incoming
from simcluster.builders import findings as b

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
OPENED = datetime(2026, 11, 30, 11, 58, 0, tzinfo=UTC)  # the builders' openedAt
BOTH = Settings(alertmanager=Receiver(("http://am:9093",)), webhook=Receiver(("https://hooks.example/x",)))
AM, HOOK = BOTH.targets


def notice(state, episode=1, opened=OPENED):
    data = dict(b.device_conflict(state=state), episode=episode, record="default/vm1.f0123456789abcdef",
                openedAt=opened.strftime("%Y-%m-%dT%H:%M:%SZ"))
    (found,) = findings(Incoming(id="n1", type=f"io.vmevents.device-conflict.{state}", source="/t", subject=None,
                                 data=data))
    return found


def record(episode=1, open_=True, receipts=None, claim=None, opened=OPENED):
    state = "detected" if open_ else "resolved"
    data = b.device_conflict(state=state)
    return OnRecord("default", "vm1.f0123456789abcdef", "7", on_record(data, state, opened,
                                                                        None if open_ else NOW, episode),
                    episode, open_, opened, dict(receipts or {}), claim)


def plan(found, on_record_, settings=BOTH):
    return decide(Facts(f"io.vmevents.device-conflict.{found.state}", (found,), (on_record_,)), settings,
                  NOW).plans[0]


def sent(p):
    """{target kind: [firing|resolved, ...]} of a plan."""
    return {s.target.kind: ["resolved" if a.resolved else "firing" for a in s.alerts] for s in p.sends}


def test_a_notice_that_names_its_record_is_read_first():
    found = notice("detected")
    (first,) = decide(Facts("io.vmevents.device-conflict.detected", (found,)), BOTH, NOW).plans
    assert first.reason == UNREAD and not first.sends


# (notice, its episode) × (record: episode, open, receipts) → what each receiver is sent
CASES = [
    pytest.param("detected", 1, record(), SEND, {ALERTMANAGER: ["firing"], WEBHOOK: ["firing"]},
                 id="first-delivery-both-get-firing"),
    pytest.param("detected", 1, record(receipts={AM.id: firing(1), HOOK.id: firing(1)}), SENT, {},
                 id="redelivery-after-both-accepted-sends-nothing"),
    pytest.param("detected", 1, record(receipts={HOOK.id: firing(1)}), SEND, {ALERTMANAGER: ["firing"]},
                 id="alertmanager-failed-the-webhook-is-not-sent-again"),
    pytest.param("detected", 1, record(open_=False), ENDED, {ALERTMANAGER: ["resolved"]},
                 id="late-firing-of-an-ended-episode-never-fires-alertmanager-gets-the-record"),
    pytest.param("detected", 1, record(open_=False, receipts={AM.id: resolved(1), HOOK.id: resolved(1)}), ENDED, {},
                 id="late-firing-after-the-resolved-was-sent-sends-nothing"),
    pytest.param("detected", 1, record(episode=2), ENDED, {ALERTMANAGER: ["firing"]},
                 id="late-firing-of-episode-1-while-2-is-open-is-not-sent-to-the-webhook"),
    pytest.param("resolved", 1, record(open_=False, receipts={AM.id: firing(1), HOOK.id: firing(1)}), SEND,
                 {ALERTMANAGER: ["resolved"], WEBHOOK: ["resolved"]}, id="resolved-after-its-firing"),
    pytest.param("resolved", 1, record(open_=False), SEND,
                 {ALERTMANAGER: ["resolved"], WEBHOOK: ["firing", "resolved"]},
                 id="resolved-first-the-webhook-gets-the-firing-it-never-got-then-the-resolved"),
    pytest.param("resolved", 1, record(open_=False, receipts={AM.id: resolved(1), HOOK.id: resolved(1)}), SENT, {},
                 id="resolved-redelivered-sends-nothing"),
    pytest.param("resolved", 1, record(episode=2, receipts={AM.id: firing(1), HOOK.id: firing(1)}), SEND,
                 {ALERTMANAGER: ["firing"], WEBHOOK: ["resolved"]},
                 id="resolved-of-1-after-2-opened-alertmanager-keeps-firing-the-webhook-gets-the-story"),
    pytest.param("resolved", 1, record(episode=2, receipts={AM.id: firing(2), HOOK.id: firing(2)}), SENT, {},
                 id="resolved-of-1-after-the-webhook-heard-of-2-is-not-its-last-word"),
    pytest.param("detected", 2, record(episode=1, open_=False), OTHER_LIFE, {},
                 id="a-notice-newer-than-the-record-is-of-an-event-that-expired"),
    pytest.param("detected", 1, record(opened=OPENED + timedelta(hours=2)), OTHER_LIFE, {},
                 id="same-episode-number-other-opening-is-another-events-life"),
]


@pytest.mark.parametrize("state,episode,on_record_,why,sends", CASES)
def test_what_each_receiver_is_sent(state, episode, on_record_, why, sends):
    p = plan(notice(state, episode), on_record_)
    assert (p.reason, sent(p)) == (why, sends)


def test_each_send_says_the_receipt_it_earns():
    p = plan(notice("resolved"), record(open_=False))
    assert {s.target.kind: s.reaches for s in p.sends} == {ALERTMANAGER: resolved(1), WEBHOOK: resolved(1)}
    alert = p.sends[0].alerts[0]
    assert alert.resolved and alert.ends_at == NOW - timedelta(minutes=1), "the record's resolution, less the skew"


def test_a_claim_held_by_another_delivery_makes_it_wait_and_a_lapsed_one_does_not():
    held = Claim("other", NOW + timedelta(seconds=30))
    p = plan(notice("detected"), record(claim=held))
    assert (p.reason, p.busy, p.sends) == (BUSY, held, ())
    assert plan(notice("detected"), record(claim=replace(held, until=NOW - timedelta(seconds=1)))).reason == SEND
    assert plan(notice("detected"), record(open_=False, receipts={AM.id: resolved(1), HOOK.id: resolved(1)},
                                           claim=held)).reason == ENDED, "nothing to send: no need to wait"


def test_without_a_record_the_notice_is_sent_as_it_says():
    found = notice("detected")
    p = decide(Facts("io.vmevents.device-conflict.detected", (found,), (None,)), BOTH, NOW).plans[0]
    assert (p.reason, sent(p)) == (SEND, {ALERTMANAGER: ["firing"], WEBHOOK: ["firing"]})
    assert all(s.reaches is None for s in p.sends), "no receipt is kept without a record"
    bare = replace(found, record=None)
    (p,) = decide(Facts("io.vmevents.device-conflict.detected", (bare,)), BOTH, NOW).plans
    assert p.reason == SEND, "a reply that names no record (an older producer) is sent without reading one"


def test_a_notice_naming_another_findings_event_neither_reads_nor_writes_it():
    """A reply names its record; one naming another finding's Event (a forged or broken reply) is not judged by it,
    and no receipt or claim of this notice is written there: it is sent as it says."""
    found = replace(notice("detected"), key="another-key")
    p = plan(found, record(open_=False, receipts={AM.id: resolved(1), HOOK.id: resolved(1)}))
    assert (p.reason, sent(p), p.record) == (SEND, {ALERTMANAGER: ["firing"], WEBHOOK: ["firing"]}, None)
    assert all(s.reaches is None for s in p.sends)


def test_positions_order_a_findings_life():
    assert NOWHERE < firing(1) < resolved(1) < firing(2) < resolved(2)
    assert str(resolved(3)) == "3/resolved"


def test_receipts_and_claims_round_trip_and_never_go_back():
    receipts = {AM.id: firing(2), HOOK.id: resolved(1)}
    assert read_receipts(write_receipts(receipts)) == receipts
    assert advance(receipts, {AM.id: resolved(1), HOOK.id: firing(2)}) == {AM.id: firing(2), HOOK.id: firing(2)}
    assert read_receipts("not json") == {} and read_receipts('{"x": "1/maybe", "y": "z/firing"}') == {}
    claim = Claim("abc", NOW)
    assert read_claim(write_claim(claim)) == claim
    assert read_claim(None) is None and read_claim('{"by": "a", "until": "soon"}') is None
    assert Position(1, 0) == firing(1)
