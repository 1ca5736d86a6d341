"""vmevents under a real Prometheus (Debian's `prometheus`), on both backends: it scrapes every function while the
`make run` stories play, and evaluates the PrometheusRule vmevents ships (deploy/components/monitoring, its groups
unchanged; scraped and evaluated every second instead of 15 s).

- The finding alerts fire for the stories' findings and resolve after them: at the end of each stage, the firing
  alerts are exactly the findings open on record (the ledger's Events), and every finding that resolved during the
  stage (after lasting a few seconds) was seen firing, and no longer is.
- A last stage (on the simulator) makes vmevents fail as it can in a cluster: an event a function refuses (dead
  letter), the API answering 503, alert-forwarder's Alertmanager unreachable, a re-scan slower than its budget; each
  alert on vmevents itself then has its whole expression true (pending: their `for:` is minutes).
- Every dashboard panel's query and every rule's query returns data at the end of some stage.

The simulator plays every story and the failing stage; the real control plane a cleanup, a device conflict and the
stuck VMs (findings that open and resolve), each stage there costing minutes, and every panel's query but the three
that only the failing stage feeds.
"""
from __future__ import annotations

import re
import threading
import time
import uuid
from datetime import UTC, datetime

import pytest
import yaml
from cloudevents.http import CloudEvent

from catalog import declarations, monitoring
from localknative.serving import free_port
from shared.finding import Finding
from shared.kube import Kube
from shared.ledger import Ledger, record_of
from simcluster import play
from tests import backends
from tests.conftest import REPO
from tests.monitoring.prometheus import Prometheus, binary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3000)]
STORIES = ("vmi_cleanup", "device_conflict", "migration_report", "io_pause_report", "vm_stuck_report",
           "evacuation_report", "alert_forwarder")
# On the real control plane, where each stage costs minutes on a loaded machine: a cleanup, a device conflict, and
# findings that open and resolve (the failing stage follows on both backends).
REAL_STORIES = ("vmi_cleanup", "device_conflict", "vm_stuck_report")
RULES = monitoring.rules(declarations())
FINDING_RULES = {r.alert for r in monitoring.finding_rules(declarations())}
WITH_RULES = {f.name for f in declarations() if "detected" in f.replies}  # whose findings have alerts
LASTED = 5.0  # a finding that lasted less than this may open and resolve between two scrapes


def shipped_groups() -> list[dict]:
    rule = yaml.safe_load((REPO / monitoring.DIRECTORY / "prometheusrule.yaml").read_text())
    return rule["spec"]["groups"]


class Watch:
    """A play.WATCHERS entry: points Prometheus at each stage's functions, and checks at each stage's end."""

    def __init__(self, prometheus: Prometheus):
        self.prometheus = prometheus
        self.answered: set[str] = set()   # the queries that returned data at the end of some stage
        self.seen_firing: set[tuple[str, str]] = set()  # (alertname, finding digest)
        self.checked: list[str] = []
        self.carried: set[str] = set()  # findings open when an earlier stage ended
        self.with_findings: set[str] = set()  # the functions that had a finding on record at a stage's end
        self.categories: set[tuple[str, str]] = set()  # and (function, category) of those findings
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.3):
            try:
                for alert in self.prometheus.alerts():
                    if alert["state"] == "firing":
                        self.seen_firing.add((alert["labels"]["alertname"], alert["labels"].get("finding", "")))
            except OSError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._poller.join(timeout=5)

    def started(self, stage: play.Stage) -> None:
        servers = {name: server.url for name, server in stage.knative.functions.items()}
        self.prometheus.targets(servers)
        self.prometheus.wait(lambda: len(up := self.prometheus.up()) == len(servers) and all(up.values()), 60,
                             "every function scraped")

    def ending(self, stage: play.Stage) -> None:
        records = [r for e in stage.cluster.list("v1", "Event", None, label_selector="vmevents.io/finding")
                   if (r := record_of(e)) is not None and r.finding.function in WITH_RULES]
        wanted = {r.finding.labels["finding"] for r in records if r.open}

        def firing() -> set[str]:
            return {a["labels"].get("finding", "") for a in self.prometheus.alerts()
                    if a["state"] == "firing" and a["labels"]["alertname"] in FINDING_RULES}

        def agree() -> bool:
            # A finding still open when an earlier stage's pods went away stays firing for the rules' window (3m:
            # a gap between pods is not an end); every other firing alert is an open finding of this stage.
            now = firing()
            return wanted <= now and now - wanted <= self.carried
        self.prometheus.wait(agree, 60, f"the finding alerts firing are the open findings {sorted(wanted)} "
                                        f"(firing: {sorted(firing())}; carried over: {sorted(self.carried)})")
        self.carried |= wanted
        for record in records:
            lasted = (record.resolved_at - record.opened_at).total_seconds() \
                if record.resolved_at and record.opened_at else 0
            if not record.open and lasted >= LASTED:
                digest = record.finding.labels["finding"]
                assert any(d == digest for _, d in self.seen_firing), \
                    f"{record.finding.category} {record.finding.labels}: resolved, never seen firing"
                self.checked.append(f"resolved {record.finding.category}")
        self.checked += [f"open {r.finding.category}" for r in records if r.open]
        self.with_findings |= {r.finding.function for r in records}
        self.categories |= {(r.finding.function, r.finding.category) for r in records}
        for query in [p.query for p in monitoring.PANELS] + [r.query for r in RULES]:
            if query not in self.answered and self.prometheus.query(query):
                self.answered.add(query)


@pytest.fixture(params=backends.params())
def backend(request):
    if request.param == backends.SIM:
        yield play.SimulatedBackend()
        return
    from controlplane.play import RealBackend
    from tests.delivery import session_knative

    class SessionBackend(RealBackend):
        """controlplane.play's backend on the session's Knative plane (not one of its own)."""

        def __init__(self) -> None:
            self.plane, _, self.knative = session_knative()

        def cluster(self, kubevirt_version: str):
            return backends.cluster(backends.REAL, kubevirt_version, knative=True)

        def stop(self) -> None:
            pass
    yield SessionBackend()


@pytest.fixture
def prometheus(tmp_path):
    if binary() is None:
        if backends.in_ci():
            pytest.fail("prometheus is not installed (Debian's prometheus; .ci/run installs it)")
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    running = Prometheus(tmp_path, shipped_groups()).start()
    yield running
    running.stop()


def test_a_real_prometheus_sees_the_stories_and_vmevents_failing(backend, prometheus, monkeypatch):
    from simcluster import stories

    watch = Watch(prometheus)
    monkeypatch.setattr(play, "BACKEND", backend)
    monkeypatch.setattr(play, "WATCHERS", [watch])
    try:
        simulated = isinstance(backend, play.SimulatedBackend)
        for name in STORIES if simulated else REAL_STORIES:
            stories.load(name).play()
        if simulated:
            failing(prometheus)
    finally:
        watch.stop()
    if simulated:
        # On the real control plane the stage's stories end with their findings open (the stuck VMs stay stuck
        # within a stage's minutes there, and the device conflict of the seed was not reached in the last runs:
        # deliveries of the session Knative's channel to an earlier stage's functions were refused, an open
        # problem of the harness, docs/monitoring.md); each stage end still checks firing == open on record.
        assert any(c.startswith("resolved") for c in watch.checked), \
            f"no finding resolved while watched: {watch.checked}"
    # Every panel's and every self rule's query; a finding rule's where its function had a finding on record (every
    # one on the simulator, which plays every story).
    # A finding rule's query has data where its function had a finding on record; on the real control plane, which
    # plays three stories, where it had one of the rule's categories (vm-stuck-report's story there leaves a dead
    # node's stop to evacuation-report: a node-down finding, and no node-drain one)
    played = [r for r in monitoring.finding_rules(declarations()) if _function(r) in watch.with_findings] \
        if simulated else [r for r in monitoring.finding_rules(declarations())
                           if any(f == _function(r) and re.fullmatch(_categories(r), c) for f, c in watch.categories)]
    if simulated:
        assert len(played) == len(monitoring.finding_rules(declarations())), watch.with_findings
        wanted = [p.query for p in monitoring.PANELS] + [r.query for r in monitoring.SELF_RULES]
    else:  # no failing stage: no failed answer, delivery or dead letter is certain
        wanted = [p.query for p in monitoring.PANELS if p.title not in FAILING_PANELS]
    wanted += [r.query for r in played]
    missing = [q for q in wanted if q not in watch.answered]
    assert not missing, "queries that never returned data:\n" + "\n".join(missing)


def _function(rule: monitoring.Rule) -> str:
    return rule.query.split('function="', 1)[1].split('"', 1)[0]


def _categories(rule: monitoring.Rule) -> str:
    return rule.query.split('category=~"', 1)[1].split('"', 1)[0]


# -- vmevents failing ----------------------------------------------------------------------------------
SELF = {r.alert: r for r in monitoring.SELF_RULES}
SLOW = 1.2  # seconds a GET of vmi-cleanup's takes: longer than its RESCAN_BUDGET of 1s


FAILING_PANELS = ("Events answered with an error", "Deliveries to receivers (1h)", "Dead letters (1h)")


def failing(prometheus: Prometheus) -> None:
    """A stage where each alert on vmevents itself comes true (on the simulator: on the real control plane this
    stage's ticks were answered 502 by Knative's channel, the functions' ports refusing, so that no function read its
    findings; an open problem, docs/monitoring.md)."""
    closed = free_port()  # nothing listens there
    env = {"alert-forwarder": {"ALERTMANAGER_URL": f"http://127.0.0.1:{closed}"},
           "vmi-cleanup": {"RESCAN_BUDGET": "1s", "RESCAN_WORKERS": "1", "CLEANUP_AFTER": "1h"}}
    with play.stage("monitoring: vmevents failing", env_overrides=env) as s:
        from simcluster.builders.io_pause import make_pvc
        from simcluster.stories.vmi_cleanup import seed_vm

        names = ("idle-1", "idle-2", "idle-3")
        for name in names:  # VMIs left Succeeded, which vmi-cleanup waits an hour for: candidates of every tick
            s.cluster.create(make_pvc(f"{name}-disk-0", f"pvc-{name}-disk-0"))
            s.cluster.create(seed_vm(name, "Manual"))
            play.virtctl_start(s.cluster, "default", name)
        play.wait_until(lambda: all(_phase(s, n) == "Running" for n in names), 60)
        for name in names:
            s.kubevirt.guest_power_off("default", name)
        play.wait_until(lambda: all(_phase(s, n) == "Succeeded" for n in names), 60)
        # A finding on record: alert-forwarder's tick posts it to its (unreachable) Alertmanager.
        vm = s.cluster.get("kubevirt.io/v1", "VirtualMachine", "default", names[0])
        Ledger(Kube(s.cluster.api_client()), "vm-stuck-report").sighted(
            Finding("vm-stuck-report", "stuck-starting", f"/apis/kubevirt.io/v1/namespaces/default/virtualmachines/"
                    f"{names[0]}", "seeded", {"namespace": "default", "vm": names[0], "state": "starting"}),
            vm, "monitoring-seed", datetime.now(UTC))
        # An event vmi-cleanup refuses (a VMI without a name): 400, not retried, dead-lettered.
        s.knative.broker.publish(CloudEvent({
            "type": "dev.knative.apiserver.resource.update", "source": "/monitoring/test", "id": str(uuid.uuid4()),
            "kind": "VirtualMachineInstance", "datacontenttype": "application/json"},
            {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"namespace": "default"},
             "status": {"phase": "Succeeded"}}))
        # The API slow for vmi-cleanup's reads of its candidates (budget stops), and failing for migration-report.
        s.cluster.faults.add(method="GET", path=r"/virtualmachineinstances/idle-", kind="latency", delay=SLOW,
                             service_account="vmevents/vmi-cleanup", times=None)
        s.cluster.faults.add(service_account="vmevents/migration-report", status=503, times=None)
        try:
            for alert in SELF:  # the rule's whole expression true: Prometheus holds the alert, pending or firing
                prometheus.wait(lambda a=alert: any(x["labels"]["alertname"] == a for x in prometheus.alerts()), 120,
                                f"{alert} pending or firing ({SELF[alert].expr})")
        finally:
            s.cluster.faults.clear()
        time.sleep(0.1)


def _phase(s: play.Stage, name: str) -> str | None:
    vmi = s.cluster.get("kubevirt.io/v1", "VirtualMachineInstance", "default", name)
    return vmi and (vmi.get("status") or {}).get("phase")
