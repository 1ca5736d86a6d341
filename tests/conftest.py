"""Shared fixtures: an isolated environment and kubeconfig helpers."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def write_kubeconfig(path: Path, server: str, token: str = "none") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }))
    return path


@pytest.fixture
def unreachable_kubeconfig(tmp_path) -> Path:
    """A kubeconfig whose API server refuses connections: any API call fails loudly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch):
    """No test sees the developer's cluster or settings."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "CLEANUP_AFTER", "CLEANUP_FAILED", "CLEANUP_DRY_RUN",
                 "CLEANUP_NAMESPACES", "CLEANUP_EXCLUDE_NAMESPACES"):
        monkeypatch.delenv(name, raising=False)
