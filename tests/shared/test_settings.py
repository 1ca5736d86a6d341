"""Settings are read once from the environment; a bad value names the variable and a valid one."""
from datetime import timedelta

import pytest

from functions.vmi_cleanup.declaration import CLEANUP_AFTER
from functions.vmi_cleanup.settings import Settings, load
from shared.settings import SettingsError, format_duration, parse_duration


@pytest.mark.parametrize("text,seconds", [("0s", 0), ("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400),
                                          ("45", 45), (" 5m ", 300)])
def test_durations(text, seconds):
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (90, "90s"), (600, "10m"), (7200, "2h"), (86400, "1d")])
def test_format_duration_round_trips(seconds, text):
    assert format_duration(timedelta(seconds=seconds)) == text
    assert parse_duration(text) == timedelta(seconds=seconds)


def test_defaults():
    """The delay is the declared one (functions/vmi_cleanup/declaration.py); Failed VMIs are never cleaned up and a
    run is never a dry run unless asked."""
    s = load({})
    assert s == Settings(cleanup_after=CLEANUP_AFTER.value, cleanup_failed=False, dry_run=False)


def test_all_variables():
    s = load({"CLEANUP_AFTER": "90s", "CLEANUP_FAILED": "true", "CLEANUP_DRY_RUN": "TRUE",
                           "CLEANUP_NAMESPACES": "default, vms", "CLEANUP_EXCLUDE_NAMESPACES": "kube-system"})
    assert s.cleanup_after == timedelta(seconds=90) and s.cleanup_failed and s.dry_run
    assert s.namespaces == {"default", "vms"} and s.exclude_namespaces == {"kube-system"}
    assert s.in_scope("vms") and not s.in_scope("kube-system") and not s.in_scope("other")


@pytest.mark.parametrize("env,message", [
    ({"CLEANUP_AFTER": "5 minutes"}, "CLEANUP_AFTER='5 minutes' is not a duration; use a value like 90s, 10m or 2h."),
    ({"CLEANUP_DRY_RUN": "maybe"}, "CLEANUP_DRY_RUN='maybe' is not a boolean; use true or false."),
    ({"CLEANUP_NAMESPACES": "Default"}, "CLEANUP_NAMESPACES holds 'Default', not namespace names"),
])
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(SettingsError) as caught:
        load(env)
    assert message in str(caught.value)


def test_settings_are_frozen():
    with pytest.raises(AttributeError):
        Settings().dry_run = True  # type: ignore[misc]
