"""Counters, gauges and histograms, and their Prometheus text exposition (format 0.0.4), with no dependency.

A :class:`Registry` holds metrics; :meth:`Registry.render` writes all of them for ``GET /metrics``. Label values are
given positionally in the order of the metric's ``labels``. Everything here runs in the API process's event loop
(one thread), so there is no locking.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TypeVar

LabelValues = tuple[str, ...]
M = TypeVar("M", bound="Metric")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if value == int(value) and abs(value) < 2**53 else repr(value)


def _labels(names: Iterable[str], values: Iterable[str]) -> str:
    pairs = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True))
    return "{" + pairs + "}" if pairs else ""


class Metric(ABC):
    """One metric family: a name, help text, label names and one value (or histogram) per label combination."""

    kind = "untyped"

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> None:
        self.name = name
        self.help = help_text
        self.labels = labels

    def _key(self, values: tuple[str, ...]) -> LabelValues:
        if len(values) != len(self.labels):
            raise ValueError(f"metric {self.name} takes labels {self.labels}, got values {values}")
        return values

    @abstractmethod
    def lines(self) -> Iterator[str]:
        """The sample lines of this family (without HELP/TYPE)."""

    def render(self) -> str:
        head = f"# HELP {self.name} {_escape(self.help)}\n# TYPE {self.name} {self.kind}\n"
        return head + "".join(line + "\n" for line in self.lines())


class _Valued(Metric):
    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> None:
        super().__init__(name, help_text, labels)
        self._values: dict[LabelValues, float] = {}

    def get(self, *values: str) -> float:
        return self._values.get(self._key(values), 0.0)

    def total(self) -> float:
        """The sum over every label combination."""
        return sum(self._values.values())

    def samples(self) -> dict[LabelValues, float]:
        """Every label combination's value."""
        return dict(self._values)

    def lines(self) -> Iterator[str]:
        for key, value in sorted(self._values.items()):
            yield f"{self.name}{_labels(self.labels, key)} {_number(value)}"


class Counter(_Valued):
    """A value that only goes up."""

    kind = "counter"

    def inc(self, *values: str, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"counter {self.name} cannot decrease (amount {amount})")
        key = self._key(values)
        self._values[key] = self._values.get(key, 0.0) + amount

    def set_total(self, total: float, *values: str) -> None:
        """Mirror a count kept elsewhere (e.g. a replica's restarts); it must not go down."""
        key = self._key(values)
        if total < self._values.get(key, 0.0):
            raise ValueError(f"counter {self.name}{values} cannot go down to {total}")
        self._values[key] = total


class Gauge(_Valued):
    """A value set to what it is now; :meth:`clear` forgets label combinations that no longer exist."""

    kind = "gauge"

    def set(self, value: float, *values: str) -> None:
        self._values[self._key(values)] = value

    def clear(self) -> None:
        self._values.clear()


class Histogram(Metric):
    """Observations counted into cumulative buckets, with their sum and count."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = (),
                 buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        super().__init__(name, help_text, labels)
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"histogram {name} needs strictly increasing buckets, got {buckets}")
        self.buckets = buckets
        self._counts: dict[LabelValues, list[int]] = {}  # per bucket (not cumulative), then the +Inf overflow
        self._sums: dict[LabelValues, float] = {}

    def observe(self, value: float, *values: str) -> None:
        key = self._key(values)
        counts = self._counts.setdefault(key, [0] * (len(self.buckets) + 1))
        at = next((i for i, edge in enumerate(self.buckets) if value <= edge), len(self.buckets))
        counts[at] += 1
        self._sums[key] = self._sums.get(key, 0.0) + value

    def count(self, *values: str) -> int:
        return sum(self._counts.get(self._key(values), []))

    def total(self, *values: str) -> float:
        """The sum of the observations with these label values."""
        return self._sums.get(self._key(values), 0.0)

    def lines(self) -> Iterator[str]:
        for key, counts in sorted(self._counts.items()):
            running = 0
            for edge, n in zip((*self.buckets, math.inf), counts, strict=True):
                running += n
                le = _labels((*self.labels, "le"), (*key, _number(edge)))
                yield f"{self.name}_bucket{le} {running}"
            yield f"{self.name}_sum{_labels(self.labels, key)} {_number(self._sums[key])}"
            yield f"{self.name}_count{_labels(self.labels, key)} {running}"


class Registry:
    """The metrics of one process, rendered in registration order."""

    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}

    def add(self, metric: M) -> M:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is registered twice")
        self._metrics[metric.name] = metric
        return metric

    def render(self) -> str:
        return "".join(m.render() for m in self._metrics.values())
