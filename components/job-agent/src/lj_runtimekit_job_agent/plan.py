"""Which containerd files an action changes, and how. Pure: file texts in, changes out."""

from __future__ import annotations

import difflib
import posixpath
from collections.abc import Callable
from dataclasses import dataclass

from . import containerd_config as cc


@dataclass(frozen=True)
class FileChange:
    """One host file: its text before (None: absent) and after (None: removed)."""

    path: str
    before: str | None
    after: str | None

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                (self.before or "").splitlines(keepends=True),
                (self.after or "").splitlines(keepends=True),
                fromfile=self.path if self.before is not None else "/dev/null",
                tofile=self.path if self.after is not None else "/dev/null",
            )
        )


def plan(
    action: str,
    config_path: str,
    config_text: str | None,
    read: Callable[[str], str | None],
    new_config_version: int = 2,
) -> list[FileChange]:
    """The changes ``action`` needs; only files that really change are listed.

    When the main config imports a ``conf.d/*.toml`` directory, the handler lives in a drop-in
    there and the main file is only cleaned of an old in-place handler. ``read`` returns a host
    file's text (None when absent).
    """
    changes: list[FileChange] = []
    if config_text is None:
        if action == "enable":
            fresh = cc.with_handler(f"version = {new_config_version}\n")
            changes.append(FileChange(config_path, None, fresh))
        return changes
    dropin_dir = cc.dropin_dir(config_text, posixpath.dirname(config_path))
    if dropin_dir is None:
        if action == "enable":
            after = cc.with_handler(config_text)
        else:
            after = cc.without_handler(config_text)
        changes.append(FileChange(config_path, config_text, after))
    else:
        version = cc.version_of(cc.parse(config_text))
        dropin = posixpath.join(dropin_dir, cc.DROPIN_NAME)
        wanted = cc.dropin_text(version) if action == "enable" else None
        changes.append(FileChange(dropin, read(dropin), wanted))
        changes.append(FileChange(config_path, config_text, cc.without_handler(config_text)))
    return [c for c in changes if c.changed]
