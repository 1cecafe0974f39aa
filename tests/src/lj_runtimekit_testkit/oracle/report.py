"""One run of generated cases and what it found, printed so a failure can be reproduced."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from lj_runtimekit_testkit.oracle.generate import COMPARED, generate_many
from lj_runtimekit_testkit.oracle.judge import BOUND, Finding
from lj_runtimekit_testkit.oracle.runner import CaseResult, Harness


@dataclass
class Report:
    seed: int
    count: int
    families: tuple[str, ...]
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.results for f in r.findings]

    def verdicts(self) -> Counter[str]:
        """How the kube-scheduler copies (or ours, in GPU cases) ended: bound, refused, ..."""
        out: Counter[str] = Counter()
        for r in self.results:
            first = r.observed[0] if r.observed else None
            out[first.verdict if first else "none"] += 1
        return out

    def refusal_kinds(self) -> Counter[str]:
        """The reasons seen in refusals (kube-scheduler's words): what the run exercised."""
        out: Counter[str] = Counter()
        for r in self.results:
            for o in r.observed[:1]:
                if o.refusal is not None and o.verdict != BOUND:
                    out.update(o.refusal.counts.keys() or [o.refusal.pod_level or "?"])
        return out

    def text(self, limit: int = 10) -> str:
        lines = [
            f"oracle: seed {self.seed}, {self.count} cases, families {','.join(self.families)}: "
            f"{len(self.findings)} findings in {self.seconds:.0f} s",
            f"  verdicts: {dict(self.verdicts())}",
            f"  findings by kind: {dict(Counter(f.what for f in self.findings))}",
        ]
        for f in self.findings[:limit]:
            lines.append(f.report())
        if len(self.findings) > limit:
            lines.append(f"... and {len(self.findings) - limit} more findings")
        return "\n".join(lines)


def run(
    harness: Harness,
    seed: int,
    count: int,
    families: tuple[str, ...] = COMPARED,
    *,
    start: int = 0,
    only: Sequence[int] = (),
    progress: bool = False,
) -> Report:
    """Generate and run ``count`` cases of ``seed`` from ``start`` (or just ``only``)."""
    from lj_runtimekit_testkit.oracle.generate import generate

    t0 = time.monotonic()
    cases = (
        [generate(seed, i, families) for i in only]
        if only
        else generate_many(seed, count, families, start)
    )
    report = Report(seed, len(cases), families)

    def done(batch: list[CaseResult]) -> None:
        report.results.extend(batch)
        if progress:
            n = len(report.results)
            print(
                f"oracle: {n}/{len(cases)} cases, {len(report.findings)} findings, "
                f"{time.monotonic() - t0:.0f} s",
                flush=True,
            )

    harness.run_cases(cases, on_batch=done)
    report.seconds = time.monotonic() - t0
    return report
