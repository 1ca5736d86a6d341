"""The `make run` stories, one module per function, played in this order.

Each module has `play()`, which uses `simcluster.play.stage(...)` to get a simulated cluster with
KubeVirt and every function, broker and source of deploy/ running, and prints a timeline.
"""
import importlib
from pathlib import Path

from catalog import FUNCTIONS

# Every function with a story here (simcluster/stories/<package>.py), in catalog.FUNCTIONS' order.
ALL = [package for package in FUNCTIONS if (Path(__file__).parent / f"{package}.py").is_file()]


def load(name: str):
    return importlib.import_module(f"simcluster.stories.{name}")
