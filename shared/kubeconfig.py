"""Connecting to the Kubernetes API: in-cluster configuration, else KUBECONFIG; every problem one line."""
from __future__ import annotations

import os

from urllib3 import Retry

from shared.kube import Kube
from shared.kubeclient import client as k8s
from shared.kubeclient import incluster_loader, kubeconfig_loader
from shared.redact import scrub_urls


def _configuration() -> k8s.Configuration:
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
    configuration = _configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            incluster_loader().load_incluster_config(client_configuration=configuration)
        except Exception as exc:  # noqa: BLE001 - whatever it is, it must be one line, not a traceback
            raise RuntimeError(f"in-cluster Kubernetes configuration cannot be used: {_one_line(exc)}") from None
        return Kube(configuration)  # its ApiClient is built on the first request (shared/kube.py)
    path = os.environ.get("KUBECONFIG") or None
    if path and not os.path.isfile(path.split(os.pathsep)[0]):
        raise RuntimeError(f"no Kubernetes configuration: not in a cluster and KUBECONFIG={path} cannot be used "
                           f"(no such file); set KUBECONFIG to a kubeconfig file.")
    k8s_config = kubeconfig_loader()
    try:
        # Pass KUBECONFIG explicitly: the client reads it at import time otherwise. What new_client_from_config
        # does, but its ApiClient is built on the first request.
        k8s_config.load_kube_config(config_file=path, client_configuration=configuration)
        return Kube(configuration)
    except Exception as exc:  # noqa: BLE001 - a YAML error, a list where a map is due, a missing key, ...
        where = f"KUBECONFIG={path}" if path else f"{os.path.expanduser(k8s_config.KUBE_CONFIG_DEFAULT_LOCATION)}"
        raise RuntimeError(f"no Kubernetes configuration: not in a cluster and {where} cannot be used "
                           f"({_one_line(exc)}); set KUBECONFIG to a kubeconfig file.") from None


def _one_line(error: Exception) -> str:
    """An exception as one short line: the client's messages can span lines (YAML marks) or quote a whole file."""
    text = scrub_urls(" ".join(str(error).split())) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."
