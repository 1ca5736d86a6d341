"""alert-forwarder's table of categories (functions/alert_forwarder/categories.py) from every producer's declared
alerts. Functions never import each other: the table is a generated copy of the producers' declarations, checked
by tests/test_catalog.py (docs/findings.md, "Which category becomes which alert", says why a copy)."""
from __future__ import annotations

from shared.declaration import Function

PATH = "functions/alert_forwarder/categories.py"


def categories(functions: tuple[Function, ...]) -> str:
    lines = ['"""Which category of finding becomes which alert: its name, the severity used when the finding carries',
             "none, and its runbook's anchor in README. Generated from each producer's functions/<name>/declaration.py",
             '(its `alerts`) by `make generate` (catalog/alerts.py): edit the declaration, never this file."""',
             "",
             "CATEGORIES: dict[str, tuple[str, str, str]] = {"]
    for function in functions:
        if not function.alerts:
            continue
        lines.append(f"    # {function.name} (docs/{function.name}.md)")
        for alert in function.alerts:
            for category in alert.categories:
                lines.append(f'    "{category}": ("{alert.name}", "{alert.severity}", "{alert.runbook}"),')
    lines.append("}")
    return "\n".join(lines) + "\n"
