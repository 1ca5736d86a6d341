"""Connecting to the Kubernetes API: in-cluster configuration, else KUBECONFIG; every problem one line.

In a pod the client is made on the first request (shared/kube.py `Kube.api`): `Configuration`, the REST layer
and `ApiClient` bring urllib3, pydantic and dateutil, which a function answering irrelevant events never needs.
What the in-cluster loader will read is checked at start-up all the same, so a pod without its service account
stops at once with the reason. Outside a pod the kubeconfig is loaded at start-up (its loader needs the client).
"""
from __future__ import annotations

import os
from typing import Any

from shared.kube import Kube, Unavailable
from shared.kubeclient import client as k8s
from shared.kubeclient import incluster_loader, kubeconfig_loader
from shared.metrics import measured
from shared.redact import scrub_urls

# Where the kubelet mounts the service account's token and CA: kubernetes.config.incluster_config's
# SERVICE_TOKEN_FILENAME and SERVICE_CERT_FILENAME (tests/shared/test_hotpath.py holds them equal), given to its
# loader explicitly.
SERVICE_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"


def _configuration() -> Any:
    from urllib3 import Retry

    configuration = k8s.Configuration()
    # Retry a failed connection at once, but never sleep on a 429/503 Retry-After inside a handler:
    # the answer goes back to the broker as a 5xx and the broker's backoff does the waiting.
    configuration.retries = Retry(total=2, connect=2, read=0, status=0, redirect=0,
                                  respect_retry_after_header=False)
    return configuration


def connect() -> Kube:
    """In-cluster configuration when running in a pod, else KUBECONFIG / ~/.kube/config.

    Raises RuntimeError with what to do when neither is there: a function that cannot reach the
    API must not start and pretend to work.
    """
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        problem = _in_cluster_problem()
        if problem:
            raise RuntimeError(f"in-cluster Kubernetes configuration cannot be used: {problem}")
        return Kube(connect=_in_cluster_client)
    path = os.environ.get("KUBECONFIG") or None
    if path and not os.path.isfile(path.split(os.pathsep)[0]):
        raise RuntimeError(f"no Kubernetes configuration: not in a cluster and KUBECONFIG={path} cannot be used "
                           f"(no such file); set KUBECONFIG to a kubeconfig file.")
    k8s_config = kubeconfig_loader()
    configuration = _configuration()
    try:
        # Pass KUBECONFIG explicitly: the client reads it at import time otherwise. What new_client_from_config
        # does, but its ApiClient is made on the first request.
        k8s_config.load_kube_config(config_file=path, client_configuration=configuration)
    except Exception as exc:  # noqa: BLE001 - a YAML error, a list where a map is due, a missing key, ...
        where = f"KUBECONFIG={path}" if path else f"{os.path.expanduser(k8s_config.KUBE_CONFIG_DEFAULT_LOCATION)}"
        raise RuntimeError(f"no Kubernetes configuration: not in a cluster and {where} cannot be used "
                           f"({_one_line(exc)}); set KUBECONFIG to a kubeconfig file.") from None
    return Kube(connect=lambda: measured(k8s.ApiClient(configuration)))


def _in_cluster_problem() -> str | None:
    """What kubernetes.config.incluster_config's loader would refuse (InClusterConfigLoader._load_config: the
    service host and port set, the token and CA files there and not empty), checked without importing it."""
    if not (os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("KUBERNETES_SERVICE_PORT")):
        return "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set"
    for what, path in (("service account token", SERVICE_TOKEN), ("service account CA", SERVICE_CA)):
        try:
            with open(path, "rb") as found:
                if not found.read(1):
                    return f"the {what} file {path} is empty"
        except OSError as exc:
            return f"the {what} file {path} cannot be read ({exc.strerror or type(exc).__name__})"
    return None


def _in_cluster_client() -> Any:
    """The client, configured by the in-cluster loader (it refreshes the token from the file every minute)."""
    configuration = _configuration()
    try:
        incluster_loader().InClusterConfigLoader(token_filename=SERVICE_TOKEN,
                                                 cert_filename=SERVICE_CA).load_and_set(configuration)
    except Exception as exc:  # noqa: BLE001 - checked at start-up; gone since: the broker redelivers
        raise Unavailable(f"in-cluster Kubernetes configuration cannot be used: {_one_line(exc)}") from None
    return measured(k8s.ApiClient(configuration))


def _one_line(error: Exception) -> str:
    """An exception as one short line: the client's messages can span lines (YAML marks) or quote a whole file."""
    text = scrub_urls(" ".join(str(error).split())) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."
