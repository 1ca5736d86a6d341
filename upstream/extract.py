"""Re-extract the vendored upstream files for one project at one tag or commit, so anyone can check they are unmodified.

Usage (from the repository root):

    python upstream/extract.py kubevirt v1.8.3
    python upstream/extract.py cdi v1.64.0
    python upstream/extract.py knative-eventing knative-v1.22.2
    python upstream/extract.py knative-serving knative-v1.22.1
    python upstream/extract.py longhorn v1.10.0
    python upstream/extract.py pcidevices bdd80256a8548a4271f6ec4928e2203441a54bc0
    python upstream/extract.py harvester 5ffb931351309a4d7952dfc65cfaecf3372642b1
    python upstream/extract.py harvester-release v1.7.0

Each file is read either from a local clone (``--git-dir DIR``: ``git --git-dir DIR show REF:PATH``) or, by default,
from ``https://raw.githubusercontent.com/<owner>/<repo>/<ref>/<path>``. ``--check`` compares instead of writing and
exits 1 when a file differs or is missing. ``--out DIR`` writes somewhere other than this folder.

Every file is the upstream file byte for byte, except KubeVirt's: KubeVirt ships its CRD schemas only inside the
Go source ``pkg/virt-operator/resource/generate/components/validations_generated.go``, as the values of the map
``CRDsValidation``; each value is written unchanged as ``<kind>.openAPIV3Schema.yaml``. Standard library and
PyYAML only (PyYAML checks that each KubeVirt value is a whole schema document; the other files are copied as
they are, and some are Helm templates rather than plain YAML).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
KUBEVIRT_GO = "pkg/virt-operator/resource/generate/components/validations_generated.go"
KUBEVIRT_KINDS = ("kubevirt", "migrationpolicy", "virtualmachine", "virtualmachineinstance",
                  "virtualmachineinstancemigration")
# CDI publishes its CRDs inside Go source too: the map `CDICRDs`, each value a whole CustomResourceDefinition.
CDI_GO = "pkg/operator/resources/crds_generated.go"
CDI_KINDS = ("datavolume",)


@dataclass(frozen=True)
class Project:
    """One upstream repository and the files taken from it: {local path under upstream/: path upstream}."""

    repo: str                      # owner/name on GitHub
    folder: Callable[[str], str]   # the local folder for a ref
    files: dict[str, str]          # local name -> path in the repository (empty for kubevirt)


PROJECTS = {
    "kubevirt": Project("kubevirt/kubevirt", lambda ref: f"kubevirt/{ref}/crd-schemas", {}),
    "knative-eventing": Project("knative/eventing", lambda ref: f"knative-eventing/{ref}", {
        "apiserversource.crd.yaml": "config/core/resources/apiserversource.yaml",
        "broker.crd.yaml": "config/core/resources/broker.yaml",
        "pingsource.crd.yaml": "config/core/resources/pingsource.yaml",
        "trigger.crd.yaml": "config/core/resources/trigger.yaml",
        "config-features.configmap.yaml": "config/core/configmaps/features.yaml",
    }),
    "knative-serving": Project("knative/serving", lambda ref: f"knative-serving/{ref}", {
        "service.crd.yaml": "config/core/300-resources/service.yaml",
    }),
    "longhorn": Project("longhorn/longhorn-manager", lambda ref: f"longhorn/{ref}", {
        "crds.yaml": "k8s/crds.yaml",
    }),
    # pcidevices has no release that carries these files as vendored here; the folder is not versioned.
    "pcidevices": Project("harvester/pcidevices", lambda ref: "harvester-pcidevices", {
        "crds.yaml": "charts/templates/crds.yaml",
        "sample-pcidevice.yaml": "sample/pcidevice.yaml",
        "sample-pcideviceclaim.yaml": "sample/pcideviceclaim.yaml",
    }),
    # CDI's DataVolume CRD (KubeVirt v1.8.3 builds against containerized-data-importer-api v1.64.0).
    "cdi": Project("kubevirt/containerized-data-importer", lambda ref: f"cdi/{ref}", {}),
    # The Addon CRD (deploy/harvester/addon.yaml is applied against it); not versioned either.
    "harvester": Project("harvester/harvester", lambda ref: "harvester", {
        "addons.crd.yaml": "deploy/charts/harvester-crd/templates/harvesterhci.io_addons.yaml",
    }),
    # The Setting and Upgrade CRDs of a release (evacuation-report reads vm-force-reset-policy, server-version
    # and the Upgrade's node steps, docs/facts.md §10).
    "harvester-release": Project("harvester/harvester", lambda ref: f"harvester/{ref}", {
        "settings.crd.yaml": "deploy/charts/harvester-crd/templates/harvesterhci.io_settings.yaml",
        "upgrades.crd.yaml": "deploy/charts/harvester-crd/templates/harvesterhci.io_upgrades.yaml",
    }),
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    project = PROJECTS[args.project]
    read = _git_reader(args.git_dir, args.ref) if args.git_dir else _http_reader(project.repo, args.ref)
    if args.git_dir:
        print(f"{project.repo} {args.ref} = commit {_resolve(args.git_dir, args.ref)}")
    wanted = extract(project, read)
    folder = (args.out or HERE) / project.folder(args.ref)
    return check(folder, wanted) if args.check else write(folder, wanted)


def extract(project: Project, read: Callable[[str], bytes]) -> dict[str, bytes]:
    """Every file the project contributes: {local name: content}."""
    if project.repo == "kubevirt/kubevirt":
        schemas = crds_validation(read(KUBEVIRT_GO).decode("utf-8"))
        missing = [kind for kind in KUBEVIRT_KINDS if kind not in schemas]
        if missing:
            raise SystemExit(f"{KUBEVIRT_GO} has no CRDsValidation entry for {', '.join(missing)}")
        for kind in KUBEVIRT_KINDS:  # the one file read out of Go source: check it is the schema, whole
            if not isinstance(document := yaml.safe_load(schemas[kind]), dict) or "openAPIV3Schema" not in document:
                raise SystemExit(f"{KUBEVIRT_GO}: the {kind!r} entry is not an openAPIV3Schema document")
        return {f"{kind}.openAPIV3Schema.yaml": schemas[kind].encode("utf-8") for kind in KUBEVIRT_KINDS}
    if project.repo == "kubevirt/containerized-data-importer":
        crds = crds_validation(read(CDI_GO).decode("utf-8"), "var CDICRDs map[string]string = map[string]string{",
                               CDI_GO)
        for kind in CDI_KINDS:
            if not isinstance(document := yaml.safe_load(crds.get(kind, "")), dict) or \
                    document.get("kind") != "CustomResourceDefinition":
                raise SystemExit(f"{CDI_GO}: the {kind!r} entry is not a CustomResourceDefinition")
        return {f"{kind}.crd.yaml": crds[kind].encode("utf-8") for kind in CDI_KINDS}
    return {name: read(path) for name, path in project.files.items()}


# The map's entries, read in order: `"kind": ` then Go string literals joined with `+`, then a comma.
_KEY = re.compile(r'\s*"([a-z0-9]+)":\s*')
_LITERAL = re.compile(r'`([^`]*)`|"((?:[^"\\\n]|\\.)*)"')
_PLUS = re.compile(r"\s*\+\s*")
_COMMA = re.compile(r"\s*,")
_MAP = "var CRDsValidation map[string]string = map[string]string{"


def crds_validation(go_source: str, declaration: str = _MAP, where: str = KUBEVIRT_GO) -> dict[str, str]:
    """The values of a Go `map[string]string` of string literals (KubeVirt's `CRDsValidation`, CDI's `CDICRDs`),
    each one's literals concatenated, in source order."""
    if declaration not in go_source:
        raise SystemExit(f"{where}: no `{declaration}`")
    pos, values = go_source.index(declaration) + len(declaration), {}
    while (key := _KEY.match(go_source, pos)) is not None:
        parts, pos = [], key.end()
        while True:
            literal = _LITERAL.match(go_source, pos)
            if literal is None:
                raise SystemExit(f"{where}: no Go string literal for {key.group(1)!r} at offset {pos}")
            raw, quoted = literal.groups()
            # A raw literal is taken as it is (Go would drop carriage returns from it; there are none).
            parts.append(raw if raw is not None else _unquote(quoted))
            pos = literal.end()
            plus = _PLUS.match(go_source, pos)
            if plus is None:
                break
            pos = plus.end()
        comma = _COMMA.match(go_source, pos)
        if comma is None:
            raise SystemExit(f"{where}: no comma after the value of {key.group(1)!r} at offset {pos}")
        values[key.group(1)], pos = "".join(parts), comma.end()
    if not re.match(r"\s*}", go_source[pos:]):
        raise SystemExit(f"{where}: cannot read the map entry at offset {pos}")
    return values


def _unquote(body: str) -> str:
    # Generated code only uses "`" (a backquote cannot appear in a raw literal) and the common escapes.
    escapes = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "`": "`"}
    return re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), "\\" + m.group(1)), body)


def write(folder: Path, wanted: dict[str, bytes]) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in sorted(wanted.items()):
        (folder / name).write_bytes(content)
        print(f"wrote {folder / name} ({len(content)} bytes)")
    return 0


def check(folder: Path, wanted: dict[str, bytes]) -> int:
    differ = 0
    for name, content in sorted(wanted.items()):
        path = folder / name
        same = path.is_file() and path.read_bytes() == content
        differ += not same
        print(f"{'same' if same else 'DIFFERENT' if path.is_file() else 'MISSING'}  {path}")
    return 1 if differ else 0


def _git_reader(git_dir: Path, ref: str) -> Callable[[str], bytes]:
    def read(path: str) -> bytes:
        shown = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{ref}:{path}"],
                               capture_output=True, check=False)
        if shown.returncode != 0:
            raise SystemExit(f"git show {ref}:{path} in {git_dir} failed: {shown.stderr.decode().strip()}")
        return shown.stdout
    return read


def _resolve(git_dir: Path, ref: str) -> str:
    shown = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", f"{ref}^{{commit}}"],
                           capture_output=True, text=True, check=False)
    if shown.returncode != 0:
        raise SystemExit(f"{ref} is not a commit or tag in {git_dir}: {shown.stderr.strip()}")
    return shown.stdout.strip()


def _http_reader(repo: str, ref: str) -> Callable[[str], bytes]:
    def read(path: str) -> bytes:
        url = f"https://raw.githubusercontent.com/{repo}/{ref}/{path}"
        try:
            with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - a fixed https URL
                return bytes(response.read())
        except OSError as exc:
            raise SystemExit(f"cannot read {url}: {exc}; with a clone, pass --git-dir") from exc
    return read


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("project", choices=sorted(PROJECTS))
    parser.add_argument("ref", help="the tag or commit to read, e.g. v1.8.3 or knative-v1.22.2")
    parser.add_argument("--git-dir", type=Path, help="a local clone (bare or the .git folder) to read with git show")
    parser.add_argument("--out", type=Path, help="the folder standing for upstream/ (default: this script's folder)")
    parser.add_argument("--check", action="store_true", help="compare with the files there instead of writing")
    return parser


if __name__ == "__main__":
    sys.exit(main())
