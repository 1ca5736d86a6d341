"""Every file derived from the declarations, as it must read: {path relative to the repository: text}."""
from __future__ import annotations

from catalog import REPO, alerts, chart, declarations, declared, docs, manifests, monitoring

ALERTS = "each producer's declared alerts and identity (functions/<name>/declaration.py)"


def outputs() -> dict[str, str]:
    functions = declarations()
    found = {f"deploy/base/{manifests.file_name(f)}": manifests.manifest(f) for f in functions}
    found["deploy/base/kustomization.yaml"] = manifests.kustomization(functions)
    found["deploy/chart/vmevents/values.yaml"] = chart.values(functions)
    found[chart.SCOPED_PATH] = chart.scoped(functions)
    found["deploy/harvester/addon.yaml"] = chart.addon(_read("deploy/harvester/addon.yaml"), functions)
    found[alerts.PATH] = alerts.categories(functions)
    found.update(monitoring.outputs(functions))
    found["README.md"] = docs.readme(_read("README.md"), functions)
    min_severity = declared("alert-forwarder").setting("MIN_SEVERITY").default
    found["docs/alert-forwarder.md"] = docs.between(_read("docs/alert-forwarder.md"), "docs/alert-forwarder.md",
                                                    ALERTS, docs.alerts_table(functions, min_severity))
    found["docs/findings.md"] = docs.between(_read("docs/findings.md"), "docs/findings.md", ALERTS,
                                             docs.producers_table(functions))
    for function in functions:
        if function.settings:
            path = f"docs/{function.name}.md"
            found[path] = docs.settings_page(found.get(path) or _read(path), function)
    return found


def _read(path: str) -> str:
    """A page a generated part is written into (a missing page reads as empty, and its markers are then missing)."""
    target = REPO / path
    return target.read_text() if target.is_file() else ""
