"""Each function is declared once (functions/<name>/declaration.py, in the words of shared/declaration.py), and
every place that repeats a declaration is generated from it (`make generate`: deploy/base, the chart's and the
Add-on's values, the docs' settings tables, README's table, alert-forwarder's table). These tests fail, naming
the file to fix, when a committed file is not what its declaration makes, when a function's folder is declared
nowhere, or when a declared default is not what its function reads."""
from __future__ import annotations

import ast
import dataclasses
import importlib
import subprocess
import sys

import pytest
import yaml

import catalog
from catalog import declarations, manifests, yamltext
from catalog.__main__ import stale
from catalog.outputs import outputs
from shared.declaration import SEVERITIES, Names
from tests.conftest import REPO

DERIVED = sorted(outputs())


def source_of(path: str) -> str:
    """The declaration a derived file comes from, to name in a failure."""
    for function in declarations():
        if path == f"deploy/base/{manifests.file_name(function)}":
            return f"functions/{function.package}/declaration.py"
    return "the declarations (catalog.FUNCTIONS)"


@pytest.mark.parametrize("path", DERIVED)
def test_each_derived_file_is_what_its_declaration_makes(path):
    wanted = outputs()[path]
    have = (REPO / path).read_text() if (REPO / path).is_file() else None
    assert have == wanted, (f"{path} is not what {source_of(path)} makes: run `make generate` (and edit the "
                            f"declaration, never the generated file)")


def test_a_changed_declaration_makes_its_files_stale(monkeypatch):
    """The check bites: a default changed in a declaration, and its manifest is no longer what it must be."""
    vmi_cleanup = catalog.declared("vmi-cleanup")
    other = "2h" if vmi_cleanup.setting("CLEANUP_AFTER").default != "2h" else "3h"
    settings = tuple(dataclasses.replace(s, default=other) if s.name == "CLEANUP_AFTER" else s
                     for s in vmi_cleanup.settings)
    changed = tuple(dataclasses.replace(f, settings=settings) if f is vmi_cleanup else f for f in declarations())
    monkeypatch.setattr(catalog.outputs, "declarations", lambda: changed)
    assert "deploy/base/vmi-cleanup.yaml" in stale()


def test_make_generate_writes_nothing_when_all_is_current():
    done = subprocess.run([sys.executable, "-m", "catalog", "--check"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


# -- the registry ---------------------------------------------------------------------------------------------
def test_every_function_folder_is_declared_and_listed_once():
    folders = sorted(p.parent.name for p in (REPO / "functions").glob("*/__init__.py"))
    undeclared = [f for f in folders if not (REPO / "functions" / f / "declaration.py").is_file()]
    assert not undeclared, f"functions/{undeclared[0]}/ has no declaration.py (docs/ARCHITECTURE.md, Adding a function)"
    assert len(set(catalog.FUNCTIONS)) == len(catalog.FUNCTIONS), "catalog.FUNCTIONS lists a function twice"
    unlisted = sorted(set(catalog.discovered()) - set(catalog.FUNCTIONS))
    assert not unlisted, f"add {unlisted} to FUNCTIONS in catalog/__init__.py (one line each)"
    assert set(catalog.FUNCTIONS) <= set(catalog.discovered()), "catalog.FUNCTIONS lists a folder without a declaration"


@pytest.mark.parametrize("package", catalog.FUNCTIONS)
def test_a_declaration_is_written_in_the_vocabulary_only(package):
    """A declaration is data: it imports shared/declaration.py (and dataclasses' replace), nothing that runs."""
    path = REPO / "functions" / package / "declaration.py"
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
    assert imported <= {"shared.declaration", "dataclasses", "__future__"}, \
        f"functions/{package}/declaration.py imports {sorted(imported)}; it may import shared.declaration only"


# -- what a declaration says is what the function does ------------------------------------------------------------
def settings_module(package: str):
    try:
        return importlib.import_module(f"functions.{package}.settings")
    except ModuleNotFoundError:
        return None


@pytest.mark.parametrize("function", declarations(), ids=lambda f: f.name)
def test_the_declared_defaults_are_what_the_function_reads_when_nothing_is_set(function):
    """Every default reads with its own parser, and the function's settings from an empty environment are its
    settings from the declared defaults (what the manifest writes)."""
    for setting in function.settings:
        setting.value  # noqa: B018 - a default its parser refuses raises here
    module = settings_module(function.package)
    if module is None:
        assert not function.settings, f"{function.name} declares settings but has no settings.py"
        return
    written = {s.name: s.default for s in function.settings}
    assert module.load({}) == module.load(written), (
        f"{function.name}: an unset variable and its declared default read differently; make "
        f"functions/{function.package}/settings.py read the default from declaration.py")


def literal_defaults(source: str, names: set[str]) -> list[str]:
    """Calls that pass a declared setting's name with a literal default (`env.duration("CLEANUP_AFTER", "10m")`):
    a second place for the default."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in names and isinstance(node.args[1], ast.Constant):
            found.append(f"line {node.lineno}: {node.args[0].value} with the default {node.args[1].value!r}")
    return found


@pytest.mark.parametrize("function", declarations(), ids=lambda f: f.name)
def test_settings_py_writes_no_default_of_its_own(function):
    names = {s.name for s in function.settings}
    for path in (REPO / "functions" / function.package / "settings.py", REPO / "shared" / "rescan.py"):
        if path.is_file():
            found = literal_defaults(path.read_text(), names)
            assert not found, (f"{path.relative_to(REPO)} repeats declared defaults ({'; '.join(found)}): read them "
                               f"from functions/{function.package}/declaration.py (Setting.read)")


def test_the_literal_default_check_bites():
    assert literal_defaults('env.duration("CLEANUP_AFTER", "10m")\n_urls(env, "WEBHOOK_URL")\n',
                            {"CLEANUP_AFTER", "WEBHOOK_URL"}) == ["line 1: CLEANUP_AFTER with the default '10m'"]


@pytest.mark.parametrize("function", declarations(), ids=lambda f: f.name)
def test_grants_and_alerts_name_what_is_declared(function):
    names = {s.name for s in function.settings}
    for grant in function.grants:
        if grant.scoped_by:
            assert grant.scoped_by in names and isinstance(function.setting(grant.scoped_by).parse, Names), \
                f"{function.name}: a grant scoped by {grant.scoped_by}, which is no namespaces setting of it"
            assert not grant.namespaced, "a Role in vmevents is never scoped by a setting"
    for alert in function.alerts:
        assert alert.severity in SEVERITIES, f"{alert.name}: severity {alert.severity}"


def test_a_category_becomes_one_alert():
    seen: dict[str, str] = {}
    for function in declarations():
        for category in function.categories:
            assert category not in seen, f"{category} is declared by {seen[category]} and {function.name}"
            seen[category] = function.name


# -- the writing of YAML -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("function", declarations(), ids=lambda f: f.name)
def test_a_manifest_reads_back_as_the_objects_it_was_written_from(function):
    docs = manifests.manifest_documents(function)
    assert list(yaml.safe_load_all(manifests.manifest(function))) == [yamltext.plain(obj) for _, obj in docs]


@pytest.mark.parametrize("text", ["", "0", "8", "0.8", "1e3", "false", "yes", "no", "on", "null", "~", "10m", "a: b",
                                  "a #b", "#x", "- x", "[x]", "{x}", "x:", " x", "@x", "*x", "&x", "!x", "%x", "|",
                                  ">", "'x'", '"x"', "https://a.example/b?c=d#e", "0x10", "2026-01-01",
                                  "Migrating=30m"])
def test_a_string_is_written_so_that_yaml_reads_the_same_string(text):
    written = yamltext.document({"key": text, "list": [text], "flow": yamltext.Flow((text,))})
    assert yaml.safe_load(written) == {"key": text, "list": [text], "flow": [text]}, written


def test_comments_are_wrapped_and_kept_out_of_the_values():
    written = yamltext.document({"a": yamltext.Note("v", above="word " * 60, after="why")}, head="head")
    lines = written.splitlines()
    assert all(len(line) <= yamltext.WIDTH for line in lines)
    assert lines[0] == "# head" and lines[-1] == "a: v  # why"
    assert yaml.safe_load(written) == {"a": "v"}


# -- the hand-written parts of deploy/ that a declaration reaches into --------------------------------------------
def test_every_kind_a_trigger_takes_is_watched_by_a_source():
    sources = REPO / "deploy" / "base" / "sources.yaml"
    watched = {r["kind"] for doc in yaml.safe_load_all(sources.read_text()) if doc and doc["kind"] == "ApiServerSource"
               for r in doc["spec"]["resources"]}
    for function in declarations():
        for on in function.trigger.on if function.trigger else ():
            missing = set(on.kinds) - watched
            assert not missing, (f"{function.name} takes {sorted(missing)} changes, which no ApiServerSource sends: "
                                 f"add one to {sources.relative_to(REPO)} (and its ClusterRole's get/list/watch)")


def test_every_function_that_creates_its_own_configmap_is_held_to_it_by_the_policy():
    policy = REPO / "deploy" / "components" / "own-configmaps" / "policy.yaml"
    text = policy.read_text()
    for function in declarations():
        for grant in function.grants:
            creates = any(r.resources == ("configmaps",) and "create" in r.verbs for r in grant.rules)
            own = [n for r in grant.rules if r.resources == ("configmaps",) for n in r.names]
            if creates:
                user = f"system:serviceaccount:vmevents:{function.account}"
                assert user in text and all(n in text for n in own), (
                    f"{function.name} may create ConfigMaps in vmevents ({manifests.role_name(function, grant)}): "
                    f"{policy.relative_to(REPO)} must let it create only its own ({own})")


# -- what the docs say of a declaration ----------------------------------------------------------------------------
@pytest.mark.parametrize("function", [f for f in declarations() if f.alerts], ids=lambda f: f.name)
def test_every_declared_alert_has_its_runbook(function):
    """An alert's runbook_url points at README's heading of its name; the tables of categories in
    docs/alert-forwarder.md and docs/findings.md are generated (above)."""
    for alert in function.alerts:
        assert f"\n### {alert.name}\n" in (REPO / "README.md").read_text(), \
            f"README.md has no runbook `### {alert.name}` (its runbook_url's anchor #{alert.runbook})"
    assert function.identity is not None, f"functions/{function.package}/declaration.py: a producer declares the " \
                                          f"identity of its findings (docs/findings.md, Per producer)"


@pytest.mark.parametrize("function", declarations(), ids=lambda f: f.name)
def test_the_docs_page_names_every_event_reason_and_reply_type(function):
    page = (REPO / "docs" / f"{function.name}.md").read_text()
    code = "\n".join(p.read_text() for p in (REPO / "functions" / function.package).glob("*.py")
                     if p.name != "declaration.py")
    for reason in function.reasons:
        assert f"`{reason}`" in page, f"docs/{function.name}.md does not document its Event reason {reason}"
        assert f'"{reason}"' in code, f"functions/{function.package}/ records no Event {reason}: remove it from " \
                                      f"declaration.py"
    for what in function.replies:
        assert f"io.vmevents.{function.name}.{what}" in page, \
            f"docs/{function.name}.md does not document its reply io.vmevents.{function.name}.{what}"


def test_the_chart_reads_its_scoped_bindings_from_the_generated_helper():
    """The chart binds a grant scoped by a setting with one RoleBinding per namespace the value lists: the grants it
    knows are _scoped.tpl's (generated, checked above), read by templates/objects.yaml."""
    template = (REPO / "deploy" / "chart" / "vmevents" / "templates" / "objects.yaml").read_text()
    assert 'include "vmevents.scoped"' in template and "vmevents-vmi-cleanup-act" not in template
    scoped = yaml.safe_load(outputs()["deploy/chart/vmevents/templates/_scoped.tpl"].split("-}}\n", 2)[2]
                            .rsplit("{{-", 1)[0])
    assert scoped == {manifests.role_name(f, g): [f.service_name, g.scoped_by] for f in declarations()
                      for g in f.grants if g.scoped_by}
    assert "vmevents-vmi-cleanup-act" in scoped and "vmevents-migration-report-act" in scoped


# -- the benchmarks' lists ----------------------------------------------------------------------------------------
def test_every_function_that_takes_events_has_an_irrelevant_event_in_the_benchmarks():
    from bench.events import IRRELEVANT

    missing = [f.name for f in declarations() if f.trigger and f.name not in IRRELEVANT]
    assert not missing, f"bench/events.py IRRELEVANT has no case for {missing} (its most common irrelevant event)"


def test_every_function_that_reads_the_api_on_a_tick_has_its_api_cost_measured():
    from bench.api_cost import FUNCTIONS

    measured = {f.name for f in FUNCTIONS}
    missing = [f.name for f in declarations() if f.trigger and f.trigger.on and f.trigger.tick
               and f.name not in measured]
    assert not missing, f"bench/api_cost.py FUNCTIONS has no row for {missing} (its re-scan at 10,000 VMs)"
    assert all(f.package == catalog.declared(f.name).package for f in FUNCTIONS)


def test_the_categories_a_producers_code_makes_are_the_declared_ones():
    """A category the code makes but the declaration lacks would reach Alertmanager under a made-up name."""
    from functions.device_conflict.decide import Category as DeviceCategory
    from functions.io_pause_report.decide import Category as PauseCategory
    from functions.vm_stuck_report.settings import GROUPS

    made = {"device-conflict": {c.value for c in DeviceCategory}, "io-pause-report": {c.value for c in PauseCategory},
            "vm-stuck-report": {f"stuck-{group}" for group in set(GROUPS.values())},
            "vmi-cleanup": {"vmi-cleaned-up"}}
    for name, categories in made.items():
        assert categories == set(catalog.declared(name).categories), \
            f"functions/{catalog.declared(name).package}/declaration.py: its alerts' categories must be {categories}"
    source = "".join((REPO / f).read_text() for f in ("functions/migration_report/decide.py",
                                                      "functions/migration_report/analysis.py", "shared/migrations.py"))
    for category in catalog.declared("migration-report").categories:
        assert f'"{category}"' in source, f"migration-report never makes the declared category {category}"


def test_every_scoped_grant_has_its_rbac_test_and_example_overlay():
    """A grant scoped by a setting is checked in every kustomization (tests/deploy/test_scoped_rbac.py, which lists
    what it may write only where the setting lets it) and shown by an example overlay."""
    from tests.deploy.test_scoped_rbac import SCOPED

    for function in declarations():
        for grant in function.grants:
            if grant.scoped_by:
                assert SCOPED.get(function.name, ("",))[0] == grant.scoped_by, (
                    f"tests/deploy/test_scoped_rbac.py SCOPED has no row for {function.name} ({grant.scoped_by})")
                overlays = [p for p in (REPO / "deploy" / "overlays").glob("scoped-*/kustomization.yaml")
                            if manifests.role_name(function, grant) in p.read_text()]
                assert overlays, f"no deploy/overlays/scoped-*/ shows {manifests.role_name(function, grant)} bound " \
                                 f"by RoleBindings"


@pytest.mark.parametrize("function", [f for f in declarations() if f.alerts], ids=lambda f: f.name)
def test_the_docs_page_explains_every_category(function):
    page = (REPO / "docs" / f"{function.name}.md").read_text()
    missing = [c for c in function.categories if f"`{c}`" not in page]
    assert not missing, f"docs/{function.name}.md does not explain its categories {missing}"


def test_vm_stuck_reports_docs_name_every_cause():
    """Adding a cause to vm-stuck-report is its rule in causes.py, its words, and its row in the docs' table of
    causes: this names the page when the row is missing."""
    from functions.vm_stuck_report.causes import Cause

    page = (REPO / "docs" / "vm-stuck-report.md").read_text()
    missing = [c.value for c in Cause if f"| `{c.value}` |" not in page]
    assert not missing, f"docs/vm-stuck-report.md's table of causes has no row for {missing}"
