"""The CustomResourceDefinitions a vmevents cluster has, built from the vendored upstream data in upstream/.

KubeVirt ships its CRDs from virt-operator, built in Go (pkg/virt-operator/resource/generate/components/
crds.go): the names, scope, short names, printer columns and subresources below are copied from there, and
each version's openAPIV3Schema is the vendored `CRDsValidation` value for the KubeVirt release under test.
Longhorn, harvester/pcidevices and Knative publish their CRDs as manifests; those are installed as they are
(Helm's `{{ }}` templating in two of them stripped, as simcluster.schemas reads them).
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from simcluster import paths
from simcluster.schemas import _crd_documents, kubevirt_schema_dir
from simcluster.tables import PRINTER_COLUMNS

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
STATUS = {"status": {}}

# (plural, kind, singular, short names, scope, group, printer columns, subresources) per crds.go; the printer
# columns live in simcluster/tables.py, whose Table answers use them too.
KUBEVIRT_CRDS: tuple[dict[str, Any], ...] = (
    {"plural": "virtualmachineinstances", "kind": "VirtualMachineInstance", "short": ["vmi", "vmis"],
     "columns": PRINTER_COLUMNS["virtualmachineinstances"],
     "subresources": None},  # no status subresource: virt-handler writes VMI status with the object
    {"plural": "virtualmachines", "kind": "VirtualMachine", "short": ["vm", "vms"],
     "columns": PRINTER_COLUMNS["virtualmachines"], "subresources": STATUS},
    {"plural": "virtualmachineinstancemigrations", "kind": "VirtualMachineInstanceMigration",
     "short": ["vmim", "vmims"], "columns": PRINTER_COLUMNS["virtualmachineinstancemigrations"],
     "subresources": STATUS},
    {"plural": "kubevirts", "kind": "KubeVirt", "short": ["kv", "kvs"], "columns": PRINTER_COLUMNS["kubevirts"],
     "subresources": STATUS, "labels": {"operator.kubevirt.io": ""}},
    {"plural": "migrationpolicies", "kind": "MigrationPolicy", "singular": "migrationpolicy",
     "group": "migrations.kubevirt.io", "version": "v1alpha1", "scope": "Cluster", "short": [],
     "categories": [], "columns": PRINTER_COLUMNS["migrationpolicies"], "subresources": STATUS},
)


@functools.cache
def _schema(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the KubeVirt schema this CRD needs is missing (see upstream/README.md)")
    return yaml.load(path.read_text(), Loader=_Loader)["openAPIV3Schema"]


def kubevirt_crds(kubevirt_version: str) -> list[dict]:
    schemas = kubevirt_schema_dir(kubevirt_version)
    crds = []
    for spec in KUBEVIRT_CRDS:
        group, version = spec.get("group", "kubevirt.io"), spec.get("version", "v1")
        singular = spec.get("singular", spec["kind"].lower())
        served: dict[str, Any] = {"name": version, "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": copy.deepcopy(
                                      _schema(schemas / f"{singular}.openAPIV3Schema.yaml"))}}
        if spec["columns"]:
            served["additionalPrinterColumns"] = copy.deepcopy(spec["columns"])
        if spec["subresources"]:
            served["subresources"] = spec["subresources"]
        crds.append({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{spec['plural']}.{group}", "labels": spec.get("labels", {"kubevirt.io": ""})},
            "spec": {"group": group, "scope": spec.get("scope", "Namespaced"), "versions": [served],
                     "names": {"plural": spec["plural"], "singular": singular, "kind": spec["kind"],
                               "shortNames": spec["short"], "categories": spec.get("categories", ["all"])}}})
    return crds


def manifest_crds() -> list[dict]:
    """Longhorn, harvester/pcidevices, Harvester's Setting and Upgrade, Multus' NetworkAttachmentDefinition and
    Knative CRDs, from their vendored manifests."""
    root = paths.UPSTREAM_DIR
    files = [root / "longhorn" / "v1.10.0" / "crds.yaml", root / "harvester-pcidevices" / "crds.yaml",
             root / "harvester" / "v1.7.0" / "settings.crd.yaml", root / "harvester" / "v1.7.0" / "upgrades.crd.yaml",
             root / "multus" / "networks-crd.yaml",
             *sorted((root / "knative-eventing" / "knative-v1.22.2").glob("*.crd.yaml")),
             *sorted((root / "knative-serving" / "knative-v1.22.1").glob("*.crd.yaml"))]
    crds = []
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: a CRD manifest the control plane installs is missing")
        found = [copy.deepcopy(d) for d in _crd_documents(path) if d.get("kind") == "CustomResourceDefinition"]
        if not found:
            raise ValueError(f"{path} holds no CustomResourceDefinition")
        crds.extend(found)
    return crds


CDI_VERSION = "v1.64.0"  # the CDI API KubeVirt v1.8.3 builds against (its go.mod)


def cdi_crds() -> list[dict]:
    """CDI's DataVolume CRD (upstream/cdi/): a world with no virt-controller writes DataVolumes as CDI would. Not
    beside a running virt-controller: seeing it, virt-controller turns on its DataVolume integration and waits for
    CDI's CDI, CDIConfig, DataSource and StorageProfile CRDs too, and reconciles no VM without them (docs/facts.md
    §7; pkg/virt-controller/watch/application.go, hasCDI)."""
    path = paths.UPSTREAM_DIR / "cdi" / CDI_VERSION / "datavolume.crd.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: a CRD manifest the control plane installs is missing")
    return [copy.deepcopy(d) for d in _crd_documents(path) if d.get("kind") == "CustomResourceDefinition"]
