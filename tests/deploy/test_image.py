"""The Dockerfile's promises, checked without building it (no container engine runs here): a pinned
base image, a non-root numeric user, nothing written at run time, functions-framework as the
entry point, and the exact dependency pins of requirements.lock, which agree with pyproject.toml."""
from __future__ import annotations

import re
import subprocess
import tomllib

from packaging.requirements import Requirement

from tests.conftest import REPO
from tests.deploy.kustomize import container, env_of, knative_services, render

DOCKERFILE = (REPO / "Dockerfile").read_text()
LOCK = {Requirement(line).name.lower().replace("_", "-"): Requirement(line)
        for line in (REPO / "requirements.lock").read_text().splitlines() if line and not line.startswith("#")}


def instructions(name: str) -> list[str]:
    return re.findall(rf"^{name}\s+(.+)$", DOCKERFILE, re.M)


def test_base_image_is_pinned():
    default = re.search(r"^ARG PYTHON_IMAGE=(\S+)", DOCKERFILE, re.M).group(1)
    assert "@sha256:" in default or re.fullmatch(r"python:3\.11\.\d+-slim-\w+", default), \
        f"pin the base image by digest or an exact version tag, not {default}"
    assert all(line.split()[0] == "${PYTHON_IMAGE}" for line in instructions("FROM"))


def test_runs_as_a_non_root_numeric_user():
    users = instructions("USER")
    assert users and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", users[-1].strip()), \
        "a numeric non-root USER, so Kubernetes can enforce runAsNonRoot"


def test_nothing_is_written_at_run_time():
    assert "PYTHONDONTWRITEBYTECODE=1" in DOCKERFILE
    assert re.search(r"python -m compileall", DOCKERFILE), "compile the bytecode at build time"
    assert "TMPDIR=/dev/shm" in DOCKERFILE, "gunicorn's heartbeat file needs a writable temp dir"
    for svc in knative_services(render("base")):
        assert container(svc)["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_entry_point_is_functions_framework_reading_its_target_from_the_environment():
    assert instructions("ENTRYPOINT") == ['["functions-framework"]']
    assert not instructions("CMD"), "FUNCTION_TARGET/FUNCTION_SOURCE in each Service pick the function"
    for svc in knative_services(render("base")):
        assert {"FUNCTION_TARGET", "FUNCTION_SOURCE"} <= set(env_of(svc))


def test_installs_the_package_with_exactly_pinned_dependencies():
    assert re.search(r"pip install [^\n]*-r /src/requirements\.lock", DOCKERFILE)
    assert re.search(r"pip install [^\n]*--no-deps /src", DOCKERFILE), "nothing resolved beyond the lock"
    assert all(str(r.specifier).startswith("==") for r in LOCK.values())
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for line in declared:
        wanted = Requirement(line)
        pinned = LOCK.get(wanted.name.lower().replace("_", "-"))
        assert pinned, f"requirements.lock does not pin {wanted.name} (run make lock)"
        version = str(pinned.specifier).removeprefix("==")
        assert wanted.specifier.contains(version), \
            f"requirements.lock pins {pinned}, pyproject wants {wanted} (make lock)"


def test_the_docker_context_holds_only_what_the_image_needs():
    ignore = (REPO / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1:] and {"!shared/", "!functions/", "!requirements.lock"} <= set(ignore)


def test_make_image_says_what_is_missing_without_an_engine():
    done = subprocess.run(["make", "-s", "image", "CONTAINER_ENGINE="], cwd=REPO, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode != 0
    assert "make image: neither docker nor podman is installed" in done.stderr
