"""shared/redact.py: a URL is shown by its origin, and no part of a secret URL survives a scrub."""
from __future__ import annotations

import pytest

from shared.redact import origin, scrub, scrub_urls, url_secrets


@pytest.mark.parametrize("url,shown", [
    ("https://hooks.slack.com/services/T0/B0/XYZ", "https://hooks.slack.com"),
    ("https://user:pass@hooks.example.com:8443/p?token=1#f", "https://hooks.example.com:8443"),
    ("http://[::1]:9093/api", "http://[::1]:9093"),
    ("hooks.slack.com/services/T0", "hooks.slack.com"),
    ("user:pass@hooks.example.com/secret", "hooks.example.com"),
    ("http://[not-an-address]/secret", "http://[redacted]"),
    ("http://host:notaport/secret", "http://host"),
])
def test_a_url_is_shown_by_scheme_host_and_port(url, shown):
    assert origin(url) == shown


def test_every_part_of_a_url_is_a_secret_raw_and_decoded():
    parts = url_secrets("https://al%69ce:pw99@h.example/ser%2Fvices/T0abc/?token=q5ec+ret&x=1")
    for part in ("al%69ce", "alice", "pw99", "T0abc", "token=q5ec+ret", "q5ec ret", "ser/vices"):
        assert part in parts
    assert "h.example" not in " ".join(parts), "the origin is not a secret"


def test_a_scrub_removes_the_parts_and_shows_any_url_by_origin():
    url = "https://alice:pw99@h.example/services/T0abc?token=q5ec"
    said = scrub(f"POST /services/T0abc?token=q5ec from alice; see {url} and http://other.example/x?y=z",
                 url_secrets(url))
    assert said == "POST [redacted] from [redacted]; see https://h.example and http://other.example"
    assert scrub_urls("no url here") == "no url here"


def test_an_error_answer_shows_a_url_by_origin_whoever_wrote_the_message():
    from shared.errors import TemporaryError, http_answer

    _, _, body = http_answer(TemporaryError("posting to https://bob:pw99@h.example/hook/T0abc?t=q5ec failed"))
    assert body == b'{"error": "posting to https://h.example failed"}'
    _, _, body = http_answer(ValueError("unexpected at http://h.example/a/T0abc"))
    assert b"T0abc" not in body and b"http://h.example" in body
