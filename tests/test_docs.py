"""The docs say what is there: every relative link in README.md and docs/ leads to a file, and every anchor to a
heading of it (GitHub's anchors); README's overlay table lists every overlay of deploy/overlays; the memory figures
README gives are the declared ones."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from catalog import declarations
from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "upstream" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
NAMED = re.compile(r'<a id="([^"]+)"></a>')


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower-case, punctuation but hyphens and underscores dropped, spaces hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """A page's headings' anchors, and the ones it names itself (`<a id="…"></a>`, which GitHub keeps)."""
    found, seen, fenced = set(), {}, False
    for line in page.read_text().splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        if fenced:
            continue
        found.update(NAMED.findall(line))
        if not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    text, fenced, out = page.read_text().splitlines(), False, []
    for line in text:
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out += LINK.findall(line)
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page: Path):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue  # an absolute URL
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: {dest.relative_to(REPO)} has no heading #{anchor}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_readmes_overlay_table_lists_every_overlay():
    readme = (REPO / "README.md").read_text()
    overlays = sorted(p.name for p in (REPO / "deploy" / "overlays").iterdir() if (p / "kustomization.yaml").exists())
    listed = sorted(re.findall(r"^\s+\| `([a-z-]+)` \| ", readme, re.M))
    assert listed == overlays
    words = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    assert f"a kustomize base with {words[len(overlays)]} overlays" in readme


def test_readmes_memory_figures_are_the_declared_ones():
    readme = (REPO / "README.md").read_text()
    [said] = re.findall(r"^- memory: .*?(?=^- )", readme, re.M | re.S)
    usual = {(f.service.resources.memory, f.service.resources.memory_limit) for f in declarations()}
    for function in declarations():
        r = function.service.resources
        if (r.memory, r.memory_limit) == ("128Mi", "256Mi"):
            continue
        assert re.search(rf"{re.escape(function.name)}[^;)]*{r.memory}[^;)]*{r.memory_limit}|"
                         rf"{re.escape(function.name)}[^;)]*{r.memory_limit}", " ".join(said.split())), \
            f"README's memory figures do not give {function.name}'s {r.memory}/{r.memory_limit}"
    assert ("128Mi", "256Mi") in usual and "a request of 128Mi and a limit of 256Mi" in " ".join(said.split())
