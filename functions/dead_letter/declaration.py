"""dead-letter, declared once (shared/declaration.py): deploy/base/dead-letter.yaml, the chart's values and
README's table are generated from it. Every other function's Trigger sends it what it could not deliver."""
from shared.declaration import Function, Resources, Scale, Service

DECLARATION = Function(
    name="dead-letter",
    summary="logs every event the broker could not deliver after its retries",
    about="Where the broker puts an event that every retry failed to deliver: it logs the event as one JSON line "
          "(with the delivery error the broker attached) so no finding or action is lost silently.",
    service=Service(
        name="vmevents-dead-letter",
        scale=Scale(0, 1, "Dead letters are rare and only logged: zero pods when there are none, one is plenty."),
        concurrency_why="= THREADS in the image: one request per gunicorn thread.",
        no_account_why="It calls no Kubernetes API: no ServiceAccount of its own, and no token mounted at all.",
        resources=Resources("10m", "80Mi", "128Mi",
                            "Measured from the image: 64 MiB RSS idle (gunicorn master + worker, bench/image.py), "
                            "what a no-op function costs: it imports no Kubernetes client. Request 80Mi = the measure "
                            "plus a quarter; limit 128Mi: it holds one event of at most 256 KiB at a time.")),
)
