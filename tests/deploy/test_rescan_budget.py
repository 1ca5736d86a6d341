"""A re-scan's budget (shared/rescan.py) is below the delivery timeout of the Trigger that sends its tick:
the re-scan answers before the broker gives up on it and retries while it still runs (issue 14)."""
from __future__ import annotations

from datetime import timedelta

import pytest

from catalog import declarations
from shared import rescan
from shared.settings import parse_duration
from tests.deploy.kustomize import KUSTOMIZATIONS, env_of, ident, knative_services, of_kind, render

# The functions whose tick is a budgeted re-scan: those that declare RESCAN_BUDGET.
RESCANNING = tuple(f.name for f in declarations() if "RESCAN_BUDGET" in {s.name for s in f.settings})


def iso_seconds(text: str) -> timedelta:
    """PT30S, the only ISO 8601 form the manifests use for a delivery timeout."""
    assert text.startswith("PT") and text.endswith("S"), text
    return timedelta(seconds=float(text[2:-1]))


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_trigger_of_a_rescanning_function_has_the_timeout_the_budget_defaults_from(kustomization):
    objects = render(kustomization)
    triggers = [t for t in of_kind(objects, "eventing.knative.dev", "Trigger")
                if t["spec"]["subscriber"]["ref"]["name"] in RESCANNING]
    assert {t["spec"]["subscriber"]["ref"]["name"] for t in triggers} == set(RESCANNING)
    for trigger in triggers:
        timeout = iso_seconds(trigger["spec"]["delivery"]["timeout"])
        assert timeout == rescan.DELIVERY_TIMEOUT, (
            f"{ident(trigger)}: delivery.timeout {timeout} is not shared.rescan.DELIVERY_TIMEOUT; change both")
    for svc in knative_services(objects):
        if svc["metadata"]["name"] in RESCANNING:
            budget = parse_duration(env_of(svc)["RESCAN_BUDGET"])
            assert budget == rescan.DEFAULT_BUDGET < rescan.DELIVERY_TIMEOUT, ident(svc)
