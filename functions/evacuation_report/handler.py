"""evacuation-report's I/O: before and while a node is emptied — a cordon and `kubectl drain`, KubeVirt's drain
taint, Harvester's maintenance mode or an upgrade — or after it stopped answering, say for each VM on it what will
happen to it, why and when, and what blocks it.

KubeVirt has no alert for a failed evacuation, Harvester's upgrade log says only "FailedMigration", and nothing tells
an operator per VM what a drain or a dead node will do to it (docs/evacuation-report.md). The flow: on_event and
rescan → converge: read the node fresh; if it is neither being emptied nor down, end its open finding without
reading more; else read its VMs and what decides their fate (reads.py), decide (decide.py: a line per VM) → act: one
finding per node and episode (shared/ledger.py), in one Event on the Node, `.detected` once, updated as the VMs move
(no second notice), `.resolved` once when the node is drained clean, back in service, or its VMs run elsewhere. It
changes nothing but Events.
"""
from __future__ import annotations

from collections.abc import Mapping

from functions.evacuation_report.decide import Action, Verdict, decide
from functions.evacuation_report.facts import EVACUATION_ANNOTATION, node_facts
from functions.evacuation_report.reads import read_facts
from functions.evacuation_report.settings import OPT_OUT, Settings
from functions.evacuation_report.wording import (
    FUNCTION,
    REASONS,
    RESOLVED_REASONS,
    finding,
    outcomes,
    resolved_message,
    subject,
)
from shared import kubevirt as kv
from shared import metrics, nodes
from shared import rescan as rescans
from shared.finding import summary
from shared.intake import Incoming, about, may_concern
from shared.kinds import NODE, VMIM
from shared.ledger import Ledger, Record
from shared.runtime import KubeContext, Outcome

__all__ = ["FUNCTION", "on_event", "rescan", "converge", "judge", "records_of", "target", "worth_decoding"]


# -- the flow -------------------------------------------------------------------------------------
def on_event(event: Incoming, ctx: KubeContext[Settings]) -> Outcome:
    if event.family == "ping":
        return rescan(ctx, event.id)
    found = target(event, ctx)
    if found is None:
        return Outcome("irrelevant", subject=event.subject)
    return converge(found, ctx, event.id)


def rescan(ctx: KubeContext[Settings], delivery: str) -> Outcome:
    """Every Node (one LIST from the watch cache: a cluster has tens of nodes, not thousands), and this function's
    findings on record; a node that is being emptied or is not Ready, or has a finding open, is a candidate and is
    converged (its VMs read), within the budget (shared/rescan.py). Open findings are renewed before --event-ttl."""
    began = rescans.begin()
    ledger = _ledger(ctx)
    on_record = list(ledger.records(state=None, cached=True))  # read before the nodes: docs/findings.md, Races
    listed = list(ctx.kube.list(NODE, cached=True))
    candidates = {o_name(n) for n in listed if nodes.down(n) or nodes.draining(n, _drain_key(n))}
    for record in on_record:
        if record.open or Ledger.replay(record, delivery):
            candidates.add(str(record.finding.details.get("node") or ""))
    candidates.discard("")
    scan = rescans.run(sorted(candidates), lambda name: converge(name, ctx, delivery, tick=True).reply,
                       ctx.settings.rescan, subject=lambda name: f"node {name}", started=began,
                       rotation=rescans.tick_number(ctx.clock()))
    replies = sorted(scan.results, key=lambda r: (r.subject or "", r.type))
    renewed = ledger.renew_stale([r for r in on_record if r.open], ctx.clock())
    reason = (f"scanned {len(listed)} node(s), {len(candidates)} being emptied, down or on record; {len(replies)} "
              f"notice(s), {renewed} renewed; {scan.progress()}")
    reply = summary(FUNCTION, "scanned", f"/vmevents/{FUNCTION}/rescan", replies, reason, {"nodes": len(listed)})
    return Outcome("rescan", effect=f"reported-{len(replies)}" if reply else "none", reason=reason, reply=reply)


def converge(name: str, ctx: KubeContext[Settings], delivery: str = "", *, tick: bool = False) -> Outcome:
    """Read the node fresh; only a node being emptied or down has its VMs read; decide; record."""
    # the records before the state they are judged by: one resolved since is not reopened on this look (Ledger.sighted)
    records = records_of(name, ctx)
    for record in records:  # a redelivery of the event that opened or ended an episode answers as it did
        notice = Ledger.replay(record, delivery)
        if notice is not None:
            return Outcome("replay", effect=notice.transition, subject=subject(name), reason="a redelivered event",
                           reply=notice.reply())
    node, verdict = judge(name, records, ctx)
    return act(verdict, name, node, records, ctx, delivery, tick)


def records_of(name: str, ctx: KubeContext[Settings]) -> list[Record]:
    """This function's findings on record about the node `name`, open and resolved."""
    return [r for r in _ledger(ctx).records(state=None, field_selector=f"involvedObject.name={name}")
            if r.finding.details.get("node") == name and r.involved.get("kind") == "Node"]


def judge(name: str, records: list[Record], ctx: KubeContext[Settings]) -> tuple[dict | None, Verdict]:
    """The node read fresh and decided: only a node being emptied or down has its VMs read (with the lines of its
    open finding, `records`, for the VMs that left). Writes nothing: `vmevents explain` asks this too
    (functions/evacuation_report/explain.py)."""
    node = ctx.kube.get(NODE, None, name)
    if node is None:
        return None, Verdict(Action.SETTLED, f"node {name} no longer exists")
    if not nodes.down(node) and not nodes.draining(node, _drain_key(node)):
        return node, Verdict(Action.SETTLED, f"node {name} is back in service (Ready, schedulable, no drain taint)")
    facts = node_facts(node, OPT_OUT)
    earlier = next(({str(v.get("vm")): v for v in r.finding.details.get("vms") or ()} for r in records if r.open), {})
    return node, decide(read_facts(ctx, facts, earlier), ctx.settings, ctx.clock())


# -- parse: which node is this event about? (no API calls) -----------------------------------------
def target(event: Incoming, ctx: KubeContext[Settings]) -> str | None:
    """The node worth a fresh look: a Node's own event, or the node an evacuation migration empties (its
    `kubevirt.io/evacuationMigration` annotation; a Reference-mode VMIM event is read for it)."""
    found = about(event, ("Node", "VirtualMachineInstanceMigration"), FUNCTION)
    if found.ref.kind == "Node":
        if found.obj is not None and not found.deleted and not nodes.down(found.obj) \
                and not nodes.draining(found.obj, _drain_key(found.obj)):
            return None  # in service as the event shows it: the re-scan ends an open finding (worth_decoding)
        return found.ref.name
    if found.deleted:
        return None
    obj = found.obj if found.obj is not None else ctx.kube.get(VMIM, found.namespace, found.ref.name)
    node = kv.annotations_of(obj).get(EVACUATION_ANNOTATION) if obj is not None else None
    if not node or not ctx.settings.in_scope(found.namespace):
        return None
    return node


# A Node whose JSON names none of these is Ready, schedulable and not in maintenance: nothing to say, and an open
# finding of it ends at the next tick. An evacuation migration carries its annotation.
_NODE_TOKENS = (b'"unschedulable":true', b'"unschedulable": true', b"kubevirt.io/drain",
                b"harvesterhci.io/maintain-status", b"harvesterhci.io/drain-requested", b'"Unknown"', b"NotReady",
                b"out-of-service")
_VMIM_TOKENS = (EVACUATION_ANNOTATION.encode(),)


def worth_decoding(headers: Mapping[str, str], body: bytes, settings: Settings) -> bool:
    """A Resource-mode Node event that names no cordon, taint, maintenance or unready state, or a VMIM event that is
    no evacuation, is answered without decoding and without an API call (the re-scan ends what it leaves)."""
    if headers.get("ce-kind") == "VirtualMachineInstanceMigration":
        return may_concern(headers, body, ("VirtualMachineInstanceMigration",), _VMIM_TOKENS)
    return may_concern(headers, body, ("Node",), _NODE_TOKENS)


def o_name(obj: Mapping) -> str:
    return str(kv.meta(obj).get("name") or "")


def _drain_key(node: Mapping) -> str:
    return nodes.DRAIN_TAINT  # the KubeVirt CR's nodeDrainTaintKey is read with the facts; the default finds it


# -- act: the finding's life ------------------------------------------------------------------------
def _category_ledger(ctx: KubeContext[Settings], category: str) -> Ledger:
    """The ledger that records a category's finding (NodeEvacuation, NodeDown) and its end (…Resolved)."""
    known = next((c for c in REASONS if c.value == category), None)
    if known is None:
        return _ledger(ctx)
    return Ledger(ctx.kube, FUNCTION, ctx.settings.finding_renew_after, REASONS[known], RESOLVED_REASONS[known])


def _ledger(ctx: KubeContext[Settings]) -> Ledger:
    return Ledger(ctx.kube, FUNCTION, ctx.settings.finding_renew_after, "NodeEvacuation", "NodeEvacuationResolved")


def act(verdict: Verdict, name: str, node: dict | None, records: list[Record], ctx: KubeContext[Settings],
        delivery: str, tick: bool) -> Outcome:
    now, where = ctx.clock(), subject(name)
    metrics.DECISIONS.inc(FUNCTION, verdict.action.value, verdict.category.value if verdict.category else "",
                          metrics.trigger())
    keep = verdict.category.value if verdict.action is Action.REPORT and verdict.category else None
    ended = []
    if verdict.action is not Action.WAIT:
        for record in (r for r in records if r.open and r.finding.category != keep):
            because = verdict.reason if keep is None else f"the node is {keep} now ({verdict.reason})"
            message = resolved_message(record, because)
            ledger = _category_ledger(ctx, record.finding.category)
            notice = ledger.resolve(record, delivery, now, summary=message, details={"because": because},
                                    message=message)  # and a Normal NodeEvacuationResolved / NodeDownResolved
            if notice is not None:
                ended.append(notice.reply())
    if keep is None or node is None or verdict.category is None:
        return Outcome(verdict.action.value, effect="resolved" if ended else "none", subject=where,
                       reason=verdict.reason, reply=ended[0] if ended else None)
    opened = finding(verdict, node)
    current = next((r for r in records if r.open and r.finding.category == keep), None)
    changed = current is not None and outcomes(current.finding.details) != outcomes(opened.details)
    ledger = _category_ledger(ctx, keep)
    read = next((r.resource_version for r in records if r.finding.category == keep), "")
    notice = ledger.sighted(opened, node, delivery, now, message=opened.summary, count=not tick, update=changed,
                            read=read)
    if notice is None:
        return Outcome(verdict.action.value, effect="updated" if changed else "seen-again", subject=where,
                       reason=verdict.reason, reply=ended[0] if ended else None)
    return Outcome(verdict.action.value, effect=f"detected-{keep}", subject=where, reason=verdict.reason,
                   reply=notice.reply())
