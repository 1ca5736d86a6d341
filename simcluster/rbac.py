"""Authentication and RBAC from the repo's own deploy/ manifests.

The functions run with least-privilege ServiceAccounts; a call the manifests do not grant must fail in the
tests exactly as on a cluster (403 Forbidden with the real message), or missing permissions ship unnoticed.
Rule matching follows k8s.io/kubernetes pkg/apis/rbac/v1/evaluation_helpers.go (VerbMatches,
APIGroupMatches, ResourceMatches, ResourceNameMatches); the message is k8s.io/apiserver
pkg/endpoints/handlers/responsewriters/errors.go forbiddenMessage.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from simcluster.store import ApiError

ADMIN = "admin"
RBAC_KINDS = ("ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


@dataclass(frozen=True)
class Request:
    """The authorizer.Attributes of one resource request."""
    verb: str
    api_group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def load_manifests(directory: Path) -> list[dict]:
    """Every RBAC document in every YAML file under `directory` (files may hold several documents)."""
    documents = []
    for path in sorted(directory.rglob("*.y*ml")):
        for doc in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if isinstance(doc, dict) and doc.get("kind") in RBAC_KINDS:
                documents.append(doc)
    return documents


def username(service_account: str) -> str:
    namespace, name = service_account.split("/", 1)
    return f"system:serviceaccount:{namespace}:{name}"


class Authorizer:
    def __init__(self, deploy_base: Path):
        documents = load_manifests(deploy_base) if deploy_base.is_dir() else []
        self._roles = {(d["metadata"].get("namespace", ""), d["metadata"]["name"]): d.get("rules") or []
                       for d in documents if d["kind"] == "Role"}
        self._cluster_roles = {d["metadata"]["name"]: d.get("rules") or []
                               for d in documents if d["kind"] == "ClusterRole"}
        self._bindings = [d for d in documents if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
        self._tokens: dict[str, str] = {secrets.token_urlsafe(24): ADMIN}
        self.service_accounts = sorted(f'{d["metadata"].get("namespace", "default")}/{d["metadata"]["name"]}'
                                       for d in documents if d["kind"] == "ServiceAccount")
        for service_account in self.service_accounts:
            self.token_for(service_account)

    # -- authentication ------------------------------------------------------------------------------------------

    def token_for(self, identity: str) -> str:
        """The bearer token of "ns/name" or ADMIN; a ServiceAccount not in deploy/ gets one too (and no rights)."""
        if identity != ADMIN and identity.count("/") != 1:
            raise ValueError(f"service_account must look like 'namespace/name', got {identity!r}")
        existing = next((t for t, who in self._tokens.items() if who == identity), None)
        if existing:
            return existing
        token = f"sim-{identity.replace('/', '-')}-{secrets.token_urlsafe(16)}"
        self._tokens[token] = identity
        return token

    def authenticate(self, authorization_header: str | None) -> str:
        scheme, _, token = (authorization_header or "").partition(" ")
        identity = self._tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if identity is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return identity

    # -- authorization -------------------------------------------------------------------------------------------

    def allows(self, identity: str, request: Request) -> bool:
        if identity == ADMIN:  # system:masters bypasses RBAC
            return True
        return any(_rule_allows(rule, request) for rule in self._rules_for(identity, request.namespace))

    def forbidden(self, identity: str, request: Request) -> ApiError:
        resource = request.resource + (f"/{request.subresource}" if request.subresource else "")
        scope = f'in the namespace "{request.namespace}"' if request.namespace else "at the cluster scope"
        user = username(identity)
        why = (f'User "{user}" cannot {request.verb} resource "{resource}" in API group "{request.api_group}" '
               f"{scope}")
        qualified = f"{request.resource}.{request.api_group}" if request.api_group else request.resource
        # errors.NewForbidden: `<resource>.<group> "<name>" is forbidden: ...` (no name on collection requests).
        subject = f'{qualified} "{request.name}"' if request.name else qualified
        details = {"group": request.api_group, "kind": request.resource}
        if request.name:
            details["name"] = request.name
        return ApiError(403, "Forbidden", f"{subject} is forbidden: {why}", details)

    def _rules_for(self, identity: str, namespace: str):
        for binding in self._bindings:
            if not any(_subject_matches(s, identity) for s in binding.get("subjects") or []):
                continue
            bound_namespace = binding["metadata"].get("namespace", "") if binding["kind"] == "RoleBinding" else ""
            if bound_namespace and bound_namespace != namespace:
                continue  # a RoleBinding grants only inside its own namespace
            yield from self._role_rules(binding["roleRef"], bound_namespace)

    def _role_rules(self, role_ref: dict, namespace: str) -> list[dict]:
        if role_ref.get("kind") == "ClusterRole":
            return self._cluster_roles.get(role_ref["name"], [])
        return self._roles.get((namespace, role_ref["name"]), [])


def _subject_matches(subject: dict, identity: str) -> bool:
    namespace, name = identity.split("/", 1)
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        return subject.get("name") == name and subject.get("namespace", "") == namespace
    if kind == "User":
        return subject.get("name") == username(identity)
    if kind == "Group":
        return subject.get("name") in ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                                       "system:authenticated")
    return False


def _rule_allows(rule: dict, request: Request) -> bool:
    return (_matches(rule.get("verbs"), request.verb)
            and _matches(rule.get("apiGroups"), request.api_group)
            and _resource_matches(rule.get("resources") or [], request)
            and (not rule.get("resourceNames") or request.name in rule["resourceNames"]))


def _matches(allowed: list | None, value: str) -> bool:
    return bool(allowed) and ("*" in allowed or value in allowed)


def _resource_matches(rule_resources: list[str], request: Request) -> bool:
    combined = request.resource + (f"/{request.subresource}" if request.subresource else "")
    for resource in rule_resources:
        if resource in ("*", combined):
            return True
        if request.subresource and resource == f"*/{request.subresource}":
            return True
    return False
