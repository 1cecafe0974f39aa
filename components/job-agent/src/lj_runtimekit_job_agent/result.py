"""The agent's result: JSON in the termination message (read by the controller) and an exit code."""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

#: Exit codes by result; the controller reads the reason from the termination message.
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_RUNTIME_UNAVAILABLE: Final = 3
EXIT_CONFIG_REFUSED: Final = 4
EXIT_CONTAINERD_NOT_BACK: Final = 5
#: The node's Runtime is older than a feature the action switches on needs (guide §5.3, §6).
EXIT_RUNTIME_TOO_OLD: Final = 6
#: Stopped by SIGTERM/SIGINT (128 + SIGINT), the code every daemon of the suite uses for a signal
#: that ends it before its work is done.
EXIT_INTERRUPTED: Final = 130

#: The kubelet keeps at most 4096 bytes of a termination message.
MAX_MESSAGE: Final = 4096


@dataclass(frozen=True)
class Result:
    """What the agent did on the node; ``reason`` is a CamelCase word, ``message`` for humans."""

    action: str
    node: str
    succeeded: bool
    reason: str
    message: str
    agent_version: str
    runtime_changed: bool = False
    containerd_changed: bool = False
    containerd_restarted: bool = False
    restart_was_pending: bool = False
    """An earlier run edited containerd's config but its restart was not confirmed."""
    containerd_files: tuple[str, ...] = ()
    """The host files this run wrote or removed."""
    systemd_cgroup: bool | None = None
    """The handler's SystemdCgroup (enable only)."""
    runtime_version: str = ""
    """The Runtime's version (DeviceService.GetVersion; else ConfigService's), asked first."""
    driver_version: str = ""
    """The driver stack's version as the Runtime reports it; empty from a Runtime before v1.14."""
    time: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    def to_json(self) -> str:
        """Compact JSON, cut to fit the kubelet's 4096-byte termination message limit."""
        data = asdict(self)
        text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        while len(text.encode()) > MAX_MESSAGE and data["message"]:
            data["message"] = data["message"][: len(data["message"]) // 2] + "…"
            text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        return text


def write(path: str, result: Result) -> None:
    """Write the result where the kubelet reads the termination message; best effort."""
    if not path:
        return
    # Without a writable termination log the exit code still carries the outcome.
    with contextlib.suppress(OSError):
        Path(path).write_text(result.to_json())
