"""A node that stopped answering, and what Harvester and KubeVirt will do to one VM on it, and when: the node-down
controller with vm-force-reset-policy (per Harvester version), the out-of-service taint, KubeVirt's node controller,
and what blocks the recovery — a launcher pod still in the API, a volume still attached (docs/facts.md §10). Pure."""
from __future__ import annotations

from datetime import datetime, timedelta

from functions.evacuation_report.facts import Facts, NodeFacts, VMFacts
from functions.evacuation_report.lines import HEARTBEAT_TIMEOUT, RESTARTS, Line, Outcome, stamp
from shared import nodes

PURE = True


# -- a node that stopped answering -----------------------------------------------------------------
def down_words(node: NodeFacts) -> str:
    return f"Ready={node.ready}" + (f" ({node.ready_reason})" if node.ready_reason else "") + \
        (f" since {stamp(node.ready_since)}" if node.ready_since else "")


def down_line(vm: VMFacts, facts: Facts, now: datetime) -> Line:
    node, cluster = facts.node, facts.cluster
    if vm.node != node.name:
        if vm.node and vm.phase == "Running":
            return Line(vm.key, Outcome.RECOVERED, f"runs on {vm.node} now")
        return Line(vm.key, Outcome.LEFT, f"left the node (its VMI is {vm.phase or 'gone'})")
    blockers = _attached(vm, node)
    restart = vm.run_strategy in RESTARTS
    after = ("then KubeVirt starts it on another node (run strategy " + str(vm.run_strategy) + ")") if restart else \
        (f"then it stays off: its run strategy {vm.run_strategy or '(no VM)'} does not start it again")
    outcome = Outcome.RESTARTS if restart else Outcome.STAYS_OFF
    if vm.phase in ("Succeeded", "Failed"):
        return Line(vm.key, outcome, f"its VMI is {vm.phase}; {after}", "" if restart else "Start it again "
                    "(virtctl start) once it should run elsewhere.", blockers=blockers)
    policy, upgrade = cluster.reset_policy, cluster.upgrade
    harvester = cluster.harvester_version is not None or policy is not None
    since = node.ready_since or now
    if not harvester:
        return Line(vm.key, Outcome.STUCK, "nothing in KubeVirt deletes the launcher pod of a node that stopped "
                    "answering, so its VMI stays Running in the API", "Once the node is surely off, taint it "
                    f"node.kubernetes.io/out-of-service=nodeshutdown:NoExecute (or delete the node); KubeVirt then "
                    f"fails the VMI and {('starts it elsewhere' if restart else 'leaves it off')}.",
                    blockers=blockers)
    if upgrade is not None:
        return Line(vm.key, Outcome.STUCK, f"Harvester's node-down controller does nothing while Upgrade "
                    f"{upgrade.name} is under way", "Bring the node back, or let the upgrade fail and recover the "
                    "node.", blockers=blockers)
    if policy is None or not policy.enable:
        return Line(vm.key, Outcome.STUCK, "vm-force-reset-policy is disabled: Harvester leaves the VM on the dead "
                    "node", "Bring the node back, or enable vm-force-reset-policy.", blockers=blockers)
    if policy.vm_migration_timeout is None:  # Harvester ≤ 1.6
        due = since + timedelta(seconds=policy.period)
        return Line(vm.key, outcome, f"vm-force-reset-policy ({policy.period} s, {policy.source}): Harvester "
                    f"force-deletes its launcher pod and volume attachments and rewinds the heartbeat at "
                    f"{stamp(due)}; KubeVirt then fails the VMI at once; {after}",
                    "" if restart else "Start it again (virtctl start) once it should run elsewhere.", due,
                    blockers)
    if node.ready != "Unknown":
        return Line(vm.key, Outcome.STUCK, f"Ready={node.ready}: Harvester 1.7 on resets VMs only for an unreachable "
                    f"node (Ready=Unknown); the kubelet still reports, so nothing moves this VM",
                    "Bring the kubelet back, or once the node is surely off taint it "
                    "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute.", blockers=blockers)
    drained = node.drained[2] if node.drained and node.drained[2] else since + timedelta(seconds=policy.period)
    cut = drained + timedelta(seconds=policy.vm_migration_timeout)
    if node.has_taint(nodes.OUT_OF_SERVICE):
        words = "the node is tainted out-of-service: its pods are deleted and volumes detached"
    else:
        words = (f"vm-force-reset-policy ({policy.period} s, then {policy.vm_migration_timeout} s; {policy.source}): "
                 f"the drain taint {'is on' if node.has_taint(nodes.DRAIN_TAINT) else 'comes'} at "
                 f"{stamp(since + timedelta(seconds=policy.period))} (a migration off a dead node cannot work), "
                 f"the out-of-service taint at {stamp(cut)}, which deletes its pod and detaches its volumes")
    failed_at = max(cut, since + HEARTBEAT_TIMEOUT)
    return Line(vm.key, outcome, f"{words}; KubeVirt fails the VMI once virt-handler's heartbeat is 5 minutes old "
                f"and the pod is gone (about {stamp(failed_at)}); {after}",
                "" if restart else "Start it again (virtctl start) once it should run elsewhere.", failed_at,
                blockers)


def _attached(vm: VMFacts, node: NodeFacts) -> tuple[str, ...]:
    out = []
    for v in vm.volumes:
        if node.name in v.attached_to:
            out.append(f"PVC {v.claim} (PV {v.volume}) is still attached to {node.name} (VolumeAttachment)")
        elif v.longhorn and v.longhorn_node == node.name and v.longhorn_state == "attached":
            out.append(f"Longhorn volume {v.longhorn} of PVC {v.claim} is still attached to {node.name}")
    if vm.pod_alive:
        out.append("its launcher pod is still in the API (the node's kubelet cannot remove it)")
    return tuple(out)


def down_next(lines: tuple[Line, ...]) -> str:
    for outcome in (Outcome.STUCK, Outcome.STAYS_OFF):
        found = [line for line in lines if line.outcome is outcome]
        if found:
            return f"{', '.join(line.vm for line in found)}: {found[0].next_step}"
    return "Nothing: Harvester and KubeVirt restart every VM of it elsewhere; bring the node back when you can."


