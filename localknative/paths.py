"""Where the local runtime finds the repository and the deploy/ manifests it runs."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEPLOY_DIR = REPO / "deploy"
