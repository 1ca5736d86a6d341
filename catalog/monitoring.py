"""Where operators look (docs/monitoring.md): deploy/components/monitoring, generated from the declarations. A
PodMonitor scraping every function's /metrics (docs/metrics.md), a PrometheusRule (one alert per finding, by the
alert names alert-forwarder uses, and alerts on vmevents itself), and a Grafana dashboard in a ConfigMap the way
rancher-monitoring's Grafana loads dashboards (label `grafana_dashboard: "1"` in `cattle-dashboards`: its chart's
grafana.sidecar.dashboards, rancher/charts charts/rancher-monitoring/104.1.2+up57.0.3/values.yaml).

The rules and the panels are data here, so that tests/monitoring/ can ask a real Prometheus every one of them."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from catalog.yamltext import Flow, Note, Quoted, document, documents
from shared.declaration import Function

DIRECTORY = "deploy/components/monitoring"
NAMESPACE = "vmevents"
DASHBOARDS_NAMESPACE = "cattle-dashboards"  # rancher-monitoring's grafana.sidecar.dashboards.searchNamespace
SCRAPE_INTERVAL = "15s"  # under queue-proxy's 30 s drain, so a pod scaled away is scraped after its last event
FINDING_WINDOW = "3m"    # an open finding's last value is kept this long across a gap between pods
# The labels a finding's alert carries: the metric's, as alert-forwarder's alert for the same finding has them.
FINDING_BY = "function, category, severity, namespace, vm, finding, node"


@dataclass(frozen=True)
class Rule:
    """One alert: `query` compared with `threshold` by `op` is its expression (split so that the tests can ask
    Prometheus the query alone)."""

    alert: str
    query: str
    op: str
    threshold: str
    severity: str | None       # None: the query's own `severity` label (a finding's)
    summary: str
    description: str
    runbook: str
    duration: str = "0m"

    @property
    def expr(self) -> str:
        query = f"({self.query})" if " or " in self.query else self.query  # `or` binds last in PromQL
        return f"{query} {self.op} {self.threshold}"


def finding_rules(functions: tuple[Function, ...]) -> list[Rule]:
    """One rule per declared alert of a function that keeps findings with episodes (it replies `.detected`): the
    finding's gauge, the last value each pod gave within FINDING_WINDOW, the most any pod says."""
    rules = []
    for function in functions:
        if "detected" not in function.replies:
            continue  # reported findings (vmi-cleanup's) have no open state: alert-forwarder forwards them
        for alert in function.alerts:
            categories = "|".join(alert.categories)
            about, ask = _about(function)
            rules.append(Rule(
                alert.name,
                f'max by ({FINDING_BY}) (last_over_time(vmevents_finding_open{{function="{function.name}", '
                f'category=~"{categories}"}}[{FINDING_WINDOW}]))', "==", "1", None,
                f"{{{{ $labels.category }}}} on {about} ({function.name})",
                f"vmevents' {function.name} holds an open {{{{ $labels.category }}}} finding about {about}. {ask}"
                f"`kubectl get events {'-A' if _of_node(function) else '-n {{ $labels.namespace }}'} "
                f"-l vmevents.io/finding={function.name}`.",
                alert.runbook))
    return rules


NODE = "the Node"  # a function's Identity.subject when its findings are about a Node (evacuation-report's)


def _of_node(function: Function) -> bool:
    return function.identity is not None and function.identity.subject == NODE


def _about(function: Function) -> tuple[str, str]:
    """What a finding's alert is about, in its labels' words, and where to read more."""
    if _of_node(function):
        return ("node {{ $labels.node }}",
                "Each VM on it, what will happen to it and the next step: `vmevents explain <namespace>/<vm>` for "
                "one of them, or ")
    return ("VM {{ $labels.namespace }}/{{ $labels.vm }}",
            "Its cause, evidence and next step: `vmevents explain {{ $labels.namespace }}/{{ $labels.vm }}`, or ")


SELF_RULES = (
    Rule("VmeventsEventsFailing", 'sum by (function) (increase(vmevents_events_total{code=~"5.."}[15m]))', ">", "0",
         "warning", "{{ $labels.function }} answers events with 5xx",
         "{{ $labels.function }} answered {{ $value | humanize }} event(s) with a 5xx in 15 minutes: the API was "
         "unreachable or refused (RBAC), and the broker retries, then dead-letters them. Its log lines say why.",
         "vmeventseventsfailing", "10m"),
    Rule("VmeventsAPIErrors", 'sum by (function, verb, resource, code) (increase(vmevents_api_requests_total'
         '{code=~"error|403|429|5.."}[10m]))', ">", "0", "warning",
         "{{ $labels.function }}: {{ $labels.verb }} {{ $labels.resource }} answered {{ $labels.code }}",
         "{{ $value | humanize }} request(s) of {{ $labels.function }} to the Kubernetes API failed in 10 minutes "
         "({{ $labels.verb }} {{ $labels.resource }}: {{ $labels.code }}; 403 is a missing grant, error no answer).",
         "vmeventsapierrors", "10m"),
    Rule("VmeventsDeliveriesFailing", 'sum by (function, receiver, result) (increase(vmevents_deliveries_total'
         '{result!="delivered"}[15m]))', ">", "0", "warning",
         "alert-forwarder cannot deliver to {{ $labels.receiver }} ({{ $labels.result }})",
         "{{ $value | humanize }} post(s) to {{ $labels.receiver }} were {{ $labels.result }} in 15 minutes: "
         "findings may not reach the people who act on them.", "vmeventsdeliveriesfailing", "5m"),
    # A counter born within the window (the dead-letter pod started then) counts whole: increase() takes a series'
    # first sample as its start, and one dead letter is one sample.
    Rule("VmeventsDeadLetters", "sum by (destination, code) (increase(vmevents_dead_letters_total[15m])) or sum by "
         "(destination, code) (vmevents_dead_letters_total unless vmevents_dead_letters_total offset 15m)", ">", "0",
         "warning", "events for {{ $labels.destination }} were dead-lettered",
         "The broker gave up on {{ $value | humanize }} event(s) for {{ $labels.destination }} (last status "
         "{{ $labels.code }}) in 15 minutes; the dead-letter sink's log has each one. The next re-scan catches "
         "what they were about.", "vmeventsdeadletters"),
    Rule("VmeventsRescanBehind", "sum by (function) (increase(vmevents_rescan_budget_stops_total[30m]))", ">", "5",
         "warning", "{{ $labels.function }}'s re-scans stop at their budget",
         "{{ $labels.function }}'s re-scan stopped at RESCAN_BUDGET {{ $value | humanize }} times in 30 minutes: "
         "it does not visit every candidate each tick (docs/api-cost.md).", "vmeventsrescanbehind"),
)


def runbooks(functions: tuple[Function, ...]) -> str:
    """README's address, as alert-forwarder's alerts give it (its RUNBOOK_BASE_URL's default)."""
    return next(f for f in functions if f.name == "alert-forwarder").setting("RUNBOOK_BASE_URL").default


def rules(functions: tuple[Function, ...]) -> list[Rule]:
    return finding_rules(functions) + list(SELF_RULES)


@dataclass(frozen=True)
class Panel:
    title: str
    query: str
    legend: str
    kind: str = "timeseries"   # timeseries | table | stat
    unit: str = "short"
    description: str = ""


PANELS = (
    Panel("Open findings", "max by (function, category, severity) (vmevents_findings_open)",
          "{{function}} {{category}} ({{severity}})", description="From the findings' Events, read by each re-scan."),
    Panel("Open findings, one row each", f"max by ({FINDING_BY}) (vmevents_finding_open) == 1", "", "table",
          description="Each open finding's VM (or node: evacuation-report's): ask `vmevents explain "
                      "<namespace>/<vm>` why."),
    Panel("Findings opened and resolved (1h)",
          "sum by (function, category) (increase(vmevents_findings_opened_total[1h])) "
          "or -sum by (function, category) (increase(vmevents_findings_resolved_total[1h]))",
          "{{function}} {{category}}", description="Opened above zero, resolved below."),
    Panel("Found by a re-scan, not by an event (1h)",
          'sum by (function) (increase(vmevents_findings_opened_total{trigger="rescan"}[1h]))', "{{function}}",
          description="For device-conflict, io-pause-report and migration-report: events that never arrived "
                      "(knative/eventing#8675)."),
    Panel("Decisions (1h)", "sum by (function, verdict) (increase(vmevents_decisions_total[1h]))",
          "{{function}} {{verdict}}"),
    Panel("vmi-cleanup: why not cleaned (1h)",
          'sum by (verdict, reason) (increase(vmevents_decisions_total{function="vmi-cleanup", '
          'verdict=~"skip|wait|leave"}[1h]))', "{{verdict}} {{reason}}"),
    Panel("Cleanups (1h)", "sum by (function, action, result) (increase(vmevents_actions_total[1h]))",
          "{{action}} {{result}}", description="result dry-run: what the dry run would have done."),
    Panel("Events answered", "sum by (function, verdict) (rate(vmevents_events_total[5m]))",
          "{{function}} {{verdict}}", unit="reqps"),
    Panel("Events answered with an error", 'sum by (function, code) (rate(vmevents_events_total{code!~"2.."}[5m]))',
          "{{function}} {{code}}", unit="reqps"),
    Panel("Re-scans", "sum by (function, result) (increase(vmevents_rescans_total[1h]))",
          "{{function}} {{result}}"),
    Panel("API requests", "sum by (function, verb, resource, code) (rate(vmevents_api_requests_total[5m]))",
          "{{function}} {{verb}} {{resource}} {{code}}", unit="reqps"),
    Panel("API latency (p99)", "histogram_quantile(0.99, sum by (le, function) "
          "(rate(vmevents_api_request_duration_seconds_bucket[5m])))", "{{function}}", unit="s"),
    Panel("Deliveries to receivers (1h)", "sum by (receiver, result) (increase(vmevents_deliveries_total[1h]))",
          "{{receiver}} {{result}}"),
    Panel("Dead letters (1h)", "sum by (destination, code) (increase(vmevents_dead_letters_total[1h]))",
          "{{destination}} {{code}}"),
    Panel("Memory per pod", "max by (function, pod) (process_resident_memory_bytes{function!=\"\"})",
          "{{function}} {{pod}}", unit="bytes"),
)


# -- the objects -----------------------------------------------------------------------------------------
def pod_monitor(functions: tuple[Function, ...]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": {"name": "vmevents", "namespace": NAMESPACE, "labels": {"app.kubernetes.io/part-of": "vmevents"}},
        "spec": {
            "selector": {"matchExpressions": [
                Note({"key": "serving.knative.dev/service", "operator": "In",
                      "values": Flow(tuple(f.service_name for f in functions))},
                     above="Every function's pods: Knative labels a revision's pods with their Service's name.")]},
            "podMetricsEndpoints": [Note(
                {"port": "user-port", "path": "/metrics", "interval": SCRAPE_INTERVAL},
                above="The user container's port (Knative names it user-port: knative/serving pkg/apis/serving/v1, "
                      "UserPortName), not queue-proxy's, so a scrape does not count as traffic; every "
                      f"{SCRAPE_INTERVAL}, under queue-proxy's 30 s drain, so a pod scaled away is scraped after its "
                      "last event (docs/metrics.md).")]}}


def prometheus_rule(functions: tuple[Function, ...]) -> dict[str, Any]:
    base = runbooks(functions)

    def one(rule: Rule) -> dict[str, Any]:
        labels = {"severity": rule.severity} if rule.severity else {}
        return {"alert": rule.alert, "expr": rule.expr, "for": rule.duration,
                **({"labels": labels} if labels else {}),
                "annotations": {"summary": rule.summary, "description": rule.description,
                                "runbook_url": f"{base}#{rule.runbook}"}}
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": "vmevents", "namespace": NAMESPACE, "labels": {"app.kubernetes.io/part-of": "vmevents"}},
        "spec": {"groups": [
            Note({"name": "vmevents.findings", "rules": [one(r) for r in finding_rules(functions)]},
                 above="One alert per open finding, named as alert-forwarder names it, with the finding's labels: use "
                       "these or alert-forwarder's ALERTMANAGER_URL, not both (docs/monitoring.md)."),
            Note({"name": "vmevents.self", "rules": [one(r) for r in SELF_RULES]},
                 above="vmevents itself: failing answers, API errors, undelivered alerts, dead letters, re-scans "
                       "that fall behind.")]}}


def dashboard_json() -> dict[str, Any]:
    panels = []
    for number, panel in enumerate(PANELS):
        width = 24 if panel.kind == "table" else 12
        panels.append({
            "id": number + 1, "type": panel.kind, "title": panel.title, "description": panel.description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": width, "x": 0 if width == 24 else (number % 2) * 12, "y": number * 8},
            "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
            "targets": [{"refId": "A", "expr": panel.query, "legendFormat": panel.legend,
                         **({"format": "table", "instant": True} if panel.kind == "table" else {})}],
        })
    return {
        "title": "vmevents", "uid": "vmevents", "tags": ["vmevents", "kubevirt", "harvester"],
        "schemaVersion": 39, "version": 1, "editable": True, "timezone": "utc", "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus", "current": {}}]},
        "panels": panels,
    }


def dashboard(namespace: str = DASHBOARDS_NAMESPACE) -> str:
    """The dashboard's ConfigMap: its JSON in a block scalar, as people read it."""
    head = document({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "vmevents-dashboard", "namespace": namespace,
                                  "labels": {"grafana_dashboard": Quoted("1"),
                                             "app.kubernetes.io/part-of": "vmevents"}}},
                    head="vmevents' Grafana dashboard. rancher-monitoring's Grafana loads every ConfigMap labelled "
                         'grafana_dashboard: "1" in cattle-dashboards (its grafana.sidecar.dashboards); elsewhere, '
                         "the namespace your Grafana's sidecar watches.")
    text = json.dumps(dashboard_json(), indent=2)
    return head + "data:\n  vmevents.json: |-\n" + "".join(f"    {line}\n" for line in text.splitlines())


KUSTOMIZATION = {"apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component",
                 "resources": ["podmonitor.yaml", "prometheusrule.yaml", "dashboard.yaml"]}
KUSTOMIZATION_HEAD = (
    "Where operators look (docs/monitoring.md): a PodMonitor and a PrometheusRule (the Prometheus Operator's CRDs, "
    "monitoring.coreos.com/v1: rancher-monitoring installs them) and vmevents' Grafana dashboard. Generated by `make "
    "generate` (catalog/monitoring.py). A component, so that any install adds it with one line; "
    "deploy/overlays/monitoring is the default install with it.")


def outputs(functions: tuple[Function, ...]) -> dict[str, str]:
    head = "Generated from the functions' declarations by `make generate` (catalog/monitoring.py)."
    return {
        f"{DIRECTORY}/kustomization.yaml": document(KUSTOMIZATION, head=KUSTOMIZATION_HEAD),
        f"{DIRECTORY}/podmonitor.yaml": document(pod_monitor(functions), head=head),
        f"{DIRECTORY}/prometheusrule.yaml": documents([(head, prometheus_rule(functions))]),
        f"{DIRECTORY}/dashboard.yaml": dashboard(),
    }
