"""Where the simulator finds the upstream data it validates against: the repository's own upstream/ folder
(upstream/README.md says where each file came from)."""
from localknative.paths import DEPLOY_DIR, REPO

UPSTREAM_DIR = REPO / "upstream"
KUBEVIRT_SCHEMAS = UPSTREAM_DIR / "kubevirt"

__all__ = ["DEPLOY_DIR", "REPO", "UPSTREAM_DIR", "KUBEVIRT_SCHEMAS"]
