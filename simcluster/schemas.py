"""Validation of custom resources against the upstream CRD schemas, as the apiextensions-apiserver does.

A function that writes `runStrategy: 5` or a misspelt field must fail (or lose the field) here as it would
on a real cluster. The schemas are the upstream openAPIV3Schema files under upstream/ (its README.md
says where each came from); they are loaded on first use and cached. A schema the simulator looks for
and cannot find (a missing or unreadable file, a CRD file without the kind) is a SchemaError naming
the file: validating nothing silently would let a wrong object pass.

What the real server does and this module copies:
- structural pruning: unknown fields are dropped silently unless `x-kubernetes-preserve-unknown-fields`
  (apiextensions-apiserver pkg/apiserver/schema/pruning); the server default fieldValidation drops, not rejects;
- OpenAPI v3 → JSON Schema: `nullable`, `x-kubernetes-int-or-string`, int32/int64 ranges;
- the root `metadata` is ObjectMeta, validated by the generic registry, not by the CRD schema.
Not copied: CEL rules (`x-kubernetes-validations`), defaults, list-type uniqueness.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from simcluster import paths
from simcluster.store import ResourceType, invalid

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INT_RANGES = {"int32": (-(2 ** 31), 2 ** 31 - 1), "int64": (-(2 ** 63), 2 ** 63 - 1)}
# The KubeVirt schema shipped with the version a cluster runs: ≤1.3.x → v1.3.1 files, newer → v1.8.3.
_KUBEVIRT_SCHEMA_CUTOFF = (1, 3)


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())
    for name, (low, high) in _INT_RANGES.items():
        checker.checks(name)(functools.partial(_in_range, low=low, high=high))
    return checker


def _in_range(value: Any, low: int, high: int) -> bool:
    return not isinstance(value, int) or isinstance(value, bool) or low <= value <= high


class SchemaError(RuntimeError):
    """An upstream schema the simulator needs is missing, unreadable, or not in the file it should be in."""


def kubevirt_schema_dir(kubevirt_version: str, kubevirt_dir: Path = paths.KUBEVIRT_SCHEMAS) -> Path:
    numbers = tuple(int(p) for p in re.findall(r"\d+", kubevirt_version)[:2])
    release = "v1.3.1" if numbers <= _KUBEVIRT_SCHEMA_CUTOFF else "v1.8.3"
    return kubevirt_dir / release / "crd-schemas"


def to_json_schema(schema: Any) -> Any:
    """Rewrite an OpenAPI v3 (Kubernetes structural) schema into one `jsonschema` checks the same way."""
    if isinstance(schema, list):
        return [to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {k: _convert_keyword(k, v) for k, v in schema.items()
                 if not k.startswith("x-kubernetes-") and k not in ("nullable", "description")}
    if schema.get("x-kubernetes-int-or-string"):
        converted.pop("anyOf", None)
        converted["type"] = ["integer", "string"]
    if schema.get("nullable"):
        if "type" in converted:
            types = converted["type"] if isinstance(converted["type"], list) else [converted["type"]]
            converted["type"] = types + ["null"]
        if "enum" in converted:
            converted["enum"] = list(converted["enum"]) + [None]
    return converted


def _convert_keyword(keyword: str, value: Any) -> Any:
    # `properties` maps field names (which may well be "description") to schemas.
    if keyword == "properties" and isinstance(value, dict):
        return {name: to_json_schema(sub) for name, sub in value.items()}
    return to_json_schema(value)


def prune(value: Any, schema: dict, root: bool = False) -> Any:
    """Drop the fields a structural schema does not declare, in place (pruning.Prune)."""
    if isinstance(value, list):
        for item in value:
            prune(item, schema.get("items") or {})
        return value
    if not isinstance(value, dict):
        return value
    properties = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or isinstance(additional, dict) or \
        additional is True
    # apiVersion/kind/metadata always survive at the root and in embedded resources.
    always = {"apiVersion", "kind", "metadata"} if root or schema.get("x-kubernetes-embedded-resource") else set()
    for key in list(value):
        if key in properties:
            if value[key] is None and not properties[key].get("nullable") and "default" not in properties[key]:
                # A null for a field not marked nullable is dropped before validation (apiextensions-apiserver
                # pkg/apiserver/schema/defaulting/prunenulls.go PruneNonNullableNullsWithoutDefaults).
                del value[key]
            elif not (root and key == "metadata"):
                prune(value[key], properties[key])
        elif isinstance(additional, dict):
            prune(value[key], additional)
        elif key not in always and not keep_unknown:
            del value[key]
    return value


class SchemaRegistry:
    """Finds the schema of each kind for one KubeVirt version. Only the built-in kinds (no CRD) pass
    unchecked; a custom resource whose schema cannot be found is a SchemaError naming the file.

    Parsed schemas and validators are cached per process (they are read-only and thread-safe), so a test
    suite that starts many clusters parses each file once.
    """

    def __init__(self, kubevirt_version: str, upstream_dir: Path = paths.UPSTREAM_DIR):
        self._kubevirt_dir = kubevirt_schema_dir(kubevirt_version, upstream_dir / "kubevirt")
        self._upstream_dir = upstream_dir

    def validate(self, rt: ResourceType, obj: dict) -> dict:
        """Prune then validate; raise a 422 Invalid listing every failing field."""
        compiled = _compiled(*self._source(rt))
        if compiled is None:
            return obj
        raw, validator = compiled
        prune(obj, raw, root=True)
        causes = [_cause(error) for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))]
        if causes:
            raise invalid(rt, obj.get("metadata", {}).get("name", ""), causes)
        return obj

    def _source(self, rt: ResourceType) -> tuple[Path | None, ResourceType]:
        if rt.group in ("kubevirt.io", "migrations.kubevirt.io"):
            return self._kubevirt_dir / f"{rt.kind.lower()}.openAPIV3Schema.yaml", rt
        if rt.group == "longhorn.io":
            return self._upstream_dir / "longhorn" / "v1.10.0" / "crds.yaml", rt
        if rt.group == "devices.harvesterhci.io":
            return self._upstream_dir / "harvester-pcidevices" / "crds.yaml", rt
        if rt.group == "harvesterhci.io":
            return self._upstream_dir / "harvester" / "v1.7.0" / f"{rt.plural}.crd.yaml", rt
        if rt.group == "cdi.kubevirt.io":
            return self._upstream_dir / "cdi" / "v1.64.0" / "datavolume.crd.yaml", rt
        return None, rt


@functools.cache
def _compiled(path: Path | None, rt: ResourceType) -> tuple[dict, jsonschema.Draft4Validator] | None:
    """The schema and its validator; None for a built-in kind (no CRD, no path)."""
    if path is None:
        return None
    raw = _find_schema(path, rt)
    if not isinstance(raw, dict):
        raise SchemaError(f"{path}: no openAPIV3Schema for {rt.kind} ({rt.qualified}, version {rt.version}); "
                          f"the simulator validates every custom resource against its upstream schema")
    converted = to_json_schema(raw)
    converted.setdefault("properties", {})["metadata"] = {"type": "object"}
    return raw, jsonschema.Draft4Validator(converted, format_checker=_format_checker())


def _find_schema(path: Path, rt: ResourceType) -> Any:
    if path.name.endswith(".openAPIV3Schema.yaml"):  # KubeVirt: one file per kind, the CRDsValidation value
        try:
            document = yaml.load(_read(path), Loader=_Loader)
        except yaml.YAMLError as exc:
            raise SchemaError(f"{path}: not a readable YAML schema file ({exc})") from None
        return document.get("openAPIV3Schema") if isinstance(document, dict) else None
    return _crd_schema(path, rt)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{path}: cannot read the upstream schema file ({exc.__class__.__name__}: {exc})") from None


@functools.cache
def _crd_documents(path: Path) -> tuple:
    """The CRDs in a manifest file. Helm charts wrap theirs in `{{ if }} ... {{ else }} ... {{ end }}`
    (keep the first branch, apiextensions.k8s.io/v1) and template some values (dropped)."""
    text = _read(path)
    text = re.split(r"^\{\{-?\s*else\s*-?\}\}.*$", text, maxsplit=1, flags=re.M)[0]
    text = re.sub(r"\{\{.*?\}\}", "", text)  # Longhorn's `labels: {{- include ... }}` too
    try:
        return tuple(d for d in yaml.load_all(text, Loader=_Loader) if isinstance(d, dict))
    except yaml.YAMLError as exc:
        raise SchemaError(f"{path}: not a readable YAML file of CRDs ({exc})") from None


def _crd_schema(path: Path, rt: ResourceType) -> dict | None:
    for crd in _crd_documents(path):
        spec = crd.get("spec") or {}
        if crd.get("kind") != "CustomResourceDefinition" or spec.get("group") != rt.group or \
                (spec.get("names") or {}).get("plural") != rt.plural:
            continue
        for version in spec.get("versions") or []:
            if version.get("name") == rt.version:
                return (version.get("schema") or {}).get("openAPIV3Schema")
    return None


def _field_path(parts) -> str:
    rendered = ""
    for part in parts:
        rendered += f"[{part}]" if isinstance(part, int) else (f".{part}" if rendered else str(part))
    return rendered


def _cause(error: jsonschema.ValidationError) -> dict:
    """One field error in the words of kube-openapi's validate package / field.Error."""
    path = _field_path(error.absolute_path)
    value = json.dumps(error.instance)
    if error.validator == "required":
        missing = [p for p in error.validator_value if p not in (error.instance or {})]
        field = _field_path(list(error.absolute_path) + missing[:1])
        return {"reason": "FieldValueRequired", "message": "Required value", "field": field}
    if error.validator == "type":
        wanted = error.validator_value if isinstance(error.validator_value, str) else \
            "/".join(t for t in error.validator_value if t != "null")
        actual = _json_type(error.instance)
        return {"reason": "FieldValueInvalid", "field": path,
                "message": f'Invalid value: "{actual}": {path} in body must be of type {wanted}: "{actual}"'}
    if error.validator == "enum":
        allowed = ", ".join(json.dumps(v) for v in error.validator_value if v is not None)
        return {"reason": "FieldValueNotSupported", "field": path,
                "message": f"Unsupported value: {value}: supported values: {allowed}"}
    return {"reason": "FieldValueInvalid", "field": path,
            "message": f"Invalid value: {value}: {path} in body {error.message}"}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}.get(type(value), "unknown")
