"""The `make run` stories, one module per function, played in this order.

Each module has `play()`, which uses `simcluster.play.stage(...)` to get a simulated cluster with
KubeVirt and every function, broker and source of deploy/ running, and prints a timeline.
"""
import importlib

ALL = ["vmi_cleanup", "device_conflict", "migration_report", "io_pause_report", "vm_stuck_report", "alert_forwarder"]


def load(name: str):
    return importlib.import_module(f"simcluster.stories.{name}")
