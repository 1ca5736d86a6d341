"""The image: the Dockerfile's promises read from it (a pinned base, a non-root numeric user, nothing written at
run time, functions-framework as the entry point, the exact hashed pins of requirements.lock), and then the
built image itself (`make image`; .ci/run builds it), every function run from it with the pod settings deploy/
gives it (image/run.py): it answers the readiness probe, starts without an error line, stops on SIGTERM well
within Knative's grace period, and handles one event of its kind through the broker, on the simulator for
every function and on the real control plane with its ServiceAccount's token for vmi-cleanup.

With CI=true a missing container engine or image fails these tests; elsewhere they skip with one line."""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import time
import tomllib

import pytest
from packaging.requirements import Requirement

from image import build, engine, run
from image.engine import HOW_TO_ENABLE
from tests import backends
from tests.conftest import REPO
from tests.deploy.kustomize import container, env_of, knative_services, render

DOCKERFILE = (REPO / "Dockerfile").read_text()
LOCK_TEXT = (REPO / "requirements.lock").read_text()
LOCK = {Requirement(m).name.lower().replace("_", "-"): Requirement(m)
        for m in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*==\S+)", LOCK_TEXT, re.M)}


def instructions(name: str) -> list[str]:
    return re.findall(rf"^{name}\s+(.+)$", DOCKERFILE, re.M)


def test_base_image_is_pinned():
    default = re.search(r"^ARG PYTHON_IMAGE=(\S+)", DOCKERFILE, re.M).group(1)
    assert "@sha256:" in default or re.fullmatch(r"python:3\.11\.\d+-slim-\w+", default), \
        f"pin the base image by digest or an exact version tag, not {default}"
    stages = [line.split()[0] for line in instructions("FROM")]
    assert stages == ["${PYTHON_IMAGE}", "scratch"], "build on PYTHON_IMAGE, run from image/rootfs.py's files only"


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


def test_installs_the_package_with_exactly_pinned_and_hashed_dependencies():
    joined = DOCKERFILE.replace("\\\n", " ")
    assert re.search(r"pip install [^\n]*--require-hashes[^\n]*-r /src/requirements\.lock", joined)
    assert re.search(r"pip install [^\n]*--no-deps /src", joined), "nothing resolved beyond the lock"
    assert all(str(r.specifier).startswith("==") for r in LOCK.values())
    # every pin carries at least one sha256 (pip refuses the whole file under --require-hashes otherwise)
    entries = re.split(r"\n(?=[A-Za-z0-9])", LOCK_TEXT.split("\n", 3)[3])
    assert len(entries) == len(LOCK) and all("--hash=sha256:" in entry for entry in entries)
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


def test_the_build_hosts_trust_reaches_pip_as_a_secret_not_a_layer():
    runs = [r for r in re.findall(r"^RUN (.+?)(?<!\\)$", DOCKERFILE, re.M | re.S) if "pip install" in r]
    assert runs and all(r.startswith("--mount=type=secret,id=pip-cert") for r in runs)
    assert not re.search(r"^(COPY|ADD) .*(\.crt|\.pem|cert)", DOCKERFILE, re.M | re.I)
    assert "PIP_CERT" not in "".join(instructions("ENV")) + "".join(instructions("ARG"))


def test_make_image_says_what_is_missing_without_an_engine():
    done = subprocess.run(["make", "-s", "image"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "CONTAINER_ENGINE": ""})
    assert done.returncode != 0
    assert f"make image: no container engine answers here: {HOW_TO_ENABLE}" in done.stderr


# -- the built image ----------------------------------------------------------------------------------------
IMAGE = build.default_tag()
SERVICES = {svc["metadata"]["name"]: svc for svc in knative_services(render("default"))}
# A line no function may print while it starts and idles: gunicorn's own errors, Python's tracebacks.
BAD_START = re.compile(r"\[ERROR\]|\[CRITICAL\]|Traceback|Exception|error", re.I)


def _unavailable(why: str):
    if backends.in_ci():
        pytest.fail(f"image tests: {why} (CI must run them)")
    pytest.skip(f"image tests: {why}")


@pytest.fixture(scope="module")
def found_engine() -> engine.Engine:
    answering = engine.find()
    if answering is None:
        _unavailable(f"no container engine answers; {HOW_TO_ENABLE}")
    if not answering.has_image(IMAGE):
        _unavailable(f"{IMAGE} is not built; run `make image`")
    return answering


@pytest.fixture(scope="module")
def sim():
    from simcluster.apiserver import SimCluster

    cluster = SimCluster().start()
    yield cluster
    cluster.stop()


def test_the_image_runs_as_its_non_root_user_with_no_build_secret_inside(found_engine):
    assert run.image_user(found_engine, IMAGE) == (65532, 65532)
    done = found_engine.run("run", "--rm", "--entrypoint", "python", IMAGE, "-c",
                            "import os, sys; print(os.getuid(), os.path.exists('/run/secrets/pip-cert'), "
                            "sys.version_info[:2])", timeout=120)
    assert done.stdout.strip().split(None, 2) == ["65532", "False", "(3, 11)"]
    assert not [layer for layer in build.layers(found_engine, IMAGE) if "pip-cert" in layer.created_by
                and "--mount=type=secret" not in layer.created_by]


def _start(found_engine, sim, name: str, **overrides: str) -> run.ContainerFunction:
    svc = SERVICES[name]
    account = f"{svc['metadata']['namespace']}/{svc['spec']['template']['spec'].get('serviceAccountName', 'default')}"
    return run.ContainerFunction(svc, kubeconfig=sim.kubeconfig(service_account=account), env_overrides=overrides,
                                 engine=found_engine, image=IMAGE).start()


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_each_function_starts_clean_answers_its_probe_and_stops_on_sigterm(found_engine, sim, name):
    import requests

    function = _start(found_engine, sim, name)
    secrets = function._secrets  # the token or kubeconfig folder it mounts (none for dead-letter)
    try:
        probe = SERVICES[name]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"]
        answer = requests.get(function.url.rstrip("/") + probe, timeout=10)
        assert answer.status_code == 200, answer.text
        time.sleep(1.0)  # what a worker prints after it forked (the control server's error came then)
    finally:
        function.stop()
    bad = [line for line in function.logs() if BAD_START.search(line)]
    assert not bad, f"{name} printed at start:\n" + "\n".join(bad)
    assert function.exit_code == 0, f"{name} exited {function.exit_code} on SIGTERM:\n" + "\n".join(function.logs())
    assert function.stopped_in < run.KNATIVE_GRACE_SECONDS / 10, f"{name} took {function.stopped_in:.1f}s to stop"
    assert secrets is None or not os.path.exists(secrets), "the credentials' folder outlived the container"


def test_without_its_runtime_dir_gunicorn_fails_on_the_read_only_root(found_engine, sim):
    """The check above can fail: without XDG_RUNTIME_DIR gunicorn puts its control socket under the
    working directory, on the read-only root (gunicorn/config.py _get_default_control_socket)."""
    function = _start(found_engine, sim, "vmevents-dead-letter", XDG_RUNTIME_DIR="")
    try:
        line = function.wait_for_log(lambda text: "Control server error" in text, timeout=15)
    finally:
        function.stop()
    assert line and "[ERROR]" in line and "Read-only file system" in line


def test_dead_letter_runs_with_no_credentials_at_all(found_engine, sim):
    svc = SERVICES["vmevents-dead-letter"]
    assert svc["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    function = run.ContainerFunction(svc, kubeconfig=sim.kubeconfig(), engine=found_engine, image=IMAGE)
    function.port = 8080
    args = function.run_args()
    assert "--volume" not in args and not any(a.startswith(("KUBECONFIG=", "KUBERNETES_SERVICE_HOST=")) for a in args)
    assert {"--read-only", "--read-only-tmpfs=false", "--cap-drop", "no-new-privileges"} <= set(args)


def test_dead_letter_logs_an_undeliverable_event_as_one_json_line(found_engine, sim):
    import json

    import requests
    from cloudevents.conversion import to_binary
    from cloudevents.http import CloudEvent

    function = _start(found_engine, sim, "vmevents-dead-letter")
    try:
        event = CloudEvent({"type": "io.vmevents.vmi-cleanup.cleaned", "source": "/vmevents/vmi-cleanup",
                            "knativeerrordest": "http://vmi-cleanup.vmevents.svc", "knativeerrorcode": "503"},
                           {"vmi": "default/vm1"})
        headers, body = to_binary(event)
        answer = requests.post(function.url, headers=headers, data=body, timeout=10)
        assert 200 <= answer.status_code < 300, answer.text
        line = function.wait_for_log(lambda text: '"undelivered":true' in text, timeout=10)
    finally:
        function.stop()
    logged = json.loads(line)
    assert logged["event_id"] == event["id"] and logged["status"] == "503" and logged["level"] == "error"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(SERVICES))
def test_each_function_from_the_image_answers_each_request_as_its_bytes_deserve(found_engine, tmp_path, name):
    """tests/shared/test_http_surface.py's requests, sent to the image's gunicorn: a body cut short and bad
    Content-Lengths are 400s, a body over the limit a 413 (unread), a relevant event behind JSON escapes is decoded
    (a 503 with the API server refusing connections), never a 500 or a traceback."""
    import socket

    from shared import wsgi
    from tests.conftest import write_kubeconfig
    from tests.http_cases import send_raw, surface_cases

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{s.getsockname()[1]}")
    package = env_of(SERVICES[name])["FUNCTION_SOURCE"].split("/")[1]
    function = run.ContainerFunction(SERVICES[name], kubeconfig=refused, engine=found_engine, image=IMAGE).start()
    try:
        answers = {raw.name: send_raw(function.port, raw) for raw in surface_cases(package, wsgi.MAX_BODY)}
    finally:
        function.stop()
    for raw in surface_cases(package, wsgi.MAX_BODY):
        status, body = answers[raw.name]
        assert status == raw.status and b"Traceback" not in body, (raw.name, status, body[:300])
    assert not [line for line in function.logs() if re.search(r"\[ERROR\]|Traceback", line)]


# One end-to-end story per function, played with every Knative Service running from the image: the world and
# the test are the function's own (tests/functions/<package>/test_e2e.py), only the servers differ.
# Timers a story sets for an in-process function, lengthened where a container on a loaded machine is slower
# than the story's own pace: io-pause-report's flapping VM is resolved by its volume's rebuild completing (what
# the story checks), not by 4 s without a pause while its ticks run.
SLOWER = {"io-pause-report": {"IO_PAUSE_RESOLVED_AFTER": "10m"}}
STORIES = {
    "vmi-cleanup": ("vmi_cleanup", "test_manual_vm_powered_off_its_vmi_is_deleted_and_the_vm_stays_off"),
    "device-conflict": ("device_conflict",
                        "test_double_assigned_warns_on_both_before_anyone_starts_and_resolves_when_a_spec_changes"),
    # (ticks re-read what a slow container missed; a one-pause story races the guest resuming under load)
    "io-pause-report": ("io_pause_report", "test_a_flapping_vm_gets_one_report_with_a_rising_count_then_one_resolved"),
    "migration-report": ("migration_report", "test_a_completion_timeout_is_explained_with_kubevirts_numbers_once"),
    "alert-forwarder": ("alert_forwarder", "test_a_device_conflict_arrives_with_the_right_labels_and_annotations"),
}


def image_world(found_engine, package: str, backend: str):
    module = importlib.import_module(f"tests.functions.{package}.test_e2e")
    world_class = type(f"Image{module.World.__name__}", (module.World,),
                       {"function_server": staticmethod(run.factory(found_engine, IMAGE, env=SLOWER))})
    extra = (module.alertmanager_binary(),) if package == "alert_forwarder" else ()
    return module, world_class(*extra, "1.3.1", backend)


def assert_clean_logs(world):
    for name, server in world.knative.functions.items():
        bad = [line for line in server.logs() if re.search(r"\[ERROR\]|\[CRITICAL\]|Traceback", line)]
        assert not bad, f"{name} (from the image) printed:\n" + "\n".join(bad)


@pytest.mark.e2e
@pytest.mark.timeout(600)  # seven containers start before the story, each a few seconds on a loaded machine
@pytest.mark.parametrize("function", sorted(STORIES))
def test_each_function_from_the_image_handles_an_event_of_its_kind(found_engine, function):
    package, story = STORIES[function]
    module, world = image_world(found_engine, package, backends.SIM)
    with world:
        assert all(isinstance(s, run.ContainerFunction) for s in world.knative.functions.values())
        getattr(module, story)(world)
        assert_clean_logs(world)
    stopped = {name: (s.exit_code, round(s.stopped_in or 0, 1)) for name, s in world.knative.functions.items()}
    assert all(code == 0 for code, _ in stopped.values()), stopped


@pytest.mark.e2e
@pytest.mark.real
@pytest.mark.timeout(600)
def test_vmi_cleanup_from_the_image_acts_with_its_service_accounts_token_on_the_real_control_plane(found_engine):
    missing = backends.real_missing()
    if missing and not backends.in_ci():
        pytest.skip(f"real control plane: {missing}")
    module, world = image_world(found_engine, "vmi_cleanup", backends.REAL)
    with world:
        server = world.knative.functions["vmi-cleanup"]
        assert any(a.startswith("KUBERNETES_SERVICE_HOST=") for a in server.args), "the in-cluster path"
        assert not any(a.startswith("KUBECONFIG=") for a in server.args)
        module.test_manual_vm_powered_off_its_vmi_is_deleted_and_the_vm_stays_off(world)
        # The deletion was made by the function's own ServiceAccount (the API server's audit log says who).
        deletes = [r for r in world.cluster.requests if r.verb == "delete" and r.service_account == module.FUNCTION_SA]
        assert deletes, "vmi-cleanup's ServiceAccount deleted nothing"
        assert_clean_logs(world)


def test_the_start_up_bench_measures_a_function_next_to_the_no_op(found_engine, sim):
    """bench/image.py's measure() (make bench; the import-cost work reuses it) on one function, one round."""
    from bench import image as bench_image

    wanted = {"vmevents-dead-letter": SERVICES["vmevents-dead-letter"]}
    samples = bench_image.measure(found_engine, IMAGE, wanted, lambda sa: sim.kubeconfig(service_account=sa),
                                  rounds=1, idle=0.2)
    assert set(samples) == {bench_image.NOOP, "vmevents-dead-letter"}
    for rows in samples.values():
        (row,) = rows
        assert 0 < row.startup < 120 and 20 < row.pss <= row.rss < 192  # a Python server, under its memory limit
    table = bench_image.summary(samples)
    assert table[bench_image.NOOP]["rss_ratio"] == 1.0


def test_the_image_has_no_shell_and_no_package_manager(found_engine):
    for program in ("/bin/sh", "/usr/bin/apt-get", "/opt/vmevents/bin/pip"):
        done = found_engine.run("run", "--rm", "--entrypoint", program, IMAGE, "--version", check=False, timeout=120)
        assert done.returncode != 0, f"{program} runs in the image"
    done = found_engine.run("run", "--rm", "--entrypoint", "python", IMAGE, "-c",
                            "import importlib.util as u; print([m for m in ('pip', 'setuptools', 'kubernetes.aio') "
                            "if u.find_spec(m.split('.')[0]) and u.find_spec(m)])", timeout=120)
    assert done.stdout.strip() == "[]"
