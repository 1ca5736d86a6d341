"""Least privilege, checked: what a ServiceAccount's shipped roles grant versus what it used.

Each function's end-to-end tests end with `assert_exact_rbac(world.cluster.requests, "vmevents/<sa>")`:
every (verb, API group, resource) the function's ServiceAccount is granted in deploy/ must have
been used by the tests, and nothing it used may be ungranted. A grant nobody uses is a permission
to remove (or a behaviour the tests do not reach).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from localknative.runtime import load_manifests
from simcluster.paths import DEPLOY_DIR

Grant = tuple[str, str, str]  # (verb, api group, resource[/subresource])


def granted(service_account: str, manifests: list[dict] | None = None) -> set[Grant]:
    """Every (verb, group, resource) the shipped (Cluster)RoleBindings give this "ns/name"."""
    return set(scopes(service_account, manifests))


@dataclass(frozen=True)
class Scope:
    """Where a grant holds: cluster-wide (namespace None), or in one namespace (a RoleBinding), for every
    object or only the named ones (`resourceNames`)."""

    namespace: str | None
    names: tuple[str, ...] = ()


def scopes(service_account: str, manifests: list[dict] | None = None) -> dict[Grant, set[Scope]]:
    """Every (verb, group, resource) this "ns/name" is granted, with where each grant holds."""
    manifests = manifests if manifests is not None else load_manifests(DEPLOY_DIR)
    namespace, name = service_account.split("/")
    roles = {(m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"]): m
             for m in manifests if m.get("kind") in ("Role", "ClusterRole")}
    found: dict[Grant, set[Scope]] = {}
    for binding in (m for m in manifests if m.get("kind") in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == name
                   and s.get("namespace", binding["metadata"].get("namespace")) == namespace
                   for s in binding.get("subjects") or ()):
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role = roles[(ref["kind"], None if ref["kind"] == "ClusterRole" else where, ref["name"])]
        for rule in role.get("rules") or ():
            assert "*" not in rule.get("verbs", ()) + rule.get("resources", ()) + rule.get("apiGroups", ()), \
                f"{ref['name']} uses a wildcard: least privilege means naming each verb and resource"
            for grant in ((v, g, r) for v in rule["verbs"] for g in rule["apiGroups"] for r in rule["resources"]):
                found.setdefault(grant, set()).add(Scope(where, tuple(rule.get("resourceNames") or ())))
    return found


def used(requests: Iterable, service_account: str) -> set[Grant]:
    """What the simulated API server saw this ServiceAccount ask for (allowed or not). Discovery (a group
    version's resource list: no resource) needs no grant of ours: Kubernetes' default ClusterRole
    `system:discovery` gives it to every authenticated user (device-conflict reads whether the API serves
    devices.harvesterhci.io)."""
    return {(r.verb, r.api_group, f"{r.resource}/{r.subresource}" if r.subresource else r.resource)
            for r in requests if r.service_account == service_account and r.resource}


def assert_exact_rbac(requests: Iterable, service_account: str, elsewhere: Iterable[Grant] = ()) -> None:
    """`elsewhere`: grants another module's tests use (and check they use), which this world cannot reach."""
    grants, uses = granted(service_account) - set(elsewhere), used(list(requests), service_account)
    assert uses, f"{service_account} made no request at all"
    assert not uses - grants, f"{service_account} needs permissions deploy/ does not grant: {sorted(uses - grants)}"
    assert not grants - uses, f"deploy/ grants {service_account} permissions it never used: {sorted(grants - uses)}"
