"""What the local runtime prints while it runs: one line per event, decision, action and reply, relative to
the start. `make run` prints it, on the simulated cluster and against a real one alike."""
from __future__ import annotations

import json
import threading
import time

_print_lock = threading.Lock()


class Timeline:
    """Prints what happens, one line each, relative to the start: event → verdict → effect → reply. `TOTALS` adds up
    every timeline of the process, for the one-line summary `make run` and `make watch` end with."""

    TOTALS = {"answered": 0, "decided": 0, "replies": 0, "dead-lettered": 0, "retried": 0, "events": 0}

    def __init__(self):
        self.started = time.monotonic()
        self.irrelevant = 0
        self.repeats = 0
        self._seen: set[tuple] = set()

    @classmethod
    def summary(cls) -> str:
        t = cls.TOTALS
        return (f"{t['answered']} events answered ({t['answered'] - t['decided']} irrelevant), {t['decided']} "
                f"decisions, {t['replies']} replies, {t['events']} Kubernetes Events shown, {t['retried']} "
                f"deliveries retried, {t['dead-lettered']} dead-lettered")

    @classmethod
    def _count(cls, what: str) -> None:
        with _print_lock:
            cls.TOTALS[what] += 1

    def line(self, tag: str, text: str) -> None:
        with _print_lock:
            print(f"  {time.monotonic() - self.started:7.2f}s  {tag:<8} {text}", flush=True)

    def once(self, key: tuple, tag: str, text: str) -> None:
        """Print a decision the first time only: the same update arrives several times (duplicates,
        status churn), and each answer is the same."""
        if key in self._seen:
            self.repeats += 1
            return
        self._seen.add(key)
        self.line(tag, text)

    def on_delivery(self, delivery) -> None:
        if delivery.dead_lettered:
            self._count("dead-lettered")
            self.line("dead", f"{delivery.type} {delivery.subject or ''} → dead-letter sink")
        elif delivery.reply_type:
            self._count("replies")
            answering = "a tick" if delivery.type.endswith(".ping") else f"an update of {_short(delivery.subject)}"
            self.line("reply", f"{delivery.reply_type} back into the broker (answering {answering})")
        elif delivery.status is not None and delivery.status >= 300 or delivery.error:
            self._count("retried")
            self.line("retry", f"{delivery.trigger}: {delivery.status or delivery.error} for "
                               f"{_short(delivery.subject)}, the broker will redeliver")

    def on_log(self, function: str, line: str) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            if line.strip() and "[INFO]" not in line:
                self.line("log", f"{function}: {line.strip()}")
            return
        if not isinstance(record, dict) or "verdict" not in record:
            return
        self._count("answered")
        if record["verdict"] in ("irrelevant", "gone"):
            self.irrelevant += 1
            return
        self._count("decided")
        what = record["event_type"] or ""
        source = "tick" if what.endswith(".ping") else f"{what.rsplit('.', 1)[-1]} {_short(record['subject'])}"
        action = f" → {record['effect']}" if record["effect"] != "none" else ""
        self.once((function, record["subject"], record["verdict"], record["reason"]), "decide",
                  f"{function} [{source}] {record['verdict']}{action}: {record['reason']}")

    def on_kube_event(self, event: dict) -> None:
        involved = event["involvedObject"]
        if ("event", event["metadata"]["name"], event.get("count")) not in self._seen:
            self._count("events")
        self.once(("event", event["metadata"]["name"], event.get("count")), "Event",
                  f"{event['type']} {event['reason']} on {involved['kind']} {involved.get('namespace')}/"
                  f"{involved['name']}" + (f" (count {event['count']})" if event.get("count", 1) > 1 else ""))


def _short(subject: str | None) -> str:
    if not subject:
        return ""
    parts = subject.strip("/").split("/")
    return "/".join(parts[-3::2]) if "namespaces" in parts else subject
