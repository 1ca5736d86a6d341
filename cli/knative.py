"""`vmevents knative plan|install`: the Knative that fits the cluster (README, "Install on Harvester", made executable).

Every Knative component checks the API server's version at start and exits when it is older than its release's
minimum (docs/facts.md §6: knative.dev/pkg `version.CheckMinimumVersion`), so the cluster's Kubernetes decides:
`plan` reads it (GET /version) and picks the newest Knative whose minimum it meets, or refuses, naming the reason and
the Harvester upgrade that would allow one. `install` applies that release's own YAML, in the order of Knative's
install docs (Serving's CRDs and core, Kourier and the ingress class, Eventing's CRDs and core, the in-memory
channel, the MT channel-based broker), and waits until every Deployment is Available. The YAML comes from Knative's
GitHub releases (the cluster's operator needs that address), or `--from DIR` holding the same files (a mirror; the
real control plane's tests write them from the Knative config vendored in upstream/).
"""
from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Release:
    """One Knative minor: the oldest Kubernetes it runs on and the tags of its Serving, net-kourier and Eventing
    releases this table names (docs/facts.md §6; the patches are those verified for this table, README's)."""

    minor: str
    kubernetes: tuple[int, int]
    serving: str
    kourier: str
    eventing: str


# Newest first. Minimums: the knative.dev/pkg each release requires (docs/facts.md §6). 1.22's and 1.21's patches are
# the ones README names and the tests run (1.21.2 on the real control plane); 1.18–1.20 their first release.
RELEASES = (
    Release("1.22", (1, 34), "knative-v1.22.1", "knative-v1.22.0", "knative-v1.22.2"),
    Release("1.21", (1, 33), "knative-v1.21.2", "knative-v1.21.0", "knative-v1.21.2"),
    Release("1.20", (1, 32), "knative-v1.20.0", "knative-v1.20.0", "knative-v1.20.0"),
    Release("1.19", (1, 32), "knative-v1.19.0", "knative-v1.19.0", "knative-v1.19.0"),
    Release("1.18", (1, 31), "knative-v1.18.0", "knative-v1.18.0", "knative-v1.18.0"),
)
# The Kubernetes each Harvester release runs (its RKE2_VERSION: docs/facts.md §6).
HARVESTER = {(1, 29): "1.4.0", (1, 30): "1.4.1", (1, 31): "1.4.2 or 1.4.3", (1, 32): "1.5", (1, 33): "1.6",
             (1, 34): "1.7", (1, 35): "1.8"}
DOWNLOADS = "https://github.com/{repo}/releases/download/{tag}/{file}"
NAMESPACES = ("knative-serving", "kourier-system", "knative-eventing")
INGRESS_CLASS = '{"data":{"ingress-class":"kourier.ingress.networking.knative.dev"}}'


@dataclass(frozen=True)
class Step:
    """One file of a release, applied in this order; `then`: wait for its CRDs before what follows."""

    repo: str
    tag: str
    file: str
    component: str          # serving | kourier | eventing
    crds: bool = False

    def url(self) -> str:
        return DOWNLOADS.format(repo=self.repo, tag=self.tag, file=self.file)


@dataclass(frozen=True)
class Plan:
    kubernetes: tuple[int, int]
    release: Release | None
    reason: str

    @property
    def refused(self) -> bool:
        return self.release is None

    def steps(self, components: Sequence[str] = ("serving", "kourier", "eventing")) -> list[Step]:
        r = self.release
        assert r is not None, "a refused plan has no steps"
        every = [Step("knative/serving", r.serving, "serving-crds.yaml", "serving", crds=True),
                 Step("knative/serving", r.serving, "serving-core.yaml", "serving"),
                 Step("knative-extensions/net-kourier", r.kourier, "kourier.yaml", "kourier"),
                 Step("knative/eventing", r.eventing, "eventing-crds.yaml", "eventing", crds=True),
                 Step("knative/eventing", r.eventing, "eventing-core.yaml", "eventing"),
                 Step("knative/eventing", r.eventing, "in-memory-channel.yaml", "eventing"),
                 Step("knative/eventing", r.eventing, "mt-channel-broker.yaml", "eventing")]
        return [s for s in every if s.component in components]


def kubernetes_version(git_version: str) -> tuple[int, int]:
    """(major, minor) of /version's gitVersion ("v1.33.13+rke2r1" → (1, 33))."""
    found = re.match(r"v?(\d+)\.(\d+)", git_version)
    if not found:
        raise ValueError(f"not a Kubernetes version: {git_version!r}")
    return int(found[1]), int(found[2])


def plan(kubernetes: tuple[int, int]) -> Plan:
    """The newest Knative of RELEASES whose minimum this Kubernetes meets, or a refusal that says what would."""
    shown = f"{kubernetes[0]}.{kubernetes[1]}"
    harvester = f" (Harvester {HARVESTER[kubernetes]})" if kubernetes in HARVESTER else ""
    for release in RELEASES:
        if kubernetes >= release.kubernetes:
            return Plan(kubernetes, release, f"Kubernetes {shown}{harvester}: Knative {release.minor}, the newest "
                                             f"that runs on it (it needs Kubernetes "
                                             f"{release.kubernetes[0]}.{release.kubernetes[1]} or later)")
    oldest = RELEASES[-1]
    newest: dict[str, str] = {}  # Harvester → the newest Knative it runs (RELEASES is newest first)
    for release in RELEASES:
        newest.setdefault(HARVESTER[release.kubernetes], release.minor)
    upgrades = "; ".join(f"Harvester {h} for Knative {k}" for h, k in reversed(newest.items()))
    return Plan(kubernetes, None, f"Kubernetes {shown}{harvester} is older than any Knative {RELEASES[-1].minor}–"
                                  f"{RELEASES[0].minor} accepts ({oldest.minor} needs "
                                  f"{oldest.kubernetes[0]}.{oldest.kubernetes[1]}): every Knative component would exit "
                                  f"at start. Upgrade first: {upgrades}")


# -- install -------------------------------------------------------------------------------------------------
Run = Callable[[Sequence[str]], subprocess.CompletedProcess]


class InstallError(RuntimeError):
    """A step failed: the message names it and what kubectl said."""


def install(found: Plan, kubectl: Sequence[str], *, source: Path | None = None, timeout: float = 600.0,
            components: Sequence[str] = ("serving", "kourier", "eventing"), say: Callable[[str], None] = print,
            run: Run | None = None) -> None:
    """Apply the plan's files (from GitHub, or `source`), then wait until every Deployment of its namespaces is
    Available (or `timeout` passes: InstallError, naming those that are not)."""
    call = run or (lambda args: subprocess.run(list(args), capture_output=True, text=True, timeout=timeout))

    def kubectl_ok(*args: str) -> str:
        done = call([*kubectl, *args])
        if done.returncode:
            raise InstallError(f"kubectl {' '.join(args[:3])}: {(done.stderr or done.stdout).strip()[-600:]}")
        return done.stdout

    deadline = time.monotonic() + timeout
    for step in found.steps(components):
        where = str(source / step.file) if source else step.url()
        if source and not (source / step.file).is_file():
            raise InstallError(f"{source} has no {step.file} (Knative {step.tag}'s release file)")
        say(f"applying {step.file} ({step.repo} {step.tag})")
        kubectl_ok("apply", "-f", where)
        if step.crds:
            kubectl_ok("wait", "--for=condition=Established", "crd", "--all", f"--timeout={_left(deadline)}s")
        if step.file == "kourier.yaml":
            kubectl_ok("patch", "configmap/config-network", "-n", "knative-serving", "--type", "merge",
                       "-p", INGRESS_CLASS)
    for namespace in [n for n, c in zip(NAMESPACES, ("serving", "kourier", "eventing"), strict=True)
                      if c in components]:
        say(f"waiting until every Deployment in {namespace} is Available")
        kubectl_ok("wait", "--for=condition=Available", "deployment", "--all", "-n", namespace,
                   f"--timeout={_left(deadline)}s")
    say(f"Knative {found.release.minor if found.release else ''} is ready ({', '.join(components)})")


def _left(deadline: float) -> int:
    return max(1, int(deadline - time.monotonic()))
