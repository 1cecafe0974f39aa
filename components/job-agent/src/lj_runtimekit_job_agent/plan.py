"""Which containerd files an action changes, and how. Pure: file texts in, changes out."""

from __future__ import annotations

import difflib
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from . import containerd_config as cc

#: Beside the main config: an operator's own ``lj-runtime`` block that enable replaced, restored by
#: disable. Not ``.toml``, so that no ``imports`` glob ever loads it.
SAVED_SUFFIX: Final = ".lj-runtimekit.operator-handler"


@dataclass(frozen=True)
class FileChange:
    """One host file: its text before (None: absent) and after (None: removed).

    ``backup``: keep ``before`` as ``<path>.lj-runtimekit.bak`` — only when it holds no handler of
    ours, so the backup is always the operator's file as it was before the agent's enable.
    """

    path: str
    before: str | None
    after: str | None
    backup: bool = False

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


def _main(path: str, before: str, after: str) -> FileChange:
    return FileChange(path, before, after, backup=not cc.is_ours(before))


def _enable(
    config_path: str,
    text: str,
    read: Callable[[str], str | None],
    handler: cc.Handler,
) -> list[FileChange]:
    changes: list[FileChange] = []
    theirs = None if cc.is_ours(text) else cc.handler_block(text)
    if theirs is not None:
        saved_path = config_path + SAVED_SUFFIX
        changes.append(FileChange(saved_path, read(saved_path), theirs))
    dropin_dir = cc.dropin_dir(text, posixpath.dirname(config_path))
    if dropin_dir is None:
        changes.append(_main(config_path, text, cc.with_handler(text, handler)))
        return changes
    dropin = posixpath.join(dropin_dir, cc.DROPIN_NAME)
    version = cc.version_of(cc.parse(text))
    changes.append(FileChange(dropin, read(dropin), cc.dropin_text(version, handler)))
    changes.append(_main(config_path, text, cc.without_handler(text)))
    return changes


def _disable(config_path: str, text: str, read: Callable[[str], str | None]) -> list[FileChange]:
    changes: list[FileChange] = []
    dropin_dir = cc.dropin_dir(text, posixpath.dirname(config_path))
    if dropin_dir is not None:
        dropin = posixpath.join(dropin_dir, cc.DROPIN_NAME)
        changes.append(FileChange(dropin, read(dropin), None))
    saved_path = config_path + SAVED_SUFFIX
    saved = read(saved_path)
    after = text
    if cc.handler_block(text) is None or cc.is_ours(text):
        after = cc.without_handler(text)
        if saved is not None:
            after = cc.with_block(after, saved)
    # else: the operator put their own handler back since; it stays, and the saved copy goes.
    changes.append(FileChange(config_path, text, after))
    changes.append(FileChange(saved_path, saved, None))
    return changes


def plan(
    action: str,
    config_path: str,
    config_text: str | None,
    read: Callable[[str], str | None],
    new_config_version: int = 2,
    *,
    handler: cc.Handler | None = None,
) -> list[FileChange]:
    """The changes ``action`` needs, in the order to apply them; only real changes are listed.

    When the main config imports a ``conf.d/*.toml`` directory, the handler lives in a drop-in
    there and the main file is only cleaned of an old in-place handler. An operator's own
    ``lj-runtime`` block that enable replaces is saved first and put back by disable. ``read``
    returns a host file's text (None when absent).
    """
    handler = handler or cc.Handler()
    if config_text is None:
        if action != "enable":
            return []
        fresh = cc.with_handler(f"version = {new_config_version}\n", handler)
        return [FileChange(config_path, None, fresh)]
    if action == "enable":
        changes = _enable(config_path, config_text, read, handler)
    else:
        changes = _disable(config_path, config_text, read)
    return [c for c in changes if c.changed]
