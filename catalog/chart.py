"""The Helm chart's values (deploy/chart/vmevents/values.yaml) and the Harvester Add-on's (the valuesContent of
deploy/harvester/addon.yaml) from the declarations: every function's settings with their defaults and its
container's resources, and the settings operators change most."""
from __future__ import annotations

from typing import Any

from catalog.manifests import REGISTRY, role_name
from catalog.monitoring import DASHBOARDS_NAMESPACE
from catalog.yamltext import Flow, Note, Quoted, document
from shared.declaration import Function, Setting

VALUES_HEAD = ("vmevents' settings, with deploy/'s defaults: generated from the functions' declarations "
               "(functions/<name>/declaration.py) by `make generate` (catalog/chart.py); edit those, not this file. "
               "Each function's settings are documented in docs/<function>.md; the ones operators change most are in "
               "deploy/harvester/addon.yaml.")
DRY_RUN = "_DRY_RUN"
# What README, the values and the Add-on say of the one setting that takes an install out of its dry run.
LIVE = ("to go live, set functions.vmi-cleanup.env.CLEANUP_DRY_RUN to \"false\" (vmi-cleanup then deletes the VMIs "
        "it reported; no other function changes anything but Events and its own ConfigMaps)")
# The Add-on's block starts after this line of deploy/harvester/addon.yaml; what is above it is written by hand.
ADDON_BLOCK = "  valuesContent: |-\n"


def _image() -> dict[str, Any]:
    return {"repository": REGISTRY["newName"], "tag": Quoted(REGISTRY["newTag"])}


def _resources(function: Function) -> dict[str, Any]:
    r = function.service.resources
    return {"requests": {"cpu": r.cpu, "memory": r.memory}, "limits": {"memory": r.memory_limit}}


def values(functions: tuple[Function, ...]) -> str:
    """deploy/chart/vmevents/values.yaml."""
    sections = [
        document({"image": {**_image(), "pullPolicy": Note(Quoted(""), after="empty: the cluster's default "
                                                                             "(IfNotPresent for a tag)")}},
                 head=VALUES_HEAD),
        document({"broker": {"class": Note("MTChannelBasedBroker",
                                           above="deploy/overlays/default: Knative's channel-based broker; \"Kafka\" "
                                                 "for Knative's Kafka broker (see deploy/overlays/kafka).")}}),
        document({"prevention": {"enabled": False,
                                 "validationActions": Note(Flow(("Warn",)),
                                                           after="[Deny] refuses, as deploy/overlays/prevent-deny")}},
                 head="deploy/components/prevent: the ValidatingAdmissionPolicy refusing (or warning about) a VM that "
                      "names a host device already assigned to another VM (docs/device-conflict.md)."),
        document({"monitoring": {
            "enabled": Note(False, after="PodMonitor and PrometheusRule need the Prometheus Operator's CRDs"),
            "dashboardNamespace": Note(DASHBOARDS_NAMESPACE, after="where your Grafana's sidecar loads dashboards "
                                                                  "(rancher-monitoring's)")}},
                 head="deploy/components/monitoring (docs/monitoring.md): a PodMonitor scraping every function's "
                      "/metrics, a PrometheusRule and the Grafana dashboard. The first two are the Prometheus "
                      "Operator's (monitoring.coreos.com/v1), which rancher-monitoring installs: with enabled and "
                      "without them the render fails, naming them."),
        document({"functions": {f.service_name: Note({"env": {s.name: _installed(s) for s in f.settings},
                                                      "resources": _resources(f)},
                                                     above=f"docs/{f.name}.md")
                                for f in functions}},
                 head="One entry per Knative Service: env is its settings (every variable but "
                      "FUNCTION_TARGET/FUNCTION_SOURCE), resources its container's. The chart starts in dry run: "
                      "every *_DRY_RUN is \"true\" (as deploy/overlays/dry-run); " + LIVE + "."),
    ]
    return "\n".join(sections)


SCOPED_PATH = "deploy/chart/vmevents/templates/_scoped.tpl"


def scoped(functions: tuple[Function, ...]) -> str:
    """The chart's helper `vmevents.scoped`: each grant scoped by a namespaces setting, as YAML (the
    ClusterRoleBinding's name: [its Knative Service, the setting]); templates/objects.yaml reads it with fromYaml."""
    rows = [f"{role_name(f, g)}: [{f.service_name}, {g.scoped_by}]" for f in functions for g in f.grants
            if g.scoped_by]
    return ("{{- /* Generated from the functions' declarations by `make generate` (catalog/chart.py): edit their\n"
            "declaration.py, never this file. Each grant scoped by a namespaces setting: the name of its\n"
            "ClusterRoleBinding, and the Knative Service and the setting that scope it. */ -}}\n"
            '{{- define "vmevents.scoped" -}}\n' + "\n".join(rows) + "\n{{- end -}}\n")


def _installed(setting: Setting) -> Any:
    """A setting's value as the chart and the Add-on install it: its default, but a dry run's switch on."""
    return Quoted("true") if setting.name.endswith(DRY_RUN) else Quoted(setting.default)


def _addon_note(setting: Setting) -> str:
    return f"{setting.doc}; {LIVE}" if setting.name.endswith(DRY_RUN) else setting.doc


def addon_values(functions: tuple[Function, ...]) -> str:
    """The Add-on's valuesContent: the image, the prevention, monitoring, and each setting declared `addon` as the
    chart installs it (a dry run)."""
    chosen = {f.service_name: {"env": {s.name: Note(_installed(s), above=_addon_note(s)) for s in f.settings
                                       if s.addon}}
              for f in functions if any(s.addon for s in f.settings)}
    text = document({"image": _image(),
                     "prevention": {"enabled": Note(False, after="the admission policy on host devices "
                                                                 "(docs/device-conflict.md)"),
                                    "validationActions": Note(Flow(("Warn",)), after="[Deny] refuses a VM that names "
                                                                                     "a device another VM holds")},
                     "monitoring": {"enabled": Note(False, after="true once rancher-monitoring runs "
                                                                 "(docs/monitoring.md)")},
                     "functions": chosen},
                    head="Generated from the functions' declarations by `make generate` (catalog/chart.py): every "
                         "setting declared `addon=True`, with its default.", indent=4)
    return text


def addon(current: str, functions: tuple[Function, ...]) -> str:
    """deploy/harvester/addon.yaml: its hand-written head, then the generated valuesContent."""
    head, found, _ = current.partition(ADDON_BLOCK)
    if not found:
        raise ValueError(f"deploy/harvester/addon.yaml has no line {ADDON_BLOCK.strip()!r} to put the values after")
    return head + ADDON_BLOCK + addon_values(functions)
