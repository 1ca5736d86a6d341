"""Prometheus' text exposition format 0.0.4, and the few metric types a function needs: counter, gauge,
histogram, a metric made at scrape time, and the process' own figures (https://prometheus.io/docs/instrumenting/
exposition_formats/).

Written here rather than with prometheus_client: its package imports its HTTP servers and push clients
(http.server, wsgiref, urllib.request, ssl: 30 modules, 1.2 MiB and 10 ms at every start, docs/metrics.md), where
a function serves its metrics through the app it already runs. tests/shared/test_metrics.py checks the text with
promtool, and a real Prometheus scrapes it (tests/monitoring/).
"""
from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[str, ...]
Sample = tuple[str, Labels, float]  # (name suffix, label values, value)


class _Cell:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0


class Family:
    """One metric: its name, help, type and label names; its series by label values."""

    kind = "untyped"

    def __init__(self, name: str, help_text: str, labels: Sequence[str]):
        self.name, self.help, self.labels = name, help_text, tuple(labels)
        self._cells: dict[Labels, _Cell] = {}
        self._lock = threading.Lock()

    def _cell(self, values: Labels) -> _Cell:
        cell = self._cells.get(values)
        if cell is None:
            if len(values) != len(self.labels):
                raise ValueError(f"{self.name} has labels {self.labels}, given {values}")
            cell = self._cells.setdefault(values, _Cell())
        return cell

    def samples(self) -> Iterator[Sample]:
        with self._lock:
            found = [(values, cell.value) for values, cell in self._cells.items()]
        for values, value in sorted(found):
            yield "", values, value

    def label_names(self, suffix: str) -> Labels:
        return self.labels

    def value(self, *values: str) -> float:
        """One series' value (0 when it has none): for tests and the benchmark."""
        cell = self._cells.get(tuple(values))
        return cell.value if cell else 0.0


class Counter(Family):
    kind = "counter"

    def inc(self, *values: str, amount: float = 1.0) -> None:
        with self._lock:
            self._cell(values).value += amount

    def bound(self, *values: str) -> Callable[[], None]:
        """`inc` of one series with its labels bound, made once (the hot path's counter: no tuple, no lookup)."""
        lock = self._lock
        with lock:
            cell = self._cell(tuple(values))

        def inc() -> None:
            with lock:
                cell.value += 1
        return inc

    def zero(self, *values: str) -> None:
        """Make the series exist at 0: a series born at 1 gives `increase()` nothing for its first count."""
        with self._lock:
            self._cell(values)


class Gauge(Family):
    kind = "gauge"

    def set(self, *values: str, value: float) -> None:
        with self._lock:
            self._cell(values).value = value


class Histogram(Family):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, labels: Sequence[str], buckets: Sequence[float]):
        super().__init__(name, help_text, labels)
        self.buckets = tuple(sorted(buckets))
        self._series: dict[Labels, list[float]] = {}  # per bucket (not cumulative), then +Inf, sum

    def observe(self, *values: str, value: float) -> None:
        with self._lock:
            series = self._series.get(values)
            if series is None:
                if len(values) != len(self.labels):
                    raise ValueError(f"{self.name} has labels {self.labels}, given {values}")
                series = self._series[values] = [0.0] * (len(self.buckets) + 2)
            index = next((i for i, bound in enumerate(self.buckets) if value <= bound), len(self.buckets))
            series[index] += 1
            series[-1] += value

    def samples(self) -> Iterator[Sample]:
        with self._lock:
            found = sorted((values, list(series)) for values, series in self._series.items())
        for values, series in found:
            running = 0.0
            for bound, count in zip((*self.buckets, math.inf), series[:-1], strict=True):
                running += count
                yield "_bucket", (*values, _number(bound)), running
            yield "_sum", values, series[-1]
            yield "_count", values, running

    def label_names(self, suffix: str) -> Labels:
        return (*self.labels, "le") if suffix == "_bucket" else self.labels


F = TypeVar("F", bound=Family)


@dataclass(frozen=True)
class Collected:
    """A metric made at scrape time (the findings' gauges, the process' figures)."""

    name: str
    help: str
    kind: str
    labels: Labels
    samples: tuple[tuple[Labels, float], ...]


class Registry:
    def __init__(self) -> None:
        self.families: dict[str, Family] = {}
        self.collectors: list[Callable[[], Iterable[Collected]]] = []

    def add(self, family: F) -> F:
        if family.name in self.families:
            raise ValueError(f"metric {family.name} is registered twice")
        self.families[family.name] = family
        return family

    def exposition(self) -> bytes:
        """Every metric in the text format (https://prometheus.io/docs/instrumenting/exposition_formats/)."""
        out: list[str] = []
        for family in self.families.values():
            _head(out, family.name, family.help, family.kind)
            for suffix, values, value in family.samples():
                out.append(f"{family.name}{suffix}{_labels(family.label_names(suffix), values)} {_number(value)}\n")
        for collect in self.collectors:
            for metric in collect():
                _head(out, metric.name, metric.help, metric.kind)
                for values, value in metric.samples:
                    out.append(f"{metric.name}{_labels(metric.labels, values)} {_number(value)}\n")
        return "".join(out).encode()


def _head(out: list[str], name: str, help_text: str, kind: str) -> None:
    out.append(f"# HELP {name} {help_text.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n")
    out.append(f"# TYPE {name} {kind}\n")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Labels, values: Labels) -> str:
    if not names:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in zip(names, values, strict=True)) + "}"


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if value != value:
        return "NaN"
    return str(int(value)) if value == int(value) and abs(value) < 2**53 else repr(value)


# -- the process -------------------------------------------------------------------------------------
def process_metrics(labels: Labels = (), values: Labels = ()) -> Iterable[Collected]:
    """The usual process_* figures (Prometheus' client libraries' names), from /proc/self, with `labels`; none off
    Linux."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        with open("/proc/self/statm", "rb") as statm:
            pages = statm.read().split()
        fds = len(os.listdir("/proc/self/fd"))
    except (OSError, IndexError):
        return ()
    ticks, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    cpu = (int(fields[11]) + int(fields[12])) / ticks   # utime, stime (proc(5) fields 14, 15)
    return (
        Collected("process_cpu_seconds_total", "User and system CPU time of the process, in seconds.", "counter",
                  labels, ((values, cpu),)),
        Collected("process_resident_memory_bytes", "Resident memory of the process, in bytes.", "gauge", labels,
                  ((values, int(pages[1]) * page),)),
        Collected("process_start_time_seconds", "When the process started, in seconds since the epoch.", "gauge",
                  labels, ((values, _STARTED),)),
        Collected("process_open_fds", "Open file descriptors of the process.", "gauge", labels, ((values, fds),)),
    )


_STARTED = time.time()  # this module is imported as the function starts
