"""Metric families and their exposition: Prometheus text 0.0.4 and OpenMetrics 1.0, pure.

A scrape of 64 devices renders thousands of samples whose labels repeat per device; a
:class:`LabelSet` is cleaned (:func:`naming.label_value`) and escaped once per device and reused
by every family, which is what keeps a scrape cheap. ``Family.build()`` gives the same samples as
client_python metric families, so a test can check both renderings parse to the same series.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from . import naming
from .naming import Metric as Spec

OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
EOF = b"# EOF\n"


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class LabelSet:
    """Label values, cleaned and bounded, with their rendered ``name="value"`` text."""

    __slots__ = ("names", "text", "values")

    def __init__(self, names: tuple[str, ...], raw: Iterable[object]) -> None:
        values = tuple(naming.label_value(v) for v in raw)
        if len(values) != len(names):
            raise ValueError(f"labels {names} got {len(values)} values")
        self.names = names
        self.values = values
        pairs = zip(names, values, strict=True)
        self.text = ",".join(f'{n}="{_escape_label(v)}"' for n, v in pairs)

    def extend(self, names: tuple[str, ...], raw: Iterable[object]) -> LabelSet:
        more = LabelSet(names, raw)
        joined = LabelSet.__new__(LabelSet)
        joined.names = self.names + more.names
        joined.values = self.values + more.values
        joined.text = ",".join(t for t in (self.text, more.text) if t)
        return joined


class Family:
    """Samples of one metric family, unique by label values (the first one wins)."""

    __slots__ = ("dropped", "samples", "spec")

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.samples: dict[str, tuple[LabelSet, float]] = {}
        self.dropped = 0
        """Readings left out because they cannot be true (see :meth:`add`)."""

    def add(
        self, labels: LabelSet | tuple[object, ...], raw: float | None, limit: float | None = None
    ) -> None:
        """Adds a sample unless its value cannot be true (NaN, ±inf, negative, above the
        metric's maximum or above ``limit``): that one is counted in ``dropped`` instead.
        ``None`` means "not measured" and is neither added nor counted."""
        if raw is None:
            return
        value = naming.sample_value(self.spec, raw, limit)
        if value is None:
            self.dropped += 1
            return
        ls = labels if isinstance(labels, LabelSet) else LabelSet(self.spec.labels, labels)
        if ls.names != self.spec.labels:
            raise ValueError(f"{self.spec.name}: labels {ls.names} != {self.spec.labels}")
        self.samples.setdefault(ls.text, (ls, value))

    def build(self) -> Metric:
        """The same samples as a client_python metric family."""
        family: GaugeMetricFamily | CounterMetricFamily
        labels = list(self.spec.labels)
        if self.spec.kind == "counter":
            family = CounterMetricFamily(self.spec.name, self.spec.help, labels=labels)
        else:
            family = GaugeMetricFamily(self.spec.name, self.spec.help, labels=labels)
        for ls, value in self.samples.values():
            family.add_metric(list(ls.values), value)
        return family


def _value(v: float) -> str:
    return str(int(v)) + ".0" if v.is_integer() and abs(v) < 1e15 else repr(v)


def render(families: Iterable[Family], openmetrics: bool) -> bytes:
    """The exposition of ``families`` (families without samples are left out), no ``# EOF``."""
    lines: list[str] = []
    for fam in families:
        if not fam.samples:
            continue
        spec = fam.spec
        sample = spec.exposed
        meta = spec.name if openmetrics else sample
        lines.append(f"# HELP {meta} {_escape_help(spec.help)}")
        lines.append(f"# TYPE {meta} {spec.kind}")
        lines.extend(
            f"{sample}{{{ls.text}}} {_value(v)}" if ls.text else f"{sample} {_value(v)}"
            for ls, v in fam.samples.values()
        )
    if not lines:
        return b""
    lines.append("")
    return "\n".join(lines).encode()


def wants_openmetrics(accept: str) -> bool:
    """Whether the scraper's Accept header asks for OpenMetrics (as client_python decides)."""
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if media == "application/openmetrics-text":
            versions = [p.split("=", 1)[1] for p in params if p.startswith("version=")]
            if not versions or versions[0] in ("1.0.0", "0.0.1"):
                return True
    return False
