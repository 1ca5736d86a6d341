"""The Helm chart's values (deploy/chart/vmevents/values.yaml) and the Harvester Add-on's (the valuesContent of
deploy/harvester/addon.yaml) from the declarations: every function's settings with their defaults and its
container's resources, and the settings operators change most."""
from __future__ import annotations

from typing import Any

from catalog.manifests import REGISTRY, role_name
from catalog.yamltext import Flow, Note, Quoted, document
from shared.declaration import Function

VALUES_HEAD = ("vmevents' settings, with deploy/'s defaults: generated from the functions' declarations "
               "(functions/<name>/declaration.py) by `make generate` (catalog/chart.py); edit those, not this file. "
               "Each function's settings are documented in docs/<function>.md; the ones operators change most are in "
               "deploy/harvester/addon.yaml.")
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
        document({"functions": {f.service_name: Note({"env": {s.name: Quoted(s.default) for s in f.settings},
                                                      "resources": _resources(f)},
                                                     above=f"docs/{f.name}.md")
                                for f in functions}},
                 head="One entry per Knative Service: env is its settings (every variable but "
                      "FUNCTION_TARGET/FUNCTION_SOURCE), resources its container's."),
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


def addon_values(functions: tuple[Function, ...]) -> str:
    """The Add-on's valuesContent: the image, the prevention, and each setting declared `addon` with its default."""
    chosen = {f.service_name: {"env": {s.name: Note(Quoted(s.default), above=s.doc) for s in f.settings if s.addon}}
              for f in functions if any(s.addon for s in f.settings)}
    text = document({"image": _image(),
                     "prevention": {"enabled": Note(False, after="the admission policy on host devices "
                                                                 "(docs/device-conflict.md)"),
                                    "validationActions": Note(Flow(("Warn",)), after="[Deny] refuses a VM that names "
                                                                                     "a device another VM holds")},
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
