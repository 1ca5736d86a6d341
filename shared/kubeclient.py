"""The parts of the `kubernetes` package the functions use, imported without the rest of it, and each when first
used.

`import kubernetes` runs the package's `__init__`, which imports the dynamic client (and through it
kubernetes_validate and jsonschema), watch, stream, utils, leaderelection and informer, and
`kubernetes.client`'s, which imports every API class and some seven hundred model classes. The
functions use the configuration loaders (`kubernetes.config`: kubeconfig, in-cluster, exec and OIDC/GCP
auth plugins), `Configuration`, `ApiClient` and its REST layer, and `ApiException`: shared/kube.py
sends every request through `ApiClient.param_serialize` / `call_api` and keeps responses as dicts, so
no model class is ever built. Those are what is imported, from the package's own modules, and only when first
asked for: `ApiException` at once (its module is small); `Configuration` and the REST layer bring urllib3,
`ApiClient` brings pydantic, dateutil and multiprocessing.pool: together most of what a function costs at
start-up beyond functions-framework (docs/hot-path.md), and an irrelevant event needs none of them. In a pod
shared/kubeconfig.py asks for them on the first request; outside one, the kubeconfig loader (requests, oauthlib,
YAML) asks for them at start.

How: the packages `kubernetes`, `kubernetes.client`, `kubernetes.client.models`, `kubernetes.utils` and
`kubernetes.config` are entered in sys.modules as their real module objects (found by the import system, so
`__path__` and `__spec__` are the package's) without running their `__init__`. Asked for a name it does not hold
yet (PEP 562 module `__getattr__`), such a package imports the one module that holds it when it is one of `_PARTS`
or a submodule (`from kubernetes.client import rest`), and otherwise runs its real `__init__`. So a later `from
kubernetes.client import V1Pod` or `import kubernetes.watch`, in a test or in code written after this,
gets the whole package as usual, just later. Call `load()` before anything imports `kubernetes`; when
something already has, it returns the package as it is.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

# The packages whose __init__ waits for a name it does not hold (parents first).
_DEFERRED = ("kubernetes", "kubernetes.client", "kubernetes.client.models", "kubernetes.utils", "kubernetes.config")
# Names a deferred package answers by importing the one module that holds them, not its whole __init__: what
# kubernetes/client/__init__.py exports and kubernetes.config imports by name from it.
_PARTS = {"kubernetes.client": {"ApiClient": "kubernetes.client.api_client",
                                "Configuration": "kubernetes.client.configuration",
                                "ApiException": "kubernetes.client.exceptions"}}
_lock = threading.RLock()


def _deferred_package(name: str) -> ModuleType:
    """The package `name` as the import system would make it, without running its __init__ yet."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name!r}")
    module = importlib.util.module_from_spec(spec)
    done = [False]
    parts = _PARTS.get(name, {})

    def complete(attribute: str) -> Any:
        if not done[0] and not attribute.startswith("__"):
            with _lock:
                if attribute in parts:
                    module.__dict__.setdefault(attribute, getattr(importlib.import_module(parts[attribute]),
                                                                  attribute))
                    return module.__dict__[attribute]
                if importlib.util.find_spec(f"{name}.{attribute}") is not None:  # a submodule: that one alone
                    return importlib.import_module(f"{name}.{attribute}")
        # Run the real __init__ into this same module once, then answer from it.
        with _lock:
            if not done[0]:
                done[0] = True
                spec.loader.exec_module(module)  # type: ignore[union-attr]
        try:
            return module.__dict__[attribute]
        except KeyError:
            pass
        # kubernetes 37's client and models packages load their classes lazily with a module __getattr__ of
        # their own, which the __init__ just run put in place of this one: the first name asked goes to it too.
        own = module.__dict__.get("__getattr__")
        if own is not None and own is not complete:
            return own(attribute)
        raise AttributeError(f"module {name!r} has no attribute {attribute!r}")

    module.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


def load() -> None:
    """Enter the deferred packages; every part is imported when first asked for (see _PARTS)."""
    with _lock:
        if "kubernetes" in sys.modules:
            return
        for name in _DEFERRED:
            _deferred_package(name)


def incluster_loader() -> ModuleType:
    """kubernetes.config.incluster_config: the service account's token and CA, what a function in a pod uses
    (with Configuration, so urllib3)."""
    return importlib.import_module("kubernetes.config.incluster_config")


def kubeconfig_loader() -> ModuleType:
    """kubernetes.config.kube_config: kubeconfig files with their auth plugins (exec, OIDC, GCP, Azure), which
    bring requests and oauthlib; imported only when a function runs outside a cluster."""
    return importlib.import_module("kubernetes.config.kube_config")


load()

# What shared/kube.py and shared/kubeconfig.py use, imported after load() so that they are the parts alone.
from kubernetes import client  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

__all__ = ["ApiException", "client", "incluster_loader", "kubeconfig_loader", "load"]
