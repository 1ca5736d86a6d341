"""bench/broker.py's machinery on the local path at a tiny size: every event arrives once, and with a 503 on
its first try twice. No timing is asserted (the benchmark reports them side by side, not verdicts)."""
from bench.broker import local


def test_the_local_round_counts_deliveries():
    result = local(10)
    assert result["ok"]["lost"] == 0 and result["ok"]["per_event"] == 1.0
    assert result["retry"]["lost"] == 0 and result["retry"]["per_event"] == 2.0
    assert 0 < result["ok"]["p50"] <= result["ok"]["p99"]
