"""FailedScheduling messages of both schedulers, parsed into counts per reason.

kube-scheduler (``FitError.Error``)::

    0/12 nodes are available: 1 Insufficient cpu, 3 node(s) were unschedulable, 8 node(s)
    didn't match Pod's node affinity/selector. preemption: 0/12 nodes are available: ...

reasons sorted as strings, one node counted once per reason (a node short of cpu and memory
counts under both), then whatever PostFilter (preemption) adds; a PreFilter refusal replaces the
list with its own message. lj-runtimekit-scheduler writes the same shape with the plugin's name
before each reason, the reasons by count, at most eight of them (then "and K other reasons"), a
node short of several resources as one entry (``1 NodeResourcesFit: Insufficient cpu,
Insufficient memory``), and a pod-level refusal as ``Plugin: message`` alone.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from lj_runtimekit_testkit.oracle import checker

_HEAD = re.compile(r"^0/(\d+) nodes are available: ")
_COUNTED = re.compile(r"^(\d+) (.*)$", re.DOTALL)
_PLUGIN = re.compile(r"^([A-Z][A-Za-z]+): (.*)$", re.DOTALL)
_MORE = re.compile(r"^and (\d+) other reasons?$")
SCHEDULING_GATED = "SchedulingGated"


@dataclass(frozen=True)
class Refusal:
    """One scheduler's word that a pod fits nowhere."""

    raw: str
    nodes: int | None = None
    """N of "0/N nodes are available" (None: a message without it)."""
    counts: Counter[str] = field(default_factory=Counter)
    """kube-scheduler's reason text → nodes refused for it."""
    plugins: dict[str, str] = field(default_factory=dict)
    """Reason text → the plugin our scheduler named for it (ours only)."""
    pod_level: str | None = None
    """A refusal of the pod itself (PreFilter), without a count per node."""
    pod_level_plugin: str | None = None
    more: int = 0
    """Distinct reasons our scheduler left out of the message ("and K other reasons")."""
    gated: bool = False


def split_top(text: str, sep: str = ", ") -> list[str]:
    """``text`` split at ``sep`` outside brackets (a reason may list devices in parentheses)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _body(message: str) -> tuple[int | None, str]:
    """(N, the reasons part without its final period and without what PostFilter added)."""
    m = _HEAD.match(message)
    if m is None:
        return None, message
    rest = message[m.end() :]
    depth = 0
    for i, ch in enumerate(rest):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "." and depth == 0 and (i + 1 == len(rest) or rest[i + 1] == " "):
            return int(m.group(1)), rest[:i]
    return int(m.group(1)), rest


def parse_kube(message: str, condition_reason: str = "Unschedulable") -> Refusal:
    """kube-scheduler's PodScheduled=False message (or FailedScheduling note)."""
    if condition_reason == SCHEDULING_GATED:
        return Refusal(message, gated=True)
    nodes, body = _body(message)
    counts: Counter[str] = Counter()
    tokens = split_top(body)
    parsed = [_COUNTED.match(t) for t in tokens]
    if nodes is not None and all(parsed):
        for m in parsed:
            assert m is not None
            counts[m.group(2)] += int(m.group(1))
        return Refusal(message, nodes, counts)
    return Refusal(message, nodes, pod_level=body)


def parse_ours(message: str) -> Refusal:
    """lj-runtimekit-scheduler's FailedScheduling note, in kube-scheduler's terms."""
    nodes, body = _body(message)
    if nodes is None:
        m = _PLUGIN.match(message)
        plugin, text = (m.group(1), m.group(2)) if m else (None, message)
        gated = plugin == "SchedulingGates"
        return Refusal(message, pod_level=text, pod_level_plugin=plugin, gated=gated)
    counts: Counter[str] = Counter()
    plugins: dict[str, str] = {}
    more, last_count, last_plugin = 0, 0, ""
    for token in split_top(body):
        if (m := _MORE.match(token)) is not None:
            more = int(m.group(1))
            continue
        counted = _COUNTED.match(token)
        if counted is not None:
            last_count, text = int(counted.group(1)), counted.group(2)
            named = _PLUGIN.match(text)
            last_plugin, text = (named.group(1), named.group(2)) if named else ("", text)
        else:  # another reason of the same nodes (NodeResourcesFit: Insufficient a, Insufficient b)
            text = token
        counts[text] += last_count
        plugins[text] = last_plugin
    return Refusal(message, nodes, counts, plugins, more=more)


KIND_OF_PLUGIN_REASON = {
    checker.NODE_NAME: "NodeName",
    checker.UNSCHEDULABLE: "NodeUnschedulable",
    checker.AFFINITY: "NodeAffinity",
    checker.PREFILTERED: "NodeAffinity",
    checker.AFFINITY_CONFLICT: "NodeAffinity",
    checker.PORTS: "NodePorts",
    checker.UNTOLERATED: "TaintToleration",
    checker.TOO_MANY_PODS: "NodeResourcesFit",
}


def kind(reason: str) -> str:
    """The kube-scheduler plugin a reason text belongs to ("?" for one unknown here)."""
    if reason in KIND_OF_PLUGIN_REASON:
        return KIND_OF_PLUGIN_REASON[reason]
    if reason.startswith("node(s) had untolerated taint "):
        return "TaintToleration"
    if reason.startswith("Insufficient "):
        return "NodeResourcesFit"
    return "?"


def kinds(counts: Counter[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for reason, n in counts.items():
        out[kind(reason)] += n
    return out
