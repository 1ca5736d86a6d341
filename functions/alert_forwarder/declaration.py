"""alert-forwarder, declared once (shared/declaration.py): deploy/base/alert-forwarder.yaml, the chart's and the
Add-on's values, docs/alert-forwarder.md's settings and README's table are generated from it."""
from shared.declaration import (
    SEVERITIES,
    Boolean,
    Choice,
    Custom,
    Delivery,
    Duration,
    Function,
    Grant,
    Number,
    Resources,
    Rule,
    Scale,
    SecretVolume,
    Service,
    Setting,
    Trigger,
)

WEBHOOK_FORMATS = ("json", "slack")
URLS = Custom("http(s) URLs, comma-separated")
FILE = Custom("a file's path")

ALERTMANAGER_URL = Setting(
    "ALERTMANAGER_URL", "", "Alertmanager's base URL, e.g. "
    "`http://rancher-monitoring-alertmanager.cattle-monitoring-system.svc:9093`; several comma-separated for the "
    "replicas of an HA Alertmanager (each must accept)", URLS,
    why="Harvester's rancher-monitoring: http://rancher-monitoring-alertmanager.cattle-monitoring-system.svc:9093",
    addon=True)
ALERTMANAGER_BEARER_TOKEN_FILE = Setting(
    "ALERTMANAGER_BEARER_TOKEN_FILE", "", "a file holding a bearer token for Alertmanager (re-read on every send, so "
    "a rotated Secret needs no restart)", FILE)
ALERTMANAGER_CA_FILE = Setting("ALERTMANAGER_CA_FILE", "", "a CA bundle to verify Alertmanager's TLS certificate "
                               "(default: the system's)", FILE)
ALERTMANAGER_INSECURE_SKIP_VERIFY = Setting("ALERTMANAGER_INSECURE_SKIP_VERIFY", "false", "`true` turns TLS "
                                            "verification off", Boolean())
WEBHOOK_URL = Setting("WEBHOOK_URL", "", "one webhook URL (a Slack incoming webhook, or any HTTP endpoint); shown as "
                      "its host only in errors and logs", URLS, addon=True)
WEBHOOK_FORMAT = Setting("WEBHOOK_FORMAT", "json", "`json` or `slack`", Choice(WEBHOOK_FORMATS))
WEBHOOK_HEADERS_FILE = Setting(
    "WEBHOOK_HEADERS_FILE", "", "a file of `Name: value` lines sent as headers with every webhook POST (e.g. "
    "`Authorization: Bearer …`); re-read on every send", FILE)
WEBHOOK_CA_FILE = Setting("WEBHOOK_CA_FILE", "", "a CA bundle to verify the webhook's TLS certificate (default: the "
                          "system's)", FILE)
WEBHOOK_INSECURE_SKIP_VERIFY = Setting("WEBHOOK_INSECURE_SKIP_VERIFY", "false", "`true` turns TLS verification off",
                                       Boolean())
MIN_SEVERITY = Setting("MIN_SEVERITY", "warning", "findings below it are dropped (`info`, `warning`, `critical`)",
                       Choice(SEVERITIES), addon=True)
CLUSTER_NAME = Setting("CLUSTER_NAME", "", "the `cluster` label (omitted when empty)",
                       Custom("a label value, at most 253 characters"), addon=True)
ALERT_TTL = Setting("ALERT_TTL", "1h", "how long the alert of a `reported` finding (vmi-cleanup's: no episode) "
                    "lasts", Duration())
ALERT_VALID_FOR = Setting(
    "ALERT_VALID_FOR", "4m", "the `endsAt` of a firing finding's alert, from each post (its notice, then every tick "
    "while its record is open); longer than the PingSource's period (1m). Prometheus' 4 × 1m", Duration(),
    why="A firing finding's alert ends this long after each post; every tick posts it again.")
ALERT_RESOLVED_FOR = Setting(
    "ALERT_RESOLVED_FOR", "15m", "how long after its resolution a finding's resolved alert is posted again on each "
    "tick (Prometheus' `resolvedRetention`); longer than 1m", Duration(),
    why="How long a resolved finding's alert is posted again on each tick.")
ALERT_CLOCK_SKEW = Setting(
    "ALERT_CLOCK_SKEW", "1m", "how far before its resolution a resolved alert's `endsAt` is put, so that an "
    "Alertmanager whose clock is behind ours by less sees it ended at once (0s to 10m)", Duration(),
    why="How far in the past a resolved alert's end is put, for an Alertmanager whose clock is behind.")
SEND_TIMEOUT = Setting("SEND_TIMEOUT", "5", "seconds per POST", Number(0.1, 60))
REDIRECT_ALLOWED_ORIGINS = Setting(
    "REDIRECT_ALLOWED_ORIGINS", "", "origins (`https://host[:port]`, comma-separated, nothing more) besides a "
    "receiver's own that a 307/308 may lead to; any other redirect is refused (502)",
    Custom("origins, comma-separated"),
    why="Origins besides a receiver's own that a 307/308 may lead to (none: only the receiver's own).")
RUNBOOK_BASE_URL = Setting("RUNBOOK_BASE_URL", "https://github.com/vmevents/vmevents/blob/main/README.md",
                           "where `runbook_url` points (the anchors above)", Custom("an http(s) URL"))

DECLARATION = Function(
    name="alert-forwarder",
    summary="delivers the other functions' findings to Alertmanager and webhooks",
    about="alert-forwarder: turns the other functions' findings (their io.vmevents.* replies) into Alertmanager "
          "alerts and/or webhook posts, and on every PingSource tick re-posts the findings on record to "
          "Alertmanager, as Prometheus re-sends its alerts. Its permissions are on Events only: the finding "
          "Events, read before a notice is sent and annotated with what each receiver accepted, and listed on a "
          "tick. Credentials come only from files: the optional Secret `alert-forwarder-credentials` is mounted "
          "read-only; point ALERTMANAGER_BEARER_TOKEN_FILE / WEBHOOK_HEADERS_FILE at its keys (README).",
    service=Service(
        scale=Scale(0, 2, "Findings are rare: zero pods when there are none; two carry any incident's burst."),
        concurrency_why="= THREADS in the image: one request per gunicorn thread.",
        resources=Resources("10m", "128Mi", "192Mi",
                            "Measured (make bench): 106 MiB RSS after the load (gunicorn master + worker; "
                            "shared/runtime.py loads the kubernetes client here too), and a tick's peak 108-116 MiB "
                            "at 1,000 to 50,000 open findings (it holds a few pages and bodies, never them all). "
                            "Request 128Mi, limit 192Mi."),
        volumes=(SecretVolume("credentials", "alert-forwarder-credentials", "/etc/vmevents/alert-forwarder",
                              "Keys: alertmanager-token (a bearer token), webhook-headers (`Name: value` lines), "
                              "ca.crt."),)),
    trigger=Trigger(
        "Every reply of every function: findings, and the re-scan summaries (`*.scanned`) that carry the findings a "
        "re-scan made (the function sends one alert per finding in them); and the PingSource's tick, on which it "
        "re-posts the findings on record. Retries span about four minutes (1+2+…+128 s), enough for an "
        "Alertmanager restart, before the dead-letter sink logs it.",
        replies=True, delivery=Delivery(retry=8, backoff_delay="PT1S")),
    settings=(ALERTMANAGER_URL, ALERTMANAGER_BEARER_TOKEN_FILE, ALERTMANAGER_CA_FILE, ALERTMANAGER_INSECURE_SKIP_VERIFY,
              WEBHOOK_URL, WEBHOOK_FORMAT, WEBHOOK_HEADERS_FILE, WEBHOOK_CA_FILE, WEBHOOK_INSECURE_SKIP_VERIFY,
              MIN_SEVERITY, CLUSTER_NAME, ALERT_TTL, ALERT_VALID_FOR, ALERT_RESOLVED_FOR, ALERT_CLOCK_SKEW,
              SEND_TIMEOUT, REDIRECT_ALLOWED_ORIGINS, RUNBOOK_BASE_URL),
    grants=(
        Grant(rules=(Rule("", ("events",), ("get", "list", "patch", "watch"),
                          why="get: a finding's Event before its notice is sent (an episode that ended is not sent "
                              "firing); patch: its annotations vmevents.io/alert-claim and vmevents.io/alert-receipts "
                              "(who is sending it, and what each receiver accepted: nothing is sent twice), at the "
                              "version read; list: the finding Events of every function (label "
                              "vmevents.io/finding), page by page, on a tick; watch: for a second at the end of a "
                              "tick, the findings resolved while it ran. Nothing else: no other object."),)),),
)
