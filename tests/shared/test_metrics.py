"""The metrics a function serves on GET /metrics (shared/metrics.py, shared/exposition.py; docs/metrics.md): the text
is what promtool accepts, the counters count what happened, and the findings' gauges say what the ledger holds."""
from __future__ import annotations

import re
import shutil
import subprocess
import threading
from datetime import UTC, datetime, timedelta

import pytest

from shared import metrics
from shared.exposition import Counter, Gauge, Histogram, Registry
from shared.finding import Finding
from shared.kinds import VM as VM_KIND
from shared.kinds import VMI
from shared.kube import Kube
from shared.ledger import Ledger
from simcluster.apiserver import SimCluster
from tests.backends import in_ci

VM = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
      "metadata": {"name": "vm1", "namespace": "default", "uid": "u-1"}}


def finding(key: str = "dev-1", category: str = "taken-while-stopped") -> Finding:
    return Finding("metrics-test", category, "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/vm1", key,
                   {"namespace": "default", "vm": "vm1"}, "warning", "vm2 holds dev-1")


def samples(text: bytes) -> dict[str, float]:
    """`name{labels}` → value, of every sample line."""
    found = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            found[key] = float(value)
    return found


def promtool_check(text: bytes) -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        if in_ci():
            pytest.fail("promtool is missing (Debian's prometheus package; .ci/run installs it)")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    return done.stdout.decode() + done.stderr.decode()


def test_the_text_format_is_what_promtool_accepts_with_awkward_label_values():
    registry = Registry()
    counter = registry.add(Counter("t_things_total", "Things.\nWith a \\ and a newline.", ("function", "why")))
    counter.inc("f", 'a "quoted"\nline\\ value')
    counter.inc("f", "plain", amount=2.5)
    registry.add(Gauge("t_level", "A level.", ())).set(value=-3)
    histogram = registry.add(Histogram("t_seconds", "Durations.", ("verb",), (0.1, 1.0)))
    for value in (0.05, 0.5, 5.0):
        histogram.observe("get", value=value)
    text = registry.exposition()
    promtool_check(text)
    found = samples(text)
    assert found['t_things_total{function="f",why="a \\"quoted\\"\\nline\\\\ value"}'] == 1
    assert found['t_things_total{function="f",why="plain"}'] == 2.5
    assert found["t_level"] == -3
    assert [found[f't_seconds_bucket{{verb="get",le="{le}"}}'] for le in ("0.1", "1", "+Inf")] == [1, 2, 3]
    assert found['t_seconds_count{verb="get"}'] == 3 and found['t_seconds_sum{verb="get"}'] == 5.55


def test_every_metric_of_a_running_function_is_accepted_by_promtool():
    metrics.EVENTS.inc("metrics-test", "irrelevant", "204")
    metrics.api_request("metrics-test", "list", "virtualmachineinstances", "200", 0.01)
    text = metrics.REGISTRY.exposition()
    promtool_check(text)
    assert b"process_resident_memory_bytes " in text and b"# TYPE vmevents_decisions_total counter" in text


def test_a_counter_counts_every_increment_from_many_threads():
    counter = Counter("t_total", "x", ("a",))
    bound = counter.bound("x")

    def work():
        for _ in range(5000):
            bound()
            counter.inc("y")
    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.value("x") == counter.value("y") == 40000


def test_a_label_count_mismatch_is_refused():
    with pytest.raises(ValueError):
        Counter("t_total", "x", ("a", "b")).inc("only-one")


IRRELEVANT = {"ce-specversion": "1.0", "ce-id": "e-1", "ce-source": "/s", "ce-kind": "VirtualMachineInstance",
              "ce-type": "dev.knative.apiserver.resource.update", "Content-Type": "application/json"}


def test_get_metrics_answers_the_text_and_an_irrelevant_event_is_counted(serve):
    client = serve("functions/vmi_cleanup/main.py")  # functions-framework's app, with Front before Flask
    before = metrics.EVENTS.value("vmi-cleanup", "irrelevant", "204")
    assert client.post("/", headers=IRRELEVANT, data=b'{"kind":"VirtualMachineInstance"}').status_code == 204
    assert metrics.EVENTS.value("vmi-cleanup", "irrelevant", "204") == before + 1
    answer = client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["Content-Type"] == metrics.CONTENT_TYPE
    found = samples(answer.data)
    assert found['vmevents_events_total{function="vmi-cleanup",verdict="irrelevant",code="204"}'] == before + 1
    assert client.get("/").status_code == 200 and client.get("/").data == b""  # the probe is as before
    bad = client.post("/", headers={"Content-Type": "application/json"}, data=b"{}")
    assert bad.status_code == 400
    assert samples(client.get("/metrics").data)[
        'vmevents_events_total{function="vmi-cleanup",verdict="error",code="400"}'] >= 1


@pytest.fixture(scope="module")
def cluster():
    with SimCluster() as running:
        yield running


def test_api_requests_are_counted_by_verb_resource_and_code(cluster):
    kube = Kube(metrics.measured(cluster.api_client()))
    token = metrics.FUNCTION.set("metrics-api")  # the function being served (shared.runtime sets it per request)
    try:
        list(kube.list_rows(VMI, "default", cached=True, metadata=False))
        assert kube.get(VM_KIND, "default", "nothing-here") is None
    finally:
        metrics.FUNCTION.reset(token)
    assert metrics.API_REQUESTS.value("metrics-api", "list", "virtualmachineinstances", "200") == 1
    assert metrics.API_REQUESTS.value("metrics-api", "get", "virtualmachines", "404") == 1
    text = samples(metrics.REGISTRY.exposition())
    assert text['vmevents_api_request_duration_seconds_count{function="metrics-api",verb="get"}'] == 1


def test_an_unreachable_api_is_counted_as_an_error(unreachable_kubeconfig, monkeypatch):
    from shared.kube import Unavailable
    from shared.kubeconfig import connect

    monkeypatch.setenv("KUBECONFIG", str(unreachable_kubeconfig))
    monkeypatch.setitem(metrics.PROCESS, "function", "metrics-down")  # no request being served: the process'
    kube = connect()  # its client is measured
    # no request being served in this thread: a test that served one here (tests/shared/test_hotpath.py) left its
    # function in the context, which a process serving one function never notices
    token = metrics.FUNCTION.set("")
    try:
        with pytest.raises(Unavailable):
            kube.get(VM_KIND, "default", "vm1")
    finally:
        metrics.FUNCTION.reset(token)
    assert metrics.API_REQUESTS.value("metrics-down", "get", "virtualmachines", "error") == 1


def test_the_findings_gauges_follow_the_ledger_and_this_pods_transitions(cluster):
    for event in cluster.list("v1", "Event", "default"):
        cluster.delete("v1", "Event", "default", event["metadata"]["name"])
    ledger = Ledger(Kube(cluster.api_client()), "metrics-test", reason="Test")
    # now, not at import: the gauges keep a resolved finding 15 min of wall time, and in the whole suite this test
    # runs more than 15 min after the module was collected (the CI rehearsal: its 0 was left out)
    now = datetime.now(UTC).replace(microsecond=0)
    opened_before = metrics.OPENED.value("metrics-test", "taken-while-stopped", "warning", "event")
    assert ledger.sighted(finding("a"), VM, "ce-1", now) is not None
    assert ledger.sighted(finding("a"), VM, "ce-2", now) is None  # a sighting is no transition
    assert ledger.sighted(finding("b"), VM, "ce-3", now) is not None
    assert metrics.OPENED.value("metrics-test", "taken-while-stopped", "warning", "event") == opened_before + 2
    list(ledger.records(state=None))  # a tick's reading of every finding on record
    gauges = samples(metrics.REGISTRY.exposition())
    assert gauges['vmevents_findings_open{function="metrics-test",category="taken-while-stopped",'
                  'severity="warning"}'] == 2
    [record, _] = sorted(ledger.records(), key=lambda r: r.finding.key)
    token = metrics.TRIGGER.set(metrics.RESCAN)
    try:
        assert ledger.resolve(record, "ping-1", now + timedelta(minutes=1)) is not None
    finally:
        metrics.TRIGGER.reset(token)
    assert metrics.RESOLVED.value("metrics-test", "taken-while-stopped", "warning", "rescan") >= 1
    gauges = samples(metrics.REGISTRY.exposition())  # this pod's own transition shows before the next reading
    assert gauges['vmevents_findings_open{function="metrics-test",category="taken-while-stopped",'
                  'severity="warning"}'] == 1
    each = {k: v for k, v in gauges.items() if k.startswith('vmevents_finding_open{function="metrics-test"')}
    assert sorted(each.values()) == [0, 1]  # the resolved one is a 0, not a series gone missing
    assert all('namespace="default",vm="vm1",finding="' in k for k in each)


def test_a_pod_that_no_longer_reads_the_ledger_withholds_what_it_read():
    clock = [1000.0]
    findings = metrics.Findings(clock=lambda: 5.0e9, monotonic=lambda: clock[0])
    findings.listed("f", [metrics.Seen("c", "warning", "ns", "vm", "abc"),
                          metrics.Seen("c", "warning", "ns", "old", "def", resolved_at=5.0e9 - 3600)])
    [counts, each, read] = findings.collect()
    assert counts.samples == ((("f", "c", "warning"), 1.0),)
    assert each.samples == ((("f", "c", "warning", "ns", "vm", "abc", ""), 1.0),)  # resolved an hour ago: left out
    clock[0] += metrics.STALE_AFTER + 1
    assert all(not metric.samples for metric in findings.collect())


def test_a_rescans_visits_carry_what_set_them_off():
    from shared import rescan

    seen = []
    token = metrics.TRIGGER.set(metrics.RESCAN)
    try:
        rescan.run(list(range(20)), lambda c: seen.append(metrics.trigger()), rescan.Settings(workers=4))
    finally:
        metrics.TRIGGER.reset(token)
    assert seen == [metrics.RESCAN] * 20


def test_the_dead_letters_are_counted_with_a_bounded_set_of_destinations(serve):
    """30 destinations and one that is no URL: at most MAX_SERVICES names, then "other", and "unknown". The counter is
    the process's, and earlier tests in it may have dead-lettered (the fuzz suite does): the names they used count
    against the same bound (functions-framework loads the function's module afresh for each app, so the bound lives
    beside the counter, shared.metrics.DEAD_LETTER_DESTINATIONS)."""
    from functions.dead_letter.main import MAX_SERVICES

    client = serve("functions/dead_letter/main.py")
    before = _destinations(samples(client.get("/metrics").data))
    for n in range(30):
        client.post("/", headers={"ce-specversion": "1.0", "ce-id": f"d-{n}", "ce-source": "/s", "ce-type": "t",
                                  "ce-knativeerrordest": f"http://svc-{n}.vmevents.svc.cluster.local",
                                  "ce-knativeerrorcode": "500"}, data=b"{}")
    client.post("/", headers={"ce-knativeerrordest": "not a url", "ce-knativeerrorcode": "x"}, data=b"")
    text = samples(client.get("/metrics").data)
    after = _destinations(text)
    assert len(after) <= MAX_SERVICES + 2, after  # the names, "other" and "unknown"
    assert {"other", "unknown"} <= after
    room = MAX_SERVICES - len(before - {"other", "unknown"})
    assert {d for d in after - before if d.startswith("svc-")} == {f"svc-{n}" for n in range(max(room, 0))}
    assert 'vmevents_dead_letters_total{function="dead-letter",destination="unknown",code="unknown"}' in text


def _destinations(text: dict) -> set[str]:
    return {re.search(r'destination="([^"]*)"', k).group(1)  # type: ignore[union-attr]
            for k in text if k.startswith("vmevents_dead_letters_total")}


def test_a_finding_about_a_node_is_labelled_with_its_node():
    """evacuation-report's findings are about a Node (identity labels `node`, `state`): its gauge names the node, so
    the NodeEvacuation and NodeDown rules can say which (catalog/monitoring.py)."""
    found = metrics.seen({"node": "node-2", "state": "node-drain", "finding": "f1"}, "node-drain", "warning", None)
    assert (found.node, found.namespace, found.vm) == ("node-2", "", "")
    findings = metrics.Findings(clock=lambda: 5.0e9, monotonic=lambda: 1000.0)
    findings.listed("evacuation-report", [found])
    each = findings.collect()[1]
    assert dict(zip(each.labels, each.samples[0][0], strict=True))["node"] == "node-2"
