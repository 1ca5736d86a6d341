"""The requests the fuzz suite sends: well-formed events about real-looking objects, then the same with
hostile identifiers, values of the wrong JSON type, deep nesting, forged phases, bad envelopes and raw bytes.

A `Case` is one HTTP request (headers and body) plus the family it was drawn from, for the tally.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from simcluster.builders import devices as dev
from simcluster.builders import findings as fb
from simcluster.builders import io_pause, migration, stuck
from simcluster.builders import kubevirt as kvb

RESOURCE = "dev.knative.apiserver.resource."
REF = "dev.knative.apiserver.ref."
PING = "dev.knative.sources.ping"
VERBS = ("add", "update", "delete")


@dataclass(frozen=True)
class Case:
    family: str
    headers: dict[str, str]
    body: bytes

    def __repr__(self) -> str:  # hypothesis prints the falsifying example: keep it readable
        return f"Case({self.family!r}, headers={self.headers!r}, body={self.body[:2000]!r})"


# -- values ---------------------------------------------------------------------------------------------------
HOSTILE_NAMES = ("vm1", "../vm1", "..", ".", "vm1/status", "vm1?watch=true", "vm1?watch=1&x=", "vm1#frag",
                 "vm1,reason=IOErrorPause", "reason=x", "vm1%2Fpods", "%2e%2e", "VM1", "vm_1", "-vm1", "vm1-",
                 "a" * 64, "a" * 254, "vm1 ", " vm1", "vm1\t", "vm1\n", "vm1\x00", "ünïcode", "vm1;rm", "*",
                 "vm1/../../../api/v1/secrets", "kube-system", "", "0", "1.2.3", "a.b-c")
HOSTILE_KINDS = ("VirtualMachineInstance", "VirtualMachine", "Pod", "VirtualMachineInstanceMigration",
                 "virtualmachineinstance", "Secret", "Namespace", "", "VM/../Secret", "Pod?watch=1", "A" * 300)
HOSTILE_API_VERSIONS = ("kubevirt.io/v1", "v1", "", "kubevirt.io", "kubevirt.io/v1/../../v1", "v0", "x/y/z",
                        "kubevirt.io/v1?watch=1", "KubeVirt.io/v1", "v1beta1", "apps/v1")
ascii_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
names = st.sampled_from(HOSTILE_NAMES) | st.text(max_size=80)
scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30) | names)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


_DEEP = "\x00deep:"


def nested_json(depth: int) -> str:
    """JSON of a list/object alternation `depth` levels deep (past Python's recursion limit, and past
    orjson's 1024 levels): written as text, since no JSON encoder goes that deep."""
    opening = "".join('[' if level % 2 else '{"k":' for level in range(depth))
    closing = "".join(']' if level % 2 else '}' for level in reversed(range(depth)))
    return f'{opening}"bottom"{closing}'


def dumps(value: Any) -> str:
    """json.dumps, with each deep-nesting placeholder (see deep_values) expanded to its nested JSON."""
    text = json.dumps(value)
    while _DEEP in text or "\\u0000deep:" in text:
        start = text.index('"\\u0000deep:')
        end = text.index('"', start + 1)
        text = text[:start] + nested_json(int(text[start + 12:end])) + text[end + 1:]
    return text


# A placeholder string, expanded by dumps(): the objects stay cheap to copy and mutate.
deep_values = st.sampled_from((50, 300, 900, 1100, 5000)).map(lambda depth: f"{_DEEP}{depth}")
any_value = json_values | deep_values


# -- the objects each function is about (in the fuzz world none of them needs an action) ----------------------
def objects_for(function: str) -> list[tuple[str, dict]]:
    """(kind, object) pairs the function handles, each saying something that would need action if it were true."""
    if function == "vmi-cleanup":
        vmi = kvb.make_vmi("vm1", phase="Succeeded", owner=kvb.make_vm("vm1", run_strategy="Always"))
        return [("VirtualMachineInstance", vmi), ("Pod", kvb.make_launcher_pod(vmi)),
                ("Pod", kvb.make_launcher_pod(vmi, with_owner=False))]
    if function == "device-conflict":
        device = dev.host_device()
        return [("VirtualMachine", dev.vm("vm1", device)),
                ("VirtualMachineInstance", dev.vmi("vm1", device, phase="Scheduling",
                                                   unschedulable=dev.insufficient()))]
    if function == "migration-report":
        return [("VirtualMachineInstanceMigration", migration.make_vmim("vm1", phase="Failed"))]
    if function == "io-pause-report":
        return [("VirtualMachineInstance", io_pause.make_vmi("vm1", paused="PausedIOError"))]
    if function == "vm-stuck-report":  # claims of a VM stuck for long, and of a migration that never started
        long_stuck = stuck.vm("vm1", status="ErrorUnschedulable", ready_since=stuck.LONG_AGO)
        return [("VirtualMachine", long_stuck), ("VirtualMachine", stuck.vm("vm1", status="Stopping")),
                ("VirtualMachineInstanceMigration", stuck.vmim(stuck.vmi(long_stuck), phase="Pending"))]
    return [("VirtualMachineInstance", kvb.make_vmi("vm1"))]


FINDINGS = (("io.vmevents.device-conflict.detected", fb.device_conflict()),
            ("io.vmevents.migration-report.detected", fb.migration_report()),
            ("io.vmevents.io-pause-report.detected", fb.io_pause()),
            ("io.vmevents.vm-stuck-report.detected", fb.vm_stuck()),
            ("io.vmevents.vmi-cleanup.cleaned", fb.cleaned()))


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


def _set(value: Any, path: tuple, new: Any, delete: bool = False) -> Any:
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    parent = copy
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return copy


@st.composite
def mutated(draw, obj: dict) -> Any:
    """`obj` with one to three fields replaced by a value of any type (or removed)."""
    for _ in range(draw(st.sampled_from((0, 0, 1, 1, 2, 3)))):
        paths = _paths(obj)
        path = draw(st.sampled_from(paths))
        if path and draw(st.integers(0, 5)) == 0:
            obj = _set(obj, path, None, delete=True)
        else:
            hostile = names if path and path[-1] in ("name", "namespace", "uid", "kind", "apiVersion",
                                                     "vmiName", "kubevirt.io/created-by") else any_value
            obj = _set(obj, path, draw(hostile | any_value))
        if not isinstance(obj, dict):
            break
    return obj


# -- envelopes --------------------------------------------------------------------------------------------------
def _encode(attributes: dict[str, Any], data: Any, structured: bool) -> tuple[dict[str, str], bytes]:
    body = data if isinstance(data, bytes) else dumps(data).encode()
    if structured:
        envelope = {**attributes, "data": data if not isinstance(data, bytes) else data.decode("latin-1")}
        return {"Content-Type": "application/cloudevents+json"}, dumps(envelope).encode()
    headers = {"Content-Type": "application/json"}
    for key, value in attributes.items():
        headers[f"ce-{key}"] = value if isinstance(value, str) else dumps(value)
    return headers, body


def _header_safe(headers: dict[str, str]) -> dict[str, str]:
    """HTTP header values are latin-1 without line breaks: what a client can send at all."""
    return {key: "".join(c for c in value if 32 <= ord(c) < 256 and c != "\x7f")
            for key, value in headers.items()}


@st.composite
def apiserver_events(draw, function: str) -> Case:
    """An ApiServerSource event (either mode, either encoding), its object and envelope possibly mutated."""
    kind, obj = draw(st.sampled_from(objects_for(function)))
    reference = draw(st.booleans())
    verb = draw(st.sampled_from(VERBS) | st.sampled_from(VERBS) | st.sampled_from(("patch", "UPDATE", "", "x.update")))
    if reference:
        meta = obj["metadata"]
        data: Any = {"apiVersion": obj.get("apiVersion", "v1"), "kind": kind, "name": meta["name"],
                     "namespace": meta.get("namespace")}
        data = draw(mutated(data))
        type_ = REF + verb
    else:
        data = draw(mutated(obj))
        type_ = RESOURCE + verb
    attributes: dict[str, Any] = {"specversion": "1.0", "id": draw(ascii_text.filter(bool) | st.just("e1")),
                                  "source": "https://10.43.0.1:443", "type": type_}
    if draw(st.booleans()):
        attributes["kind"] = draw(st.sampled_from((kind, *HOSTILE_KINDS)))
    if draw(st.booleans()):
        attributes["subject"] = draw(st.sampled_from((ascii_text, ascii_text, ascii_text, st.just("a" * 2000))).flatmap(
            lambda strategy: strategy))
    structured = draw(st.booleans())
    if structured and draw(st.integers(0, 3)) == 0:  # an attribute of a type CloudEvents does not have
        attributes[draw(st.sampled_from(("kind", "subject", "id", "extra", "time")))] = draw(any_value)
    headers, body = _encode(attributes, data, structured)
    family = f"{'ref' if reference else 'resource'}-{'structured' if structured else 'binary'}"
    return Case(family, _header_safe(headers), body)


@st.composite
def forged_events(draw, function: str) -> Case:
    """A well-formed ApiServerSource event whose object lies (a final phase, a pause, a device) about a VMI or VM
    that exists and needs nothing, or about one that does not exist: the function must re-read and write nothing."""
    kind, obj = draw(st.sampled_from(objects_for(function)))
    obj = json.loads(json.dumps(obj))
    obj["metadata"]["name"] = draw(st.sampled_from(("vm1", "vm2", "ghost", "vm1.example")))
    reference = draw(st.booleans())
    data: Any = ({"apiVersion": obj.get("apiVersion", "v1"), "kind": kind, "name": obj["metadata"]["name"],
                  "namespace": obj["metadata"].get("namespace")} if reference else obj)
    attributes = {"specversion": "1.0", "id": draw(ascii_text.filter(bool)), "source": "https://10.43.0.1:443",
                  "type": (REF if reference else RESOURCE) + draw(st.sampled_from(VERBS)), "kind": kind}
    headers, body = _encode(attributes, data, draw(st.booleans()))
    return Case("forged", _header_safe(headers), body)


@st.composite
def envelopes(draw, function: str) -> Case:
    """A request whose envelope is the problem: missing or odd attributes, unknown types, odd content types,
    bodies that are not JSON, extension headers of any text."""
    type_ = draw(st.sampled_from((RESOURCE + "update", REF + "add", PING, "com.example.other", "",
                                  RESOURCE + "patch", RESOURCE, REF, *(t for t, _ in FINDINGS)))
                 | ascii_text)
    headers = {"ce-specversion": draw(st.sampled_from(("1.0", "0.3", "", "1.0 ")) | ascii_text),
               "ce-type": type_, "ce-source": draw(st.sampled_from(("s", "")) | ascii_text),
               "Content-Type": draw(st.sampled_from(("application/json", "text/plain", "", "application/xml",
                                                     "application/cloudevents+json", "application/foo+json")))}
    if draw(st.booleans()):
        headers["ce-id"] = draw(ascii_text)
    for key, value in draw(st.dictionaries(st.sampled_from(("kind", "subject", "time", "x", "knativeerrordata",
                                                             "knativeerrordest", "knativeerrorcode")),
                                           ascii_text, max_size=3)).items():
        headers[f"ce-{key}"] = value
    body = draw(st.binary(max_size=200) | any_value.map(lambda v: dumps(v).encode()))
    return Case("envelope", _header_safe(headers), body)


@st.composite
def pings(draw, function: str) -> Case:
    headers, body = _encode({"specversion": "1.0", "id": draw(ascii_text.filter(bool)), "source": "ping",
                             "type": PING}, draw(any_value), draw(st.booleans()))
    return Case("ping", _header_safe(headers), body)


@st.composite
def findings(draw, function: str) -> Case:
    """A reply of another function (what alert-forwarder and dead-letter receive), its data mutated."""
    type_, data = draw(st.sampled_from(FINDINGS))
    attributes = {"specversion": "1.0", "id": draw(ascii_text.filter(bool)), "source": "/vmevents/x",
                  "type": draw(st.sampled_from((type_, type_.rsplit(".", 1)[0] + ".other")))}
    if draw(st.booleans()):
        attributes["subject"] = draw(ascii_text)
    if draw(st.booleans()):
        attributes.update(knativeerrordest=draw(ascii_text), knativeerrorcode=draw(ascii_text),
                          knativeerrordata=draw(ascii_text))
    headers, body = _encode(attributes, draw(mutated(data)), draw(st.booleans()))
    return Case("finding", _header_safe(headers), body)


def requests_for(function: str) -> st.SearchStrategy[Case]:
    """Everything a function can be sent, in proportions that favour well-formed-but-hostile events."""
    if function in ("alert-forwarder", "dead-letter"):
        return st.one_of(findings(function), findings(function), envelopes(function), pings(function),
                         apiserver_events(function), forged_events("vmi-cleanup"))
    return st.one_of(apiserver_events(function), apiserver_events(function), apiserver_events(function),
                     forged_events(function), forged_events(function), envelopes(function), pings(function))
