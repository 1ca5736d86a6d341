"""Every file derived from the declarations, as it must read: {path relative to the repository: text}."""
from __future__ import annotations

from catalog import declarations, manifests


def outputs() -> dict[str, str]:
    functions = declarations()
    found = {f"deploy/base/{manifests.file_name(f)}": manifests.manifest(f) for f in functions}
    found["deploy/base/kustomization.yaml"] = manifests.kustomization(functions)
    return found
