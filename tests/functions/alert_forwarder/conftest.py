"""alert-forwarder's test fixtures: a local webhook receiver, and the function served with only its own settings."""
from __future__ import annotations

import functools

import pytest

from simcluster.alertmanager import Receiver
from tests.http_cases import source_of

SOURCE = source_of("alert_forwarder")
SETTINGS = ("ALERTMANAGER_URL", "ALERTMANAGER_BEARER_TOKEN_FILE", "ALERTMANAGER_CA_FILE",
            "ALERTMANAGER_INSECURE_SKIP_VERIFY", "WEBHOOK_URL", "WEBHOOK_FORMAT", "WEBHOOK_HEADERS_FILE",
            "WEBHOOK_CA_FILE", "WEBHOOK_INSECURE_SKIP_VERIFY", "MIN_SEVERITY", "CLUSTER_NAME", "ALERT_TTL",
            "ALERT_VALID_FOR", "ALERT_RESOLVED_FOR", "ALERT_CLOCK_SKEW", "SEND_TIMEOUT", "RUNBOOK_BASE_URL")


@pytest.fixture
def receiver():
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def app_with(serve):
    """create_app with these settings (and no others from the developer's environment)."""
    return functools.partial(serve, SOURCE, SETTINGS)
