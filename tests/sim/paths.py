"""Where the simulator finds the repo's deploy/ manifests and the read-only reference material."""
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY_DIR = REPO / "deploy"
# ../shared/reference beside the repo (read-only: upstream CRD schemas, FACTS.md); CI lays it there too.
REFERENCE_DIR = Path(os.environ.get("VMEVENTS_REFERENCE", REPO.parent / "shared" / "reference"))
KUBEVIRT_SCHEMAS = REFERENCE_DIR / "kubevirt"
