"""Reading configuration from the environment, once, with errors that say what a valid value is.

Each function declares a frozen dataclass of its settings and builds it with these parsers at
start-up; nothing writes to os.environ (functions-framework's `_function_registry.py` does, a
process-wide side effect no caller can see or undo).
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol

_DURATION = re.compile(r"^\s*(\d{1,15})\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
# Every duration the functions read (a delay, a TTL, an annotation's cleanup delay) is meant in minutes to
# days; a year bounds them all and keeps every sum with a timestamp far from datetime's limits (year 9999).
MAX_DURATION = timedelta(days=365)


class SettingsError(ValueError):
    """An environment variable holds a value the function cannot use."""


class DurationTooLong(ValueError):
    """A well-formed duration beyond MAX_DURATION."""


def parse_duration(text: str, maximum: timedelta = MAX_DURATION) -> timedelta:
    """'0s', '90s', '10m', '2h', '1d' (a bare number means seconds), at most `maximum`. Raises ValueError
    (DurationTooLong for a readable value over the maximum)."""
    match = _DURATION.match(text if isinstance(text, str) else "")
    if not match:
        raise ValueError(f"{text!r} is not a duration")
    number, unit = match.groups()
    seconds = int(number) * _UNIT_SECONDS[unit or "s"]
    if seconds > maximum.total_seconds():
        raise DurationTooLong(f"{text!r} is longer than {format_duration(maximum)}")
    return timedelta(seconds=seconds)


def format_duration(delta: timedelta) -> str:
    """The shortest exact spelling of a duration in the units parse_duration reads."""
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _clip(value: str) -> str:
    """A value for a one-line error: quoted (newlines escaped) and short."""
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def in_scope(namespace: str, included: frozenset[str], excluded: frozenset[str]) -> bool:
    """A namespace scope from a `*_NAMESPACES` list (empty = all) and a `*_EXCLUDE_NAMESPACES` list."""
    return namespace not in excluded and (not included or namespace in included)


class Env:
    """Typed reads of one environment mapping, each naming the variable when the value is wrong."""

    def __init__(self, environ: Mapping[str, str]):
        self._environ = environ

    def raw(self, name: str, default: str) -> str:
        return self._environ.get(name, default).strip()

    def duration(self, name: str, default: str) -> timedelta:
        value = self.raw(name, default)
        if value.isdecimal():  # 600: seconds or minutes? A setting says its unit.
            written = f"{value}s" if len(value) <= 9 else "the number with s"
            raise SettingsError(f"{name}={_clip(value)} has no unit; write {written} for seconds (or m, h, d).")
        try:
            return parse_duration(value)
        except DurationTooLong:
            raise SettingsError(f"{name}={_clip(value)} is longer than {format_duration(MAX_DURATION)}; "
                                f"use a value like 90s, 10m or 2h.") from None
        except ValueError:
            raise SettingsError(f"{name}={_clip(value)} is not a duration; use a value like 90s, 10m or 2h.") from None

    def boolean(self, name: str, default: bool) -> bool:
        """Exactly `true` or `false` (any case), what the error message lists; empty means the default."""
        value = self.raw(name, "").lower()
        if value == "":
            return default
        if value in ("true", "false"):
            return value == "true"
        raise SettingsError(f"{name}={_clip(value)} is not a boolean; use true or false.")

    def names(self, name: str) -> frozenset[str]:
        """A comma-separated list of Kubernetes names (empty = none)."""
        value = self.raw(name, "")
        items = frozenset(part.strip() for part in value.split(",") if part.strip())
        bad = sorted(item for item in items if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", item))
        if bad:
            raise SettingsError(f"{name} holds {', '.join(map(repr, bad))}, not namespace names; "
                                f"use a comma-separated list like 'default,vms'.")
        return items

    def namespace(self, name: str, default: str) -> str:
        """One namespace name (e.g. where Longhorn's objects live)."""
        value = self.raw(name, default)
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value):
            raise SettingsError(f"{name}={value!r} is not a namespace name; use a value like {default}.")
        return value

    def object_ref(self, name: str, default: str, *, optional: bool = False) -> tuple[str, str] | None:
        """`namespace/name` of an object (a ConfigMap vmevents keeps); with `optional`, empty means none."""
        value = self.raw(name, default)
        if optional and value == "":
            return None
        namespace, _, rest = value.partition("/")
        label, subdomain = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?"
        if not (re.fullmatch(label, namespace) and re.fullmatch(subdomain, rest) and len(rest) <= 253):
            raise SettingsError(f"{name}={_clip(value)} is not namespace/name; use a value like {default}"
                                + (" (or empty for none)." if optional else "."))
        return namespace, rest

    def number(self, name: str, default: float, *, minimum: float, maximum: float) -> float:
        value = self.raw(name, str(default))
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not minimum <= number <= maximum:
            raise SettingsError(f"{name}={value!r} is not a number from {minimum:g} to {maximum:g}; "
                                f"use a value like {default:g}.")
        return number

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.raw(name, default).lower()
        if value not in choices:
            raise SettingsError(f"{name}={value!r} is not one of {', '.join(choices)}; use a value like {default}.")
        return value


class Declared(Protocol):
    """A declared setting (shared.declaration.Setting): its name, and how it is read."""

    @property
    def name(self) -> str: ...

    def read(self, environ: Mapping[str, str]) -> Any: ...


# Read by functions-framework, gunicorn, Knative Serving or the client, never a function's setting.
_NOT_SETTINGS = ("FUNCTION_", "K_", "KUBERNETES_")


# The settings each function declared, by function, as its load() checked them: what a look-alike is checked against.
DECLARED: dict[str, frozenset[str]] = {}


def checked(function: str, settings: Sequence[Declared], environ: Mapping[str, str]) -> None:
    """Every declared setting read at once: all the wrong ones in one SettingsError (a pod that will not start says
    everything to fix, not the first thing). It reads only the declared names (never the whole environment), and
    remembers them for `lookalikes`."""
    errors = []
    for setting in settings:
        try:
            setting.read(environ)
        except SettingsError as exc:
            errors.append(str(exc))
    DECLARED[function] = frozenset(setting.name for setting in settings)
    if len(errors) == 1:
        raise SettingsError(errors[0])
    if errors:
        raise SettingsError(f"{len(errors)} settings are wrong: " + " ".join(errors))


def lookalikes(function: str, environ: Mapping[str, str]) -> list[str]:
    """A variable that is no setting of the function but looks like one (a declared setting's prefix, e.g.
    CLEANUP_AFTR) is ignored by it: one warning each, with the setting it may have meant. shared.runtime.start
    writes them at start-up, `vmevents check` prints them."""
    names = DECLARED.get(function, frozenset())
    prefixes = tuple({name.split("_", 1)[0] + "_" for name in names if "_" in name})
    found = []
    for name in sorted(environ):
        if name in names or name.startswith(_NOT_SETTINGS) or not prefixes or not name.startswith(prefixes):
            continue
        meant = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.7)
        hint = f" (did you mean {meant[0]}?)" if meant else ""
        found.append(f"{function}: warning: {name} is not a setting of {function}{hint}; it is ignored")
    return found
