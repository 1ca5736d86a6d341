"""`make bench`'s machinery at a tiny size: every part of the report is there, and an irrelevant
event costs no Kubernetes API call. No timing is asserted: the machines are too noisy for that, and
the benchmark reports ratios, not verdicts."""
import contextlib
import shutil

import pytest

from bench import load
from bench.vmi_cleanup import NOOP, VMI_CLEANUP, Config, Server, binary_event, make_vmi, render, run_bench

pytestmark = pytest.mark.timeout(120)
TINY = load.Load(seconds=1, connections=2, max_requests=50)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    config = Config(rounds=1, load=TINY, warmup=load.Load(seconds=1, connections=2, max_requests=10),
                    relevant=load.Load(seconds=1, connections=2, max_requests=20), startups=1)
    with contextlib.ExitStack() as stack:
        return run_bench(config, tmp_path_factory.mktemp("bench"), stack)


def test_irrelevant_vmi_updates_make_no_api_call(report):
    assert report.irrelevant["events"] >= TINY.max_requests
    assert report.irrelevant["decisions"] == {"irrelevant": report.irrelevant["events"]}
    assert report.irrelevant["api_calls"] == 0
    assert report.irrelevant["api_calls_per_event"] == 0
    assert report.calls_verdict == "PASS"


def test_the_report_has_every_part(report):
    assert [run["server"] for run in report.rounds] == [VMI_CLEANUP.name, NOOP.name]
    for name in (VMI_CLEANUP.name, NOOP.name):
        row = report.throughput[name]
        assert row["requests"] >= TINY.max_requests and row["failed"] == 0
        assert row["events_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
        assert report.startup_s[name] > 0 and report.rss_mib[name] > 0
    assert report.ratio > 0 and report.throughput_verdict in ("PASS", "MISS")
    assert len(report.paired_ratios) == 1


def test_a_succeeded_vmi_not_yet_due_is_read_again_and_waits(report):
    relevant = report.relevant
    assert relevant["failed"] == 0 and relevant["requests"] > 0
    assert set(relevant["decisions"]) == {"wait"}
    assert relevant["api_calls_per_event"] >= 1  # the VMI and its VM, fetched fresh


def test_the_rendered_report_names_each_measurement(report):
    text = render(report)
    for part in ("events/s", "throughput ratio vmi-cleanup / no-op", "API calls per irrelevant event",
                 "relevant, not yet due", "start-up s", "RSS MiB", report.generator):
        assert part in text


def test_the_event_is_a_binary_mode_update_carrying_a_running_vmi_of_a_few_kb():
    headers, body = binary_event(make_vmi("vm8"))
    assert headers["ce-type"] == "dev.knative.apiserver.resource.update"
    assert headers["ce-kind"] == "VirtualMachineInstance" and headers["Content-Type"] == "application/json"
    assert b'"phase":"Running"' in body and 2_000 < len(body) < 10_000


@pytest.mark.parametrize("generator", [
    "python",
    pytest.param("wrk", marks=pytest.mark.skipif(not shutil.which("wrk"), reason="wrk is not on PATH")),
])
def test_each_load_generator_counts_answers(generator, tmp_path):
    event = binary_event(make_vmi("vm8"))
    server = Server(NOOP, kubeconfig=str(tmp_path / "unused"), workdir=tmp_path).start()
    try:
        server.first_answer(*event)
        result = load.choose(generator).run(server.port, *event, load.Load(seconds=1, connections=2,
                                                                             max_requests=20))
    finally:
        server.stop()
    assert result.requests >= 20 and result.failed == 0 and result.p50_ms <= result.p99_ms
