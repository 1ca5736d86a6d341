"""The parts of the `kubernetes` package the functions use, imported without the rest of it.

`import kubernetes` runs the package's `__init__`, which imports the dynamic client (and through it
kubernetes_validate and jsonschema), watch, stream, utils, leaderelection and informer, and
`kubernetes.client`'s, which imports every API class and some seven hundred model classes. The
functions use the configuration loaders (`kubernetes.config`: kubeconfig, in-cluster, exec and OIDC/GCP
auth plugins), `Configuration`, `ApiClient` and its REST layer, and `ApiException`: shared/kube.py
sends every request through `ApiClient.param_serialize` / `call_api` and keeps responses as dicts, so
no model class is ever built. Those are what is imported here, from the package's own modules; of the
configuration loaders, the in-cluster one in a pod, the kubeconfig one (requests, oauthlib, YAML) elsewhere.
`ApiClient` itself waits for its first use: its module brings pydantic (for `SecretStr` and the
`ApiResponse` model), dateutil and multiprocessing.pool, about a third of what the client costs at start
(docs/hot-path.md), and an irrelevant event never needs it (shared/kube.py builds it on the first request).

How: the packages `kubernetes`, `kubernetes.client`, `kubernetes.client.models`, `kubernetes.utils` and
`kubernetes.config` are entered in sys.modules as their real module objects (found by the import system, so `__path__`
and `__spec__` are the package's) without running their `__init__`; each runs it the first time
anything asks it for a name it does not hold yet (PEP 562 module `__getattr__`), except the names of
`_PARTS`, which import the one module that holds them. So a later `from
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
# Names a deferred package answers by importing the one module that holds them, not its whole __init__.
_PARTS = {"kubernetes.client": {"ApiClient": "kubernetes.client.api_client"}}
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
        if attribute in parts and not done[0]:
            with _lock:
                value = getattr(importlib.import_module(parts[attribute]), attribute)
                module.__dict__.setdefault(attribute, value)
                return module.__dict__[attribute]
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
    """Import Configuration, the REST layer and ApiException; the configuration loaders and ApiClient
    (`kubernetes.client.ApiClient`, see _PARTS) when first asked for."""
    with _lock:
        if "kubernetes" in sys.modules:
            return
        for name in _DEFERRED:
            _deferred_package(name)
        client: Any = sys.modules["kubernetes.client"]
        # What kubernetes/client/__init__.py exports and kubernetes.config imports by name from it.
        client.Configuration = importlib.import_module("kubernetes.client.configuration").Configuration
        client.exceptions = importlib.import_module("kubernetes.client.exceptions")
        client.ApiException = client.exceptions.ApiException
        client.rest = importlib.import_module("kubernetes.client.rest")


def incluster_loader() -> ModuleType:
    """kubernetes.config.incluster_config: the service account's token and CA, what a function in a pod uses."""
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
