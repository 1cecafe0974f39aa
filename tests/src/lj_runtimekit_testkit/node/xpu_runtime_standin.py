"""The stand-in ``xpu-container-runtime`` on a real node (installed at the node's
/usr/local/harp/kitC/xpu-container-runtime, standard library only).

containerd's ``lj-runtime`` handler runs it with runc's own command line. For ``create`` (and
``run``) it appends one JSON line to /var/log/xpu-container-runtime/records.jsonl: the container
id, the bundle's config.json annotations, the process env and the linux devices. Then it execs
runc with the same arguments, so the container runs as under runc.
"""

from __future__ import annotations

import json
import os
import sys
import time

RUNC = "/usr/local/bin/runc"
RECORDS = "/var/log/xpu-container-runtime/records.jsonl"
# runc's global flags that take a value (the command is the first word after them).
_VALUED = {"--root", "--log", "--log-format", "--criu", "--rootless"}


def command_of(argv: list[str]) -> tuple[str, list[str]]:
    """runc's command and what follows it."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in _VALUED:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return arg, argv[i + 1 :]
    return "", []


def bundle_of(rest: list[str]) -> str:
    for i, arg in enumerate(rest):
        if arg in ("--bundle", "-b") and i + 1 < len(rest):
            return rest[i + 1]
        if arg.startswith("--bundle="):
            return arg.split("=", 1)[1]
    return os.getcwd()


def record(argv: list[str]) -> None:
    command, rest = command_of(argv)
    if command not in ("create", "run"):
        return
    bundle = bundle_of(rest)
    entry: dict[str, object] = {
        "time": time.time(),
        "command": command,
        "id": rest[-1] if rest else "",
        "bundle": bundle,
        "argv": argv[1:],
    }
    try:
        with open(os.path.join(bundle, "config.json")) as f:
            config = json.load(f)
        entry["annotations"] = config.get("annotations", {})
        entry["env"] = config.get("process", {}).get("env", [])
        entry["devices"] = config.get("linux", {}).get("devices", [])
    except (OSError, ValueError) as e:
        entry["error"] = f"reading {bundle}/config.json: {e}"
    os.makedirs(os.path.dirname(RECORDS), exist_ok=True)
    fd = os.open(RECORDS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def main(argv: list[str]) -> None:
    try:
        record(argv)
    except OSError as e:  # the container still runs; the missing record shows in runc's log
        print(f"xpu-container-runtime stand-in: could not record: {e}", file=sys.stderr)
    os.execv(RUNC, [RUNC, *argv[1:]])


if __name__ == "__main__":
    main(sys.argv)
