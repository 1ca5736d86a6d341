"""migration-report's story: live migrations fail the ways Harvester users report (harvester#3429, #8539,
#8617), and migration-report explains each with KubeVirt's own numbers, on KubeVirt 1.3.1 (Harvester 1.4,
800 s/GiB) and 1.8.3 (150 s/GiB). The simulated KubeVirt does not model live migration: the story plays
KubeVirt's part, leaving behind exactly what KubeVirt leaves (VMIM, migrationState, KubeVirt's Events)."""
from __future__ import annotations

import json
import time

from simcluster.builders.migration import NOT_COMPLETED, STUCK, create_guest, create_migration, unschedulable_events
from simcluster.play import PING_INTERVAL, Stage, stage, wait_until

COMPONENT = "migration-report"
SCHEDULER = "0/3 nodes are available: 1 node(s) didn't match pod anti-affinity rules, 2 Insufficient memory."


def play() -> None:
    for version in ("1.3.1", "1.8.3"):
        harvester = "Harvester 1.4" if version == "1.3.1" else "KubeVirt 1.8"
        with stage(f"migration-report, KubeVirt {version} ({harvester})", kubevirt_version=version) as s:
            _play(s, version.rsplit(".", 1)[0], 800 if version == "1.3.1" else 150)


def _play(s: Stage, shape: str, per_gib: int) -> None:
    budget8, budget2 = 9 * per_gib, 3 * per_gib
    cast = [
        ("db", "8Gi", {"harvesterhci.io/vmName": "db"},
         dict(took=budget8 + 1, reason=NOT_COMPLETED.format(budget8)),
         f"an 8Gi database guest dirtying memory fast: KubeVirt gives up after {budget8} s"),
        ("web", "2Gi", {"harvesterhci.io/vmName": "web"}, dict(took=310, reason=STUCK.format(150)),
         "a 2Gi guest whose migration stops moving data for 150 s"),
        ("big", "2Gi", None, dict(took=300, state=False, reached_running=False,
                                  kubevirt_events=unschedulable_events(SCHEDULER)),
         "no node can take the target pod"),
        ("busy", "2Gi", None, dict(took=int(budget2 * 0.9), phase="Succeeded"),
         f"succeeds after {int(budget2 * 0.9)} s of its {budget2} s budget"),
        ("idle", "2Gi", None, dict(took=int(budget2 * 0.2), phase="Succeeded"),
         f"succeeds after {int(budget2 * 0.2)} s: nothing to say"),
    ]
    s.timeline.line("setup", f"KubeVirt default completionTimeoutPerGiB {per_gib} s; "
                             f"MIGRATION_WARN_RATIO 0.8; PingSource every {PING_INTERVAL:g}s")
    vmims = {}
    for name, guest, labels, migration, why in cast:
        vm, vmi = create_guest(s.cluster, name, guest=guest, labels=labels)
        vmims[name] = create_migration(s.cluster, shape, vmi, **migration)
        s.timeline.line("migrate", f"VM default/{name} ({guest}): {why} → VMIM {vmims[name]['status']['phase']}")
    wait_until(lambda: len({e["involvedObject"]["name"] for e in s.kube_events(COMPONENT)}) >= 4, 30)
    time.sleep(PING_INTERVAL * 1.5)  # a tick re-scans every migration: nothing is reported twice
    s.knative.wait_idle(10)
    s.report_events(COMPONENT)
    _summary(s, vmims)


def _summary(s: Stage, vmims: dict) -> None:
    replies = {}
    for event in list(s.knative.broker.received):
        if event["source"] == f"/vmevents/{COMPONENT}":
            data = json.loads(event.data) if isinstance(event.data, (bytes, str)) else event.data
            for item in data.get("findings", [data]):
                replies.setdefault(item["details"]["uid"], dict(item["details"], advice=item["advice"]))
    print(f"\n  {'VM':<6} {'VMIM':<10} {'report':<22} the Event migration-report recorded on the VMI (and the VM)")
    for name, vmim in vmims.items():
        report = replies.get(vmim["metadata"]["uid"])
        events = [e for e in s.kube_events(COMPONENT) if e["involvedObject"]["name"] == name
                  and e["involvedObject"]["kind"] == "VirtualMachineInstance"]
        note = f"{events[0]['reason']} (count {events[0]['count']}): {events[0]['message']}" if events else "— (none)"
        print(f"  {name:<6} {vmim['status']['phase']:<10} {(report or {}).get('category', '—'):<22} {note}")
        for advice in (report or {}).get("advice", [])[:3]:
            print(f"  {'':<40}advice: {advice['action']}: {advice['why'][:150]}")
    sample = replies.get(vmims["db"]["metadata"]["uid"])
    if sample and sample["advice"][0]["yaml"]:
        print("\n  the first advice for db, ready to apply:\n" +
              "\n".join(f"    {line}" for line in sample["advice"][0]["yaml"].splitlines()))
    print(f"  ({s.timeline.irrelevant} irrelevant events answered without an API call; "
          f"{s.timeline.repeats} repeated decisions not shown)")
