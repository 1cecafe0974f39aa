"""lj-runtimekit-scheduler with one rule broken on purpose, for the harness's negative control:
TaintToleration ignores ``NoSchedule`` taints (``NoExecute`` ones still count). Run as a script
with the scheduler's own flags; everything else is the real scheduler."""

from __future__ import annotations

import sys
from dataclasses import replace

from lj_runtimekit_scheduler import __main__ as entry
from lj_runtimekit_scheduler.model import Node, Pod, Taint
from lj_runtimekit_scheduler.plugins import taint_toleration

_honest = taint_toleration.untolerated


def _ignoring_no_schedule(pod: Pod, node: Node) -> Taint | None:
    kept = tuple(t for t in node.taints if t.effect != "NoSchedule")
    return _honest(pod, replace(node, taints=kept))


taint_toleration.untolerated = _ignoring_no_schedule

if __name__ == "__main__":
    sys.exit(entry.main(sys.argv[1:]))
