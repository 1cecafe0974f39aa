"""Runtime versions and the minimum one each feature needs. Pure: data in, data out.

The guide (§5.3) gives every feature one minimum version of the Runtime and of the whole suite,
listed in its §6 table; a feature switched on under a Runtime older than that is refused before
anything on the node changes, with both versions named (issue 22, item 3).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

#: ``v{major}.{feature}.{iteration}`` (guide §4.1); a suffix (``-rc1``, ``+build``) is ignored.
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")

#: Feature (as ConfigService.GetFeatureState names it) → the oldest Runtime that has it. Guide
#: §5.3: "each new feature has a unified minimum version requirement for the Runtime and the
#: entire component suite", listed in §6. The text of §6 at hand gives no row past §4.2's floor:
#: the Runtime integrates with the open-source components from v1.13.0, so every feature the
#: v1.13.0 interface carries needs v1.13.0. A feature added later gets its own row with the
#: version that introduced it; one the table does not know has no minimum here (the Runtime
#: that lists it has it).
FEATURE_MINIMUM: Final[Mapping[str, str]] = {
    "device-injection": "v1.13.0",
    "sharing": "v1.13.0",
    "monitoring": "v1.13.0",
    "mig": "v1.13.0",
    "tdm": "v1.13.0",
    # SetPartitioning is in the v1.13.0 interface; the partition action asks for it.
    "partitioning": "v1.13.0",
}


def parse(version: str) -> tuple[int, int, int] | None:
    """``(major, feature, iteration)`` of a Runtime version; None when it is not one."""
    m = _VERSION.match(version.strip())
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


@dataclass(frozen=True)
class Unmet:
    """A feature the node's Runtime is too old for."""

    feature: str
    minimum: str


def unmet(
    runtime_version: str,
    features: Iterable[str],
    table: Mapping[str, str] = FEATURE_MINIMUM,
) -> list[Unmet]:
    """The features of ``features`` whose minimum ``runtime_version`` does not reach, in order.

    Guarantees: empty when the version cannot be read (an unknown version refuses nothing: the
    caller logs it) and for features the table does not know."""
    have = parse(runtime_version)
    if have is None:
        return []
    out = []
    for feature in features:
        need = parse(table.get(feature, ""))
        if need is not None and have < need:
            out.append(Unmet(feature, table[feature]))
    return out


def refusal(runtime_version: str, missing: list[Unmet]) -> str:
    """The message of a refusal, naming the node's Runtime version and each minimum."""
    needs = ", ".join(f"{u.feature} needs {u.minimum}" for u in missing)
    return (
        f"the node's Runtime is {runtime_version}, older than a feature to switch on needs "
        f"({needs}; guide §5.3, §6): upgrade the Runtime on this node, then run the action again"
    )
