"""The containerd config edit: add or remove the ``lj-runtime`` handler. Pure: text in, text out.

The handler block is placed right after the ``runtimes.nvidia`` section (with its sub-tables),
exactly as the guide shows. The edit is textual around the block so that every other byte, comment
and order stays as it was; tomlkit parses the file before and after, so a malformed file is refused
and a result that does not read back as the wanted handler is never returned.

``SystemdCgroup`` follows the node's own runc (:func:`node_systemd_cgroup`): runc with the systemd
cgroup driver on a cgroupfs node fails every container with ``expected cgroupsPath to be of format
"slice:prefix:name"``; the guide's ``true`` is right for its systemd nodes only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import tomlkit
from tomlkit.exceptions import TOMLKitError

from .errors import PermanentError

HANDLER: Final = "lj-runtime"
RUNTIME_TYPE: Final = "io.containerd.runc.v2"
CONTAINER_ANNOTATIONS: Final = ("xdm.amp.com*",)
BINARY_NAME: Final = "/usr/local/harp/kitC/xpu-container-runtime"
DROPIN_NAME: Final = "99-lj-runtime.toml"
#: The first line inside every block the agent writes: tells ours from an operator's own.
MARK: Final = "# written by lj-runtimekit-job-agent; its disable action removes it"
#: What containerd assumes when a runc runtime's options do not say (1.x and 2.x alike).
CONTAINERD_DEFAULT_SYSTEMD_CGROUP: Final = False

#: Where the CRI runtimes live, by config version (no ``version`` key means 1).
CRI_PLUGIN: Final = {
    1: "cri",
    2: "io.containerd.grpc.v1.cri",
    3: "io.containerd.cri.v1.runtime",
    4: "io.containerd.cri.v1.runtime",  # containerd 2.4's `config default` writes version 4
}

_HEADER = re.compile(
    r"^(?P<indent>[ \t]*)\[(?!\[)(?P<key>(?:\"[^\"]*\"|'[^']*'|[^\]\"'])+)\][ \t]*(#.*)?$"
)


class MalformedConfig(PermanentError):
    """The containerd config cannot be read as TOML or has an unexpected shape."""


@dataclass(frozen=True)
class Handler:
    """The handler's values as the guide writes them."""

    runtime_type: str = RUNTIME_TYPE
    container_annotations: tuple[str, ...] = CONTAINER_ANNOTATIONS
    binary_name: str = BINARY_NAME
    systemd_cgroup: bool = True

    def with_systemd_cgroup(self, value: bool) -> Handler:
        return Handler(self.runtime_type, self.container_annotations, self.binary_name, value)

    def as_table(self) -> dict[str, Any]:
        return {
            "runtime_type": self.runtime_type,
            "container_annotations": list(self.container_annotations),
            "options": {"BinaryName": self.binary_name, "SystemdCgroup": self.systemd_cgroup},
        }


def parse(text: str) -> dict[str, Any]:
    """The config as plain data; raises :class:`MalformedConfig` with the parser's reason.

    A leading UTF-8 byte order mark (an editor's, seen as U+FEFF) is not part of the TOML; the
    edits keep it where it is.
    """
    try:
        return tomlkit.parse(text.removeprefix("\ufeff")).unwrap()
    except (TOMLKitError, ValueError) as e:
        raise MalformedConfig(f"containerd config is not valid TOML: {e}") from e


def version_of(doc: dict[str, Any]) -> int:
    """The config's schema version: the ``version`` key, 1 when absent."""
    version = doc.get("version", 1)
    if version not in CRI_PLUGIN:
        raise MalformedConfig(f"containerd config version {version!r} unsupported (1 to 4)")
    return int(version)


def runtimes_path(version: int) -> tuple[str, ...]:
    return ("plugins", CRI_PLUGIN[version], "containerd", "runtimes")


def _dig(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = doc
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def handler_in(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The ``lj-runtime`` table of the parsed config, or None."""
    found = _dig(doc, (*runtimes_path(version_of(doc)), HANDLER))
    return found if isinstance(found, dict) else None


def _quote(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else f'"{key}"'


def _header_key(line: str) -> tuple[str, ...] | None:
    """The key path of a ``[table]`` header line, or None for any other line."""
    m = _HEADER.match(line.rstrip("\r\n"))
    if m is None:
        return None
    try:
        doc = tomlkit.parse(f"[{m['key']}]\n").unwrap()
    except (TOMLKitError, ValueError):
        return None
    path: list[str] = []
    node: Any = doc
    while isinstance(node, dict) and len(node) == 1:
        key = next(iter(node))
        path.append(key)
        node = node[key]
    return tuple(path)


def _is_content(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _block_end(lines: list[str], start: int, prefix: tuple[str, ...]) -> int:
    """Index after the last content line of the table at ``start`` and its sub-tables."""
    end = start + 1
    for i in range(start + 1, len(lines)):
        key = _header_key(lines[i])
        if key is not None and key[: len(prefix)] != prefix:
            break
        if _is_content(lines[i]):
            end = i + 1
    return end


def render_block(version: int, handler: Handler, indent: str = "") -> list[str]:
    """The handler's lines (each ending in a newline), in the guide's layout."""
    header = ".".join(_quote(k) for k in (*runtimes_path(version), HANDLER))
    annotations = ", ".join(f'"{a}"' for a in handler.container_annotations)
    inner = indent + "  "
    return [
        f"{indent}[{header}]\n",
        f"{inner}{MARK}\n",
        f'{inner}runtime_type = "{handler.runtime_type}"\n',
        f"{inner}container_annotations = [{annotations}]\n",
        f"{inner}[{header}.options]\n",
        f'{inner}  BinaryName = "{handler.binary_name}"\n',
        f"{inner}  SystemdCgroup = {'true' if handler.systemd_cgroup else 'false'}\n",
    ]


def _find(lines: list[str], key: tuple[str, ...]) -> int | None:
    for i, line in enumerate(lines):
        if _header_key(line) == key:
            return i
    return None


def _insertion_point(lines: list[str], version: int) -> tuple[int, str]:
    """Where the block goes: after runtimes.nvidia, else after the last runtime, else the end."""
    runtimes = runtimes_path(version)
    nvidia = _find(lines, (*runtimes, "nvidia"))
    if nvidia is not None:
        indent = _HEADER.match(lines[nvidia].rstrip("\r\n"))
        return _block_end(lines, nvidia, (*runtimes, "nvidia")), indent["indent"] if indent else ""
    last: int | None = None
    for i, line in enumerate(lines):
        key = _header_key(line)
        if key is not None and len(key) == len(runtimes) + 1 and key[:-1] == runtimes:
            last = i
    if last is not None:
        indent = _HEADER.match(lines[last].rstrip("\r\n"))
        prefix = _header_key(lines[last]) or ()
        return _block_end(lines, last, prefix), indent["indent"] if indent else ""
    end = max((i + 1 for i, line in enumerate(lines) if _is_content(line)), default=0)
    return end, ""


def without_handler(text: str) -> str:
    """``text`` with the ``lj-runtime`` block (and the blank line before it) removed.

    Guarantees: every other byte is kept; ``without_handler(with_handler(t)) == t`` for a
    ``t`` without the handler; a text without the handler comes back unchanged.
    """
    doc = parse(text)
    version = version_of(doc)
    if handler_in(doc) is None:
        return text
    key = (*runtimes_path(version), HANDLER)
    lines = text.splitlines(keepends=True)
    start = _find(lines, key)
    if start is None:
        raise MalformedConfig(
            f"the {HANDLER} handler is not written as its own [..runtimes.{HANDLER}] table; "
            "remove it by hand"
        )
    end = _block_end(lines, start, key)
    if start > 0 and not lines[start - 1].strip():
        start -= 1
    elif start > 0 and end == len(lines):
        # Appended to a file whose last line had no newline (see _insert): give it back as it was.
        lines[start - 1] = lines[start - 1].rstrip("\r\n")
    result = "".join(lines[:start] + lines[end:])
    if handler_in(parse(result)) is not None:
        raise MalformedConfig(f"the {HANDLER} handler is defined more than once; fix it by hand")
    return result


def _insert(text: str, block: list[str] | None, handler: Handler | None = None) -> str:
    """``text`` (without a handler) with ``block``, or ``handler`` rendered, at the handler's place.

    A rendered handler takes the indentation of the runtime it follows; a given block is kept
    byte for byte.
    """
    version = version_of(parse(text))
    lines = text.splitlines(keepends=True)
    # A file written on Windows (CRLF) gets CRLF lines from us too, so it stays one style.
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    at, indent = _insertion_point(lines, version)
    separator = [newline] if at > 0 else []
    if at > 0 and not lines[at - 1].endswith("\n"):
        # No blank line then: that tells without_handler to take this newline away again.
        lines[at - 1] += newline
        separator = []
    if block is None:
        rendered = render_block(version, handler or Handler(), indent if at > 0 else "")
        block = [line[:-1] + newline for line in rendered]
    return "".join(lines[:at] + separator + block + lines[at:])


def with_handler(text: str, handler: Handler | None = None) -> str:
    """``text`` with exactly one ``lj-runtime`` block holding ``handler``, after runtimes.nvidia.

    Guarantees: idempotent (a text that already holds the wanted handler comes back unchanged);
    a different ``lj-runtime`` block is replaced; every other byte is kept; the result parses and
    holds the wanted handler, else :class:`MalformedConfig`.
    """
    handler = handler or Handler()
    if handler_in(parse(text)) == handler.as_table():
        return text
    result = _insert(without_handler(text), None, handler)
    if handler_in(parse(result)) != handler.as_table():
        raise MalformedConfig(
            f"adding the {HANDLER} handler does not read back as written (does the config define "
            "runtimes inline?); add it by hand"
        )
    return result


def handler_block(text: str) -> str | None:
    """The ``lj-runtime`` block's own lines as written (with its sub-tables), or None."""
    doc = parse(text)
    if handler_in(doc) is None:
        return None
    key = (*runtimes_path(version_of(doc)), HANDLER)
    lines = text.splitlines(keepends=True)
    start = _find(lines, key)
    if start is None:
        return None
    block = lines[start : _block_end(lines, start, key)]
    if block and not block[-1].endswith("\n"):
        block[-1] += "\n"
    return "".join(block)


def is_ours(text: str) -> bool:
    """Whether the config's ``lj-runtime`` handler was written by the agent (absent: False).

    Ours carries :data:`MARK`; a block of an agent without the mark is recognised by its values.
    """
    block = handler_block(text)
    if block is None:
        return False
    if MARK in block:
        return True
    table = handler_in(parse(text))
    return table in (Handler().as_table(), Handler(systemd_cgroup=False).as_table())


def with_block(text: str, block: str) -> str:
    """``text`` with ``block`` (an operator's saved ``lj-runtime`` block) in the handler's place."""
    result = _insert(without_handler(text), block.splitlines(keepends=True))
    if handler_in(parse(result)) is None:
        raise MalformedConfig(f"the saved {HANDLER} block does not read back; restore it by hand")
    return result


def _systemd_of(doc: dict[str, Any]) -> bool | None:
    """SystemdCgroup of the runtime pods run with: the default runtime if runc-based, else runc."""
    if not doc:
        return None
    version = version_of(doc)
    runtimes = _dig(doc, runtimes_path(version))
    if not isinstance(runtimes, dict):
        return None
    default = _dig(doc, (*runtimes_path(version)[:-1], "default_runtime_name")) or "runc"
    for name in (default, "runc"):
        runtime = runtimes.get(name)
        if name == HANDLER or not isinstance(runtime, dict):
            continue
        if runtime.get("runtime_type", RUNTIME_TYPE) != RUNTIME_TYPE:
            continue
        value = _dig(runtime, ("options", "SystemdCgroup"))
        if isinstance(value, bool):
            return value
    return None


def node_systemd_cgroup(texts: list[str]) -> bool:
    """The node's runc cgroup driver: True for systemd, False for cgroupfs.

    ``texts`` are the main config then its imports in containerd's order (a later file overrides
    an earlier one, as containerd merges them). Read from the options of the default runtime when
    it is a runc one (else of ``runc``) in the CRI section (v1 ``cri``, v2
    ``io.containerd.grpc.v1.cri``, v3 ``io.containerd.cri.v1.runtime``); containerd's own default,
    False, when no file says.
    """
    found: bool | None = None
    for text in texts:
        value = _systemd_of(parse(text))
        if value is not None:
            found = value
    return CONTAINERD_DEFAULT_SYSTEMD_CGROUP if found is None else found


def imports_of(text: str, config_dir: str) -> list[str]:
    """The config's ``imports`` as absolute host paths or globs (relative ones: to its dir)."""
    imports = parse(text).get("imports") or []
    if not isinstance(imports, list):
        raise MalformedConfig(f"containerd config: imports must be a list, not {imports!r}")
    return [
        entry if entry.startswith("/") else f"{config_dir}/{entry}"
        for entry in imports
        if isinstance(entry, str)
    ]


def dropin_dir(text: str, config_dir: str) -> str | None:
    """The ``conf.d``-style directory the config imports (``imports = [".../*.toml"]``), or None."""
    imports = parse(text).get("imports") or []
    if not isinstance(imports, list):
        raise MalformedConfig(f"containerd config: imports must be a list, not {imports!r}")
    for entry in imports:
        if isinstance(entry, str) and entry.endswith("/*.toml"):
            directory = entry[: -len("/*.toml")]
            return directory if directory.startswith("/") else f"{config_dir}/{directory}"
    return None


def dropin_text(version: int, handler: Handler | None = None) -> str:
    """The whole drop-in file that carries the handler for a config of ``version``."""
    head = [] if version == 1 else [f"version = {version}\n", "\n"]
    return "".join(
        [
            "# Written by lj-runtimekit-job-agent; removed by its disable action.\n",
            *head,
            *render_block(version, handler or Handler()),
        ]
    )
