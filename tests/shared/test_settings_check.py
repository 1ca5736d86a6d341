"""A function's settings are checked all at once (shared.settings.checked, called by every function's load): every
wrong setting in one error, a variable that looks like a setting but is none warned about with the one it may have
meant, a bare number for a duration refused with its unit to write."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from catalog import declarations
from shared.settings import Env, SettingsError, lookalikes
from tests.conftest import REPO

LOADERS = [f for f in declarations() if f.settings]


def load(function: str, environ: dict[str, str], warnings: list[str] | None = None):
    module = importlib.import_module(f"functions.{function.replace('-', '_')}.settings")
    return module.load(environ)


def test_every_wrong_setting_is_named_in_one_error():
    with pytest.raises(SettingsError) as caught:
        load("vmi-cleanup", {"CLEANUP_AFTER": "soon", "CLEANUP_DRY_RUN": "maybe", "RESCAN_WORKERS": "99"})
    said = str(caught.value)
    assert said.startswith("3 settings are wrong: ")
    assert "CLEANUP_AFTER='soon'" in said and "CLEANUP_DRY_RUN='maybe'" in said and "RESCAN_WORKERS" in said


def test_a_look_alike_of_a_setting_is_warned_about_with_the_one_meant():
    environ = {"CLEANUP_AFTR": "1h", "CLEANUP_DRY_RUN": "true", "K_SERVICE": "vmi-cleanup", "PATH": "/bin"}
    assert load("vmi-cleanup", environ).dry_run is True  # ignored by the function, as before
    assert lookalikes("vmi-cleanup", environ) == [
        "vmi-cleanup: warning: CLEANUP_AFTR is not a setting of vmi-cleanup (did you mean CLEANUP_AFTER?); it is "
        "ignored"]


@pytest.mark.parametrize("function", LOADERS, ids=[f.name for f in LOADERS])
def test_every_function_checks_its_declared_settings(function):
    defaults = {s.name: s.default for s in function.settings}
    load(function.name, defaults)  # the defaults are fine
    assert lookalikes(function.name, defaults) == []
    first = function.settings[0]
    typo = first.name[:-1] + "X" + first.name[-1:]
    assert f"{typo} is not a setting of {function.name}" in " ".join(lookalikes(function.name, {typo: "1"}))


def test_a_bare_number_is_refused_naming_its_unit():
    with pytest.raises(SettingsError, match=r"CLEANUP_AFTER='600' has no unit; write 600s for seconds"):
        Env({"CLEANUP_AFTER": "600"}).duration("CLEANUP_AFTER", "10m")
    assert Env({"CLEANUP_AFTER": "600s"}).duration("CLEANUP_AFTER", "10m").total_seconds() == 600


def test_a_function_that_cannot_start_names_every_wrong_setting(tmp_path):
    code = ("from functions_framework import create_app\n"
            "create_app(target='handle', source='functions/vmi_cleanup/main.py')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "KUBECONFIG": str(tmp_path / "none"),
           "CLEANUP_AFTER": "600", "CLEANUP_FAILED": "perhaps"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert ("vmi-cleanup: cannot start: 2 settings are wrong: CLEANUP_AFTER='600' has no unit" in done.stderr
            and "CLEANUP_FAILED='perhaps'" in done.stderr), done.stderr


def test_a_function_that_starts_warns_about_a_look_alike_once(tmp_path):
    from tests.conftest import write_kubeconfig

    code = ("from functions_framework import create_app\n"
            "create_app(target='handle', source='functions/vmi_cleanup/main.py')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
           "KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")), "CLEANUP_AFTR": "1h"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("CLEANUP_AFTR is not a setting of vmi-cleanup (did you mean CLEANUP_AFTER?)") == 1
