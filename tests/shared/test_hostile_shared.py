"""Issue 14's classes in shared/, one row each: typed reads that never raise, escaped paths, a bounded log
line, RecursionError as a 400, the bounded duration parser, strict booleans, Retry-After in both forms, and
KUBECONFIG problems as one line naming the file."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import orjson
import pytest

from shared import kubevirt as kv
from shared import objects as o
from shared import runtime
from shared.errors import TemporaryError, http_answer, longest_retry_after, parse_retry_after
from shared.kinds import NAMESPACE, VMI
from shared.kube import Invalid, Kube, Unavailable
from shared.kubeconfig import connect
from shared.settings import MAX_DURATION, DurationTooLong, Env, SettingsError, parse_duration
from simcluster.apiserver import SimCluster
from tests import backends
from tests.conftest import write_kubeconfig

WRONG = [None, 1, True, "text", [1, {"a": 1}], {"k": []}, 1.5]


# -- typed reads --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", WRONG)
def test_kubevirt_readers_treat_a_wrong_type_as_absent(value):
    for obj in ({"metadata": value, "status": value, "spec": value},
                {"metadata": {"annotations": value, "labels": value, "ownerReferences": value, "name": value},
                 "status": {"phase": value, "conditions": value, "phaseTransitionTimestamps": value,
                            "migrationState": value},
                 "spec": {"runStrategy": value, "running": value}}, value):
        kv.meta(obj), kv.annotations_of(obj), kv.labels_of(obj), kv.phase(obj), kv.conditions_of(obj)
        kv.phase_since(obj, "Succeeded"), kv.controller_owner(obj, "VirtualMachine"), kv.migration_in_flight(obj)
        kv.run_strategy(obj), kv.parse_time(value), kv.parse_version(value), kv.api_path(obj)


def test_objects_readers_answer_the_type_asked_for_or_the_default():
    obj = {"a": {"b": "x", "n": 3, "t": True, "l": [1, {"c": 1}], "m": {"k": "v", "bad": 1}}}
    assert o.text(obj, "a", "b") == "x" and o.text(obj, "a", "n") is None and o.string(obj, "a", "l") == ""
    assert o.integer(obj, "a", "n") == 3 and o.integer(obj, "a", "t") is None and o.flag(obj, "a", "t") is True
    assert list(o.objects(obj, "a", "l")) == [{"c": 1}] and o.array(obj, "a", "m") == []
    assert o.strings(obj, "a", "m") == {"k": "v"} and o.mapping(obj, "a", "b", "c") == {}


# -- paths ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,segment", [("../x", "..%2Fx"), ("a?watch=1", "a%3Fwatch%3D1"), ("a/b", "a%2Fb"),
                                          ("..", "%2E%2E"), (".", "%2E"), ("a#b", "a%23b"), ("vm1", "vm1")])
def test_every_path_segment_is_escaped(name, segment):
    assert VMI.path("default", name) == f"/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/{segment}"
    assert VMI.path(name, "x").split("/")[5] == segment
    assert NAMESPACE.path(None, name).endswith(f"/namespaces/{segment}")


@pytest.mark.parametrize("backend", backends.params())
def test_an_escaped_name_stays_a_get_of_nothing(monkeypatch, backend):
    cluster = backends.cluster(backend, "1.3.1")
    try:
        monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig())
        kube = connect()
        for name in ("x?watch=true", "../../../api/v1/namespaces/default", "x/status", "%2e%2e", ".."):
            try:  # a GET of nothing (404) or a refused name (400): never a WATCH (it would hang) nor another object
                assert kube.get(VMI, "default", name) is None
            except Invalid:
                pass
    finally:
        cluster.stop()


# -- the log line and the answer ------------------------------------------------------------------------------------
def deep(depth):
    value = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def test_the_log_line_is_bounded_in_depth_and_size(monkeypatch):
    lines = []
    monkeypatch.setattr(runtime, "_emit", lines.append)
    runtime.write_line({"function": "f", "subject": deep(900), "reason": "x" * 100_000, "n": 2**80,
                        "f": float("nan"), "event_id": {"a": [1, 2, 3]}})
    (line,) = lines
    record = orjson.loads(line)
    assert len(line) < 4 * runtime.MAX_LOGGED_TEXT and record["function"] == "f"
    assert isinstance(record["subject"], str) and record["n"] == str(2**80) and record["f"] == "nan"


def test_a_recursion_error_is_a_400_and_the_line_is_written(monkeypatch):
    lines = []
    monkeypatch.setattr(runtime, "_emit", lines.append)

    def on_event(event, ctx):
        raise RecursionError("maximum recursion depth exceeded")

    app = runtime.FunctionApp("f", on_event, None, None)
    import flask

    with flask.Flask("t").test_request_context("/", method="POST", data=b"{}", headers={
            "ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "t",
            "Content-Type": "application/json"}):
        response = app(flask.request)
    assert response.status_code == 400 and "nested too deeply" in response.get_json()["error"]
    assert orjson.loads(lines[0])["outcome"] == 400


# -- durations and booleans -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["366d", "9999999999d", "999999999999999h", "31536001"])
def test_a_duration_over_the_bound_is_refused(text):
    with pytest.raises(DurationTooLong):
        parse_duration(text)


def test_the_bound_itself_is_a_duration():
    assert parse_duration("365d") == MAX_DURATION


@pytest.mark.parametrize("value,message", [
    ("99999999999999d", "CLEANUP_AFTER='99999999999999d' is longer than 365d; use a value like 90s, 10m or 2h."),
    ("1" * 5000, "CLEANUP_AFTER='11111111111111"),
])
def test_an_env_duration_that_is_too_long_is_one_line_naming_the_variable(value, message):
    with pytest.raises(SettingsError) as caught:
        Env({"CLEANUP_AFTER": value}).duration("CLEANUP_AFTER", "10m")
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value) and len(str(caught.value)) < 200


@pytest.mark.parametrize("value", ["yes", "no", "1", "0", "on", "y", "truee"])
def test_a_boolean_is_exactly_true_or_false(value):
    with pytest.raises(SettingsError, match="is not a boolean; use true or false"):
        Env({"X": value}).boolean("X", False)


@pytest.mark.parametrize("value,default,expected", [("true", False, True), ("FALSE", True, False),
                                                    ("", True, True), ("", False, False), (" True ", False, True)])
def test_booleans_that_are_read(value, default, expected):
    assert Env({"X": value}).boolean("X", default) is expected


# -- Retry-After ----------------------------------------------------------------------------------------------------
def test_retry_after_in_seconds_and_as_an_http_date():
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now.timestamp()) == 30.0
    assert parse_retry_after(format_datetime(now - timedelta(hours=1), usegmt=True), now.timestamp()) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after("99999999") == 3600.0


def test_retry_after_survives_the_client_and_a_rescan_and_reaches_the_answer(monkeypatch):
    with SimCluster() as cluster:
        cluster.faults.add(status=429, retry_after=9, service_account="admin")
        monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig())
        with pytest.raises(Unavailable) as caught:
            connect().get(VMI, "default", "vm1")  # connect(): the functions' client, which never sleeps on it
    assert caught.value.retry_after == 9.0
    combined = TemporaryError("re-scan", retry_after=longest_retry_after([caught.value, TemporaryError("x")]))
    assert http_answer(combined)[1]["Retry-After"] == "9"


# -- KUBECONFIG -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content,cause", [
    (None, "no such file"), ("{not: [yaml", "while parsing"), ("- a list\n- not a map\n", ""),
    ("apiVersion: v1\nkind: Config\n", "current-context"), ("clusters: 3\ncurrent-context: x\n", ""),
])
def test_any_kubeconfig_problem_is_one_line_naming_the_file(monkeypatch, tmp_path, content, cause):
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("KUBECONFIG", str(path))
    with pytest.raises(RuntimeError) as caught:
        connect()
    message = str(caught.value)
    # Short but for the path, which is the test's (longer under pytest-xdist: .../popen-gw5/...), not the message's
    assert "\n" not in message and f"KUBECONFIG={path}" in message and cause in message \
        and len(message.replace(str(path), "")) < 400


def test_a_usable_kubeconfig_connects(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "k", "http://127.0.0.1:1")))
    assert isinstance(connect(), Kube)
