"""deploy/base from the declarations: one file per function (its ServiceAccount and roles, its Knative Service, its
Trigger), and the kustomization that lists them. The reasons in a declaration are kept as comments beside what
they explain, so the manifests read as they did when they were written by hand."""
from __future__ import annotations

from typing import Any

from catalog.yamltext import Flow, Note, documents
from shared.declaration import BROKER, DEAD_LETTER_SINK, REPLIES, TICK, VERBS, Function, Grant, On, Rule, Trigger

NAMESPACE = "vmevents"
IMAGE = "vmevents"  # the kustomization's `images` name, replaced by the registry's (deploy/base/kustomization.yaml)
PORT = 8080
PROBES_WHY = "Every function answers GET / with 200 without touching the API (shared/runtime.py)."
# The kustomization's own files, before the functions': the namespace, the broker, the sources.
FIXED = ("namespace.yaml", "broker.yaml", "sources.yaml")
REGISTRY = {"newName": "registry.example.com/vmevents/vmevents", "newTag": "0.1.0"}
RBAC = "rbac.authorization.k8s.io/v1"


def role_name(function: Function, grant: Grant) -> str:
    return f"vmevents-{function.name}" + (f"-{grant.suffix}" if grant.suffix else "")


def file_name(function: Function) -> str:
    return f"{function.name}.yaml"


def manifest(function: Function) -> str:
    """deploy/base/<function>.yaml."""
    return documents(manifest_documents(function))


def manifest_documents(function: Function) -> list[tuple[str, dict[str, Any]]]:
    """deploy/base/<function>.yaml's documents: (the comment above it, the object with its comments)."""
    head = (f"Generated from functions/{function.package}/declaration.py by `make generate`: edit that file, not "
            f"this one.\n\n{function.about}")
    docs: list[tuple[str, dict[str, Any]]] = []
    if function.account:
        docs.append((head, {"apiVersion": "v1", "kind": "ServiceAccount",
                                      "metadata": {"name": function.account, "namespace": NAMESPACE}}))
        for grant in function.grants:
            docs += _grant(function, grant)
    docs.append(("" if function.account else head, service(function)))
    if function.trigger is not None:
        docs.append((function.trigger.why, trigger(function, function.trigger)))
    return docs


def _grant(function: Function, grant: Grant) -> list[tuple[str, dict[str, Any]]]:
    name = role_name(function, grant)
    kind = "Role" if grant.namespaced else "ClusterRole"
    where = {"namespace": NAMESPACE} if grant.namespaced else {}
    role = {"apiVersion": RBAC, "kind": kind, "metadata": {"name": name, **where},
            "rules": [_rule(rule) for rule in grant.rules]}
    binding = {"apiVersion": RBAC, "kind": "RoleBinding" if grant.namespaced else "ClusterRoleBinding",
               "metadata": {"name": name, **where},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": function.account, "namespace": NAMESPACE}]}
    return [(grant.why, role), ("", binding)]


def _rule(rule: Rule) -> Note:
    body: dict[str, Any] = {"apiGroups": Flow((rule.group,)), "resources": Flow(rule.resources)}
    if rule.names:
        body["resourceNames"] = Flow(rule.names)
    body["verbs"] = Note(Flow(rule.verbs), after=rule.note)
    return Note(body, above=rule.why)


def service(function: Function) -> dict[str, Any]:
    s = function.service
    env: list[Any] = [{"name": "FUNCTION_TARGET", "value": "handle"},
                      {"name": "FUNCTION_SOURCE", "value": f"functions/{function.package}/main.py"}]
    env += [Note({"name": setting.name, "value": setting.default}, above=setting.why) for setting in function.settings]
    container: dict[str, Any] = {"image": IMAGE, "ports": [{"containerPort": PORT}], "env": env}
    if s.volumes:
        container["volumeMounts"] = [{"name": v.name, "mountPath": v.path, "readOnly": True} for v in s.volumes]
    container["resources"] = Note({"requests": {"cpu": s.resources.cpu, "memory": s.resources.memory},
                                   "limits": {"memory": s.resources.memory_limit}}, above=s.resources.why)
    container["readinessProbe"] = Note({"httpGet": {"path": "/"}}, above=PROBES_WHY)
    container["livenessProbe"] = {"httpGet": {"path": "/"}, "periodSeconds": 20, "failureThreshold": 3}
    container["securityContext"] = {
        "runAsNonRoot": True,
        "seccompProfile": {"type": Note("RuntimeDefault",
                                        after="the restricted Pod Security level; Serving warns without it")},
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": Flow(("ALL",))}}
    spec: dict[str, Any] = {}
    if function.account:
        spec["serviceAccountName"] = function.account
    else:
        spec["automountServiceAccountToken"] = Note(False, above=s.no_account_why)
    spec["containerConcurrency"] = Note(s.concurrency, above=s.concurrency_why)
    spec["containers"] = [container]
    if s.volumes:
        spec["volumes"] = [Note({"name": v.name, "secret": {"secretName": v.secret, "optional": True}}, above=v.why)
                           for v in s.volumes]
    annotations = {"autoscaling.knative.dev/min-scale": Note(str(s.scale.min), above=s.scale.why),
                   "autoscaling.knative.dev/max-scale": str(s.scale.max)}
    return {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
            "metadata": {"name": function.service_name, "namespace": NAMESPACE,
                         "labels": {"networking.knative.dev/visibility": "cluster-local",
                                    "app.kubernetes.io/part-of": "vmevents"}},
            "spec": {"template": {"metadata": {"annotations": annotations}, "spec": spec}}}


def _exact(attribute: str, values: tuple[str, ...]) -> dict[str, Any]:
    """One value: an exact filter; several: any of them."""
    exacts = [{"exact": {attribute: value}} for value in values]
    return exacts[0] if len(exacts) == 1 else {"any": exacts}


def _on(on: On) -> Note:
    return Note({"all": [_exact("kind", on.kinds), _exact("type", tuple(VERBS[v] for v in on.verbs))]}, above=on.why)


def filters(declared: Trigger) -> list[Any]:
    """The Trigger's filters: any of its changes, the replies, the tick (Knative's SubscriptionsAPI filters)."""
    anyof: list[Any] = [_on(on) for on in declared.on]
    if declared.replies:
        anyof.append({"prefix": {"type": REPLIES}})
    if declared.tick:
        anyof.append({"exact": {"type": TICK}})
    return [{"any": anyof}]


def _ref(kind: str, name: str, api: str = "serving.knative.dev/v1") -> dict[str, Any]:
    return {"ref": {"apiVersion": api, "kind": kind, "name": name}}


def trigger(function: Function, declared: Trigger) -> dict[str, Any]:
    d = declared.delivery
    return {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
            "metadata": {"name": function.name, "namespace": NAMESPACE},
            "spec": {"broker": BROKER, "filters": filters(declared),
                     "subscriber": _ref("Service", function.service_name),
                     "delivery": {"retry": d.retry, "backoffPolicy": "exponential", "backoffDelay": d.backoff_delay,
                                  "timeout": d.timeout, "deadLetterSink": _ref("Service", DEAD_LETTER_SINK)}}}


def kustomization(functions: tuple[Function, ...]) -> str:
    """deploy/base/kustomization.yaml."""
    return documents([("vmevents base: the broker, the event sources and one Knative Service per function "
                       "(generated from catalog.FUNCTIONS: make generate).",
                       {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                        "namespace": NAMESPACE,
                        "resources": [*FIXED, *(file_name(f) for f in functions)],
                        "images": [{"name": IMAGE, **REGISTRY}]})])
