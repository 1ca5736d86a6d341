"""The layout's rules (docs/ARCHITECTURE.md), file by file: which package may import which, what a
function's decide.py may touch, which files a function has, how long a product module may grow, and
the words no file in the repository uses."""
from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

# -- reading a module -----------------------------------------------------------------------------
FIRST_PARTY = ("shared", "functions", "localknative", "simcluster", "controlplane", "bench", "tests", "image",
               "catalog", "cli")


@dataclass(frozen=True)
class Import:
    module: str  # absolute, dotted: `from shared import kube` is shared.kube
    line: int

    def within(self, *roots: str) -> bool:
        """The module is one of `roots` or inside one of them."""
        return any(self.module == root or self.module.startswith(root + ".") for root in roots)

    @property
    def root(self) -> str:
        return self.module.split(".")[0]


def module_name(path: Path) -> str:
    """The dotted name a repository file is imported as: functions/vmi_cleanup/decide.py is
    functions.vmi_cleanup.decide."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, module: str, *, is_package: bool = False) -> list[Import]:
    """Every import in `source` (the code of `module`), relative ones resolved, wherever it is written
    (in a function, under `if TYPE_CHECKING:`): what a module may use is what it may import at all."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[:len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append(Import(base, node.lineno))
            found += [Import(f"{base}.{alias.name}", node.lineno) for alias in node.names if alias.name != "*"]
    return found


def imports_of(path: Path) -> list[Import]:
    return imports_in(path.read_text(), module_name(path), is_package=path.name == "__init__.py")


def python_files(*folders: str) -> list[Path]:
    """The Python files under these repository folders (a folder that does not exist has none)."""
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in paths]


def tracked_files() -> list[str]:
    """The repository's tracked files (when it is not a git checkout: every file outside the build and
    cache folders)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".run", ".pytest_cache", ".venv", "build", "__pycache__"}
        return sorted(str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()
                      and not skip & set(p.relative_to(REPO).parts) and not p.name.endswith(".egg-info"))
    return sorted(name for name in listed.decode().split("\0") if name)


TRACKED = tracked_files()


# -- one-way imports among the packages ------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """What a package's modules may import from the repository's own packages."""

    why: str
    allowed: tuple[str, ...] = ()    # only these (and the standard library, third-party packages) ...
    forbidden: tuple[str, ...] = ()  # ... or anything but these

    def breaks(self, imported: Import, own: str) -> bool:
        if imported.root not in FIRST_PARTY or imported.within(own) or own.startswith(imported.module + "."):
            return False  # not ours, the file's own code, or a package above it (`from functions import x`)
        if self.allowed:
            return not imported.within(*self.allowed)
        return imported.within(*self.forbidden)


RULES = {
    "shared": Rule("shared/ is the library every function leans on: it imports nothing of the repository",
                   allowed=("shared",)),
    "functions": Rule("a function imports shared/ and its own modules only: never another function, "
                      "the local Knative, the simulator, the control plane, the benchmarks or the tests",
                      allowed=("shared",)),
    "catalog": Rule("catalog/ derives files from the functions' declarations: it imports shared/ only (it loads each "
                    "functions/<name>/declaration.py by its name in catalog.FUNCTIONS)", allowed=("shared",)),
    "localknative": Rule("localknative/ stands in for Knative: it imports shared/ only", allowed=("shared",)),
    "cli": Rule("cli/ is the operator's command, installed with the package: it imports shared/ and the functions",
                allowed=("shared", "functions")),
    "simcluster": Rule("the simulated cluster never imports the tests, the benchmarks or the control plane "
                       "(they import it)", forbidden=("tests", "bench", "controlplane")),
    "controlplane": Rule("the control plane never imports the tests or the benchmarks",
                         forbidden=("tests", "bench")),
    "bench": Rule("the benchmarks never import the tests", forbidden=("tests",)),
    "image": Rule("image/ builds the image and runs a Knative Service's container as localknative runs its process: "
                  "it imports localknative only", allowed=("localknative",)),
    "upstream": Rule("upstream/extract.py re-extracts vendored data: it imports nothing of the repository",
                     allowed=()),
    "tests": Rule("tests may import everything"),
}


def own_scope(relative: Path) -> str:
    """What counts as the file's own code: its top-level package; for a function, its own folder."""
    parts = relative.parts
    if parts[0] == "functions":  # functions/__init__.py has no own code to import
        return f"functions.{parts[1]}" if len(parts) > 2 else ""
    return parts[0]


def import_violations(path: Path, source: str | None = None) -> list[str]:
    """The imports of the file at `path` (or of `source`, as if it were that file) its package's rule forbids."""
    relative = path.relative_to(REPO)
    rule, own = RULES[relative.parts[0]], own_scope(relative)
    found = imports_in(path.read_text() if source is None else source, module_name(path),
                       is_package=path.name == "__init__.py")
    return [f"line {i.line}: imports {i.module}" for i in found if rule.breaks(i, own)]


RULED = python_files(*RULES)


@pytest.mark.parametrize("path", RULED, ids=ids(RULED))
def test_imports_go_one_way(path):
    violations = import_violations(path)
    assert not violations, (f"{path.relative_to(REPO)}: {'; '.join(violations)}. "
                            f"Rule: {RULES[path.relative_to(REPO).parts[0]].why} (docs/ARCHITECTURE.md).")


@pytest.mark.parametrize("where,source,allowed", [
    ("shared/example.py", "from functions.vmi_cleanup import decide\n", False),
    ("shared/example.py", "import tests.conftest\n", False),
    ("shared/example.py", "from simcluster.store import Store\n", False),
    ("shared/example.py", "from localknative import broker\n", False),
    ("shared/example.py", "from shared import kubevirt\nimport yaml\nimport os\n", True),
    ("functions/vmi_cleanup/example.py", "from functions.device_conflict.decide import decide\n", False),
    ("functions/vmi_cleanup/example.py", "from ..device_conflict import decide\n", False),
    ("functions/vmi_cleanup/example.py", "from functions import device_conflict\n", False),
    ("functions/vmi_cleanup/example.py", "from functions import vmi_cleanup\n", True),
    ("functions/vmi_cleanup/example.py", "def f():\n    from simcluster.builders.kubevirt import make_vm\n", False),
    ("functions/vmi_cleanup/example.py", "from bench.load import run\n", False),
    ("functions/vmi_cleanup/example.py", "import localknative.broker\n", False),
    ("functions/vmi_cleanup/example.py", "import controlplane\n", False),
    ("functions/vmi_cleanup/example.py", "from . import decide\nfrom functions.vmi_cleanup import wording\n"
                                         "from shared.kube import VMI\n", True),
    ("catalog/example.py", "from functions.vmi_cleanup import settings\n", False),
    ("catalog/example.py", "from shared.declaration import Function\nfrom catalog import yamltext\n", True),
    ("functions/vmi_cleanup/example.py", "import catalog\n", False),
    ("localknative/example.py", "from simcluster.apiserver import SimCluster\n", False),
    ("localknative/example.py", "from shared import intake\nfrom localknative.paths import REPO\n", True),
    ("simcluster/example.py", "from tests.e2e import eventually\n", False),
    ("simcluster/example.py", "import bench.load\n", False),
    ("simcluster/example.py", "from localknative import broker\nfrom shared import kube\n", True),
    ("controlplane/example.py", "from bench import load\n", False),
    ("controlplane/example.py", "from tests import conftest\n", False),
    ("controlplane/example.py", "from simcluster import store\nfrom localknative import broker\n", True),
    ("bench/example.py", "from tests.http_cases import post\n", False),
    ("bench/example.py", "from simcluster.apiserver import SimCluster\nfrom functions.vmi_cleanup import handler\n",
     True),
])
def test_the_import_rules_bite(where, source, allowed):
    """Each rule, fed a module it must refuse (or accept), as if the module were at `where`."""
    assert (not import_violations(REPO / where, source)) is allowed


def test_every_python_package_has_an_import_rule():
    """controlplane/ may hold no Python yet; any top-level folder that does must have a rule above."""
    tops = {Path(name).parts[0] for name in TRACKED if name.endswith(".py") and "/" in name}
    assert tops <= set(RULES), f"no import rule for {sorted(tops - set(RULES))}: add one to RULES"


STORIES = python_files("simcluster/stories")


@pytest.mark.parametrize("path", STORIES, ids=ids(STORIES))
def test_stories_take_their_builders_from_simcluster_builders(path):
    wrong = [f"line {i.line}: {i.module}" for i in imports_of(path)
             if "builders" in i.module.split(".") and not i.within("simcluster.builders")]
    assert not wrong, f"{path.relative_to(REPO)} imports builders from elsewhere than simcluster.builders: {wrong}"


FUNCTION_FILES = python_files("functions")


@pytest.mark.parametrize("path", FUNCTION_FILES, ids=ids(FUNCTION_FILES))
def test_functions_never_import_the_kubernetes_client(path):
    found = [f"line {i.line}: {i.module}" for i in imports_of(path) if i.within("kubernetes")]
    assert not found, f"{path.relative_to(REPO)} imports the kubernetes client ({found}); use shared.kube"


# -- decide.py is pure -----------------------------------------------------------------------------
IMPURE_IMPORTS = ("kubernetes", "shared.kube", "shared.recorder", "shared.runtime", "requests", "urllib3", "flask",
                  "functions_framework", "os", "time", "socket", "http")
CLOCK_READS = {"now", "utcnow", "today"}  # datetime.now(), datetime.utcnow(), date.today()


def impurities(source: str, module: str) -> list[str]:
    """Why `source` (the code of `module`) is not pure: an import with side effects or a read of the clock."""
    found = [f"line {i.line}: imports {i.module}" for i in imports_in(source, module) if i.within(*IMPURE_IMPORTS)]
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner, method = _dotted(node.func.value), node.func.attr
        if method in CLOCK_READS and owner.split(".")[-1] in ("datetime", "date"):
            found.append(f"line {node.lineno}: reads the clock ({owner}.{method}())")
        elif (owner, method) == ("time", "time"):
            found.append(f"line {node.lineno}: reads the clock (time.time())")
    return found


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def declares_pure(path: Path) -> bool:
    """A module-level `PURE = True`: the module asks to be held to decide.py's rules."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is True \
                and any(isinstance(t, ast.Name) and t.id == "PURE" for t in node.targets):
            return True
    return False


def pure_modules() -> Iterator[Path]:
    """Each function's decide.py, the modules of its own folder it imports (but wording.py, which may
    import decide.py, not the other way round), and any module that declares `PURE = True`."""
    seen: set[Path] = set()
    for decide in sorted((REPO / "functions").glob("*/decide.py")):
        folder, todo = decide.parent, [decide]
        while todo:
            path = todo.pop()
            if path in seen:
                continue
            seen.add(path)
            for i in imports_of(path):
                local = folder / (i.module.split(".")[-1] + ".py")
                if i.within(module_name(folder)) and local.name != "wording.py" and local.is_file():
                    todo.append(local)
    seen |= {p for p in FUNCTION_FILES if declares_pure(p)}
    yield from sorted(seen)


PURE = list(pure_modules())


@pytest.mark.parametrize("path", PURE, ids=ids(PURE))
def test_decide_is_pure(path):
    found = impurities(path.read_text(), module_name(path))
    assert not found, (f"{path.relative_to(REPO)} must be pure (no API client, runtime, recorder, HTTP library, "
                       f"environment or clock: pass them in): {'; '.join(found)}")


def test_the_purity_rule_follows_decide_into_its_own_modules_but_not_wording():
    folder = REPO / "functions" / "vmi_cleanup"
    assert {folder / "decide.py", folder / "settings.py"} <= set(PURE)
    assert folder / "wording.py" not in PURE and folder / "handler.py" not in PURE


@pytest.mark.parametrize("source,fragment", [
    ("import os\n", "imports os"),
    ("from os import environ\n", "imports os"),
    ("import time\n", "imports time"),
    ("from shared.kube import VMI\n", "imports shared.kube"),
    ("from shared import kube\n", "imports shared.kube"),
    ("from shared import recorder, runtime\n", "imports shared.recorder"),
    ("import kubernetes.client\n", "imports kubernetes.client"),
    ("import requests\n", "imports requests"),
    ("from http.client import HTTPConnection\n", "imports http.client"),
    ("from flask import Flask\n", "imports flask"),
    ("import functions_framework\n", "imports functions_framework"),
    ("def f():\n    import socket\n", "imports socket"),
    ("from datetime import datetime\nNOW = datetime.now()\n", "datetime.now()"),
    ("import datetime\nNOW = datetime.datetime.utcnow()\n", "datetime.datetime.utcnow()"),
    ("from datetime import date\nTODAY = date.today()\n", "date.today()"),
    ("import time\nT = time.time()\n", "time.time()"),
])
def test_the_purity_check_bites(source, fragment):
    found = impurities(source, "functions.example.decide")
    assert any(fragment in f for f in found), found


def test_the_purity_check_passes_a_pure_module():
    source = ("from datetime import datetime, timedelta\nfrom shared import kubevirt as kv\n"
              "from shared.settings import parse_duration\n"
              "def due(vmi, now: datetime) -> bool:\n    return now > kv.phase_since(vmi, 'x') + timedelta(1)\n")
    assert impurities(source, "functions.example.decide") == []


def test_a_module_can_ask_to_be_held_pure(tmp_path):
    module = tmp_path / "arithmetic.py"
    module.write_text('"""Sums."""\nPURE = True\n')
    assert declares_pure(module)
    module.write_text('"""Sums."""\nPURE = False\n')
    assert not declares_pure(module)


# -- one file skeleton for every function that makes decisions --------------------------------------
SKELETON = ("settings.py", "decide.py", "handler.py", "wording.py", "main.py")
NO_DECISIONS = {"dead_letter": "logs what the broker could not deliver: nothing to decide"}
FUNCTIONS = sorted(p.parent.name for p in (REPO / "functions").glob("*/__init__.py"))


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_function_has_the_skeleton(name):
    folder = REPO / "functions" / name
    wanted = ("main.py",) if name in NO_DECISIONS else SKELETON
    missing = [f for f in wanted if not (folder / f).is_file()]
    assert not missing, (f"functions/{name}/ lacks {', '.join(missing)}: a function that makes decisions has "
                         f"{', '.join(SKELETON)} (docs/ARCHITECTURE.md 'One function's files')")


def test_only_the_exempt_have_no_decisions():
    for name in NO_DECISIONS:
        assert name in FUNCTIONS, f"NO_DECISIONS names {name}, which is not a function any more"
        assert not (REPO / "functions" / name / "decide.py").exists(), f"{name} decides now: give it the skeleton"


# -- no product module over 350 lines --------------------------------------------------------------
MAX_LINES = 350
PRODUCT = python_files("shared", "functions")


@pytest.mark.parametrize("path", PRODUCT, ids=ids(PRODUCT))
def test_product_modules_stay_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, (f"{path.relative_to(REPO)} has {lines} lines (at most {MAX_LINES}): split it "
                                f"along the skeleton, or further (e.g. decide.py + arithmetic.py)")


# -- the simulated KubeVirt: one module per real component ------------------------------------------
KUBEVIRT_PARTS = [p for p in python_files("simcluster/kubevirt") if p.name != "__init__.py"]


@pytest.mark.parametrize("path", KUBEVIRT_PARTS, ids=ids(KUBEVIRT_PARTS))
def test_each_part_of_the_simulated_kubevirt_names_what_it_stands_in_for(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert doc.startswith("Stands in for "), (f"{path.relative_to(REPO)}: its first sentence names the real "
                                              f"component it stands in for and what it decides ('Stands in for ...')")
    assert f"`{path.name}`" in (REPO / "docs" / "ARCHITECTURE.md").read_text(), \
        f"docs/ARCHITECTURE.md's table of the simulated KubeVirt does not name {path.name}"


# -- words the repository never uses --------------------------------------------------------------
# Built from pieces so that this file does not contain them itself.
NEEDLES = {
    ".." + "/shared": "a path that exists only on build machines; cite the public source instead",
    "FACTS" + ".md": "say docs/facts.md (same section numbers)",
    "STYLE" + ".md": "cite the upstream codebase instead, or drop it",
}

def mentions(text: str) -> list[str]:
    return [f"line {number}: {needle!r} ({why})" for number, line in enumerate(text.splitlines(), 1)
            for needle, why in NEEDLES.items() if needle in line]


@pytest.mark.parametrize("name", TRACKED)
def test_no_file_mentions_what_only_build_machines_have(name):
    path = REPO / name
    if not path.is_file():  # deleted in the work tree, not yet in the index
        return
    data = path.read_bytes()
    if b"\0" in data:  # not a text file
        return
    found = mentions(data.decode(errors="replace"))
    assert not found, f"{name}: " + "; ".join(found)


def test_the_mention_check_bites():
    assert len(mentions("see .." + "/shared/seeds and FACTS" + ".md §2\nper STYLE" + ".md")) == 3
