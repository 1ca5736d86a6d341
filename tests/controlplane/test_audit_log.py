"""RealCluster.requests reads kube-apiserver's audit log from where clear_requests() marked it, across a rotation:
lumberjack renames the full file to `audit-<time>.log` and starts `audit.log` afresh (docs/control-plane.md)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from controlplane.cluster import RealCluster


def _line(user: str, name: str) -> str:
    return json.dumps({"stage": "ResponseComplete", "verb": "get", "user": {"username": user},
                       "objectRef": {"resource": "pods", "namespace": "default", "name": name},
                       "responseStatus": {"code": 200},
                       "annotations": {"authorization.k8s.io/decision": "allow"}}) + "\n"


@pytest.fixture
def cluster(tmp_path):
    return RealCluster(SimpleNamespace(audit_log=tmp_path / "audit.log"))


def test_requests_start_at_the_mark(cluster):
    log = cluster.plane.audit_log
    log.write_text(_line("admin", "before"))
    cluster.clear_requests()
    with log.open("a") as f:
        f.write(_line("admin", "after"))
        f.write(_line("admin", "half")[:20])  # being written: read next time
    assert [r.name for r in cluster.requests] == ["after"]


def test_a_rotation_since_the_mark_is_followed(cluster):
    log = cluster.plane.audit_log
    log.write_text(_line("admin", "before"))
    cluster.clear_requests()
    with log.open("a") as f:
        f.write(_line("admin", "one"))
    log.rename(log.parent / "audit-2026-12-02T13-00-00.000.log")
    (log.parent / "audit-2026-12-02T13-05-00.000.log").write_text(_line("admin", "two"))
    log.write_text(_line("admin", "three"))
    assert [r.name for r in cluster.requests] == ["one", "two", "three"]


def test_a_rotated_file_that_is_gone_is_an_error_not_an_empty_list(cluster):
    log = cluster.plane.audit_log
    log.write_text(_line("admin", "before"))
    cluster.clear_requests()
    fresh = log.parent / "fresh.log"
    fresh.write_text(_line("admin", "after"))
    fresh.replace(log)  # a new file in its place, the marked one gone with no backup
    with pytest.raises(RuntimeError, match="rotated"):
        cluster.requests  # noqa: B018
