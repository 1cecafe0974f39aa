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
#: partition: live allocations hold GPUs that must change (waited for, still held), or the
#: Runtime refused a change for one; nothing more was changed.
EXIT_BUSY: Final = 7
#: partition: the layout does not fit this node (a GPU it lacks, a mode or memory the GPU does
#: not have, vfio-pci without SetDeviceBinding), or is no layout; nothing was changed.
EXIT_LAYOUT_REFUSED: Final = 8
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
    layout: str = ""
    """partition: the layout's name."""
    layout_digest: str = ""
    """partition: the layout's content hash (Layout.digest)."""
    devices_changed: tuple[str, ...] = ()
    """partition: the GPUs this run changed, by id."""
    devices_waited: tuple[str, ...] = ()
    """partition: the GPUs the change must find free (every GPU it changes), by id; on exit 7
    the controller fences them from new pods until the change is done (docs/partitioning.md)."""
    blocked_by: tuple[str, ...] = ()
    """partition, exit 7: ``gpu-0 by ns/pod/container (allocation id)`` per blocking allocation."""
    time: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    def to_json(self) -> str:
        """Compact JSON, cut to fit the kubelet's 4096-byte termination message limit: the
        message first (down to a short head), then the longest list, each cut list ending with
        how many items it left out."""
        data = asdict(self)
        dropped = dict.fromkeys(_LISTS, 0)
        text = _dumps(data)
        while len(text.encode()) > MAX_MESSAGE:
            cuttable = [k for k in _LISTS if any(not i.startswith("… ") for i in data[k])]
            if len(data["message"]) > _MESSAGE_HEAD or not cuttable:
                if not data["message"]:
                    break  # nothing left to cut
                data["message"] = data["message"][: len(data["message"]) // 2] + "…"
            else:
                longest = max(cuttable, key=lambda k: len(_dumps(data[k])))
                items = [i for i in data[longest] if not i.startswith("… ")]
                keep = len(items) // 2
                dropped[longest] += len(items) - keep
                data[longest] = [*items[:keep], f"… {dropped[longest]} more"]
            text = _dumps(data)
        return text


#: The list fields :meth:`Result.to_json` may cut, and the message length it cuts to first.
_LISTS = ("containerd_files", "devices_changed", "devices_waited", "blocked_by")
_MESSAGE_HEAD = 512


def _dumps(data: object) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def write(path: str, result: Result) -> None:
    """Write the result where the kubelet reads the termination message; best effort."""
    if not path:
        return
    # Without a writable termination log the exit code still carries the outcome.
    with contextlib.suppress(OSError):
        Path(path).write_text(result.to_json())
