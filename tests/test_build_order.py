"""tests/conftest.py's components_for: which of controlplane/build.py's builds a test that needs binaries waits for,
and so where its module runs among those tests (in build.ALL's order of the builds)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from controlplane import build
from tests.conftest import components_for

BASE = (build.KUBE, build.ETCD, build.KNATIVE)


def _item(tmp_path, source: str, nodeid: str, real: bool = True):
    path = tmp_path / f"test_{abs(hash((source, nodeid)))}.py"
    path.write_text(source)
    marks = {"real": object()} if real else {"built": object()}
    return SimpleNamespace(path=path, nodeid=f"{path.name}::{nodeid}", get_closest_marker=marks.get)


def test_a_real_row_with_no_version_waits_for_the_default_worlds_virt_controller(tmp_path):
    assert components_for(_item(tmp_path, "def test_x(world): pass\n", "test_x[real]")) == (
        *BASE, build.KUBEVIRT["v1.3.0"])


def test_each_kubevirt_version_named_in_the_id_or_the_module(tmp_path):
    item = _item(tmp_path, "VERSIONS = ('1.1.1',)\n", "test_x[kubevirt-1.8.3-real]")
    assert set(components_for(item)) == {*BASE, build.KUBEVIRT["v1.3.0"], build.KUBEVIRT["v1.8.3"],
                                         build.KUBEVIRT["v1.1.1"]}


def test_a_version_no_virt_controller_stands_for_is_not_a_build(tmp_path):
    item = _item(tmp_path, "# kube-apiserver 1.33.13, a KubeVirt <= 1.5.0 bug\n", "test_x[real]")
    assert components_for(item) == (*BASE, build.KUBEVIRT["v1.3.0"])  # the default world's, as always


@pytest.mark.parametrize("source", ["from tests.delivery import trigger\n", "from bench.broker import local\n"])
def test_knatives_broker_needs_servings_webhook_too(tmp_path, source):
    assert build.SERVING in components_for(_item(tmp_path, source, "test_x[knative]"))


def test_a_module_that_builds_everything_waits_for_everything(tmp_path):
    assert components_for(_item(tmp_path, "build.ensure_all()\n", "test_x")) == build.ALL


def test_an_unmarked_real_call_in_a_built_test_counts_as_everything(tmp_path):
    """A `built` test that names no build it asks for: everything, rather than a wait inside its timeout."""
    assert components_for(_item(tmp_path, "def test_x(): pass\n", "test_x", real=False)) == build.ALL


def test_the_chart_tests_helm_fixture_means_helm(tmp_path):
    item = _item(tmp_path, "from tests.deploy.test_chart import helm, template\n", "test_x[a]", real=False)
    assert build.HELM in components_for(item) and components_for(item) != build.ALL
