"""``systemctl`` on a real node (installed at the node's /usr/local/bin/systemctl, standard library
only): ``restart|start|stop|is-active|status <unit>`` for the units the node's supervisor runs
(containerd, kubelet, runtime), through its control socket. ``daemon-reload``, ``enable`` and
``disable`` succeed and do nothing: the supervisor reads no unit files."""

from __future__ import annotations

import socket
import sys

CONTROL_SOCKET = "/run/lj-node/control.sock"
_NOOP = {"daemon-reload", "enable", "disable", "reset-failed"}


def ask(line: str, sock_path: str = CONTROL_SOCKET, timeout: float = 180.0) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        s.sendall(line.encode() + b"\n")
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode().strip()


def main(argv: list[str]) -> int:
    args = [a for a in argv[1:] if not a.startswith("-")]
    quiet = "-q" in argv or "--quiet" in argv
    if not args:
        print("usage: systemctl <restart|start|stop|is-active|status> <unit>", file=sys.stderr)
        return 2
    verb, units = args[0], [u.removesuffix(".service") for u in args[1:]]
    if verb in _NOOP:
        return 0
    if verb == "status":
        verb = "is-active"
    code = 0
    for unit in units:
        try:
            answer = ask(f"{verb} {unit}")
        except OSError as e:
            print(
                f"systemctl: node supervisor not reachable at {CONTROL_SOCKET}: {e}",
                file=sys.stderr,
            )
            return 1
        if verb == "is-active":
            if not quiet:
                print(answer)
            code = code or (0 if answer == "active" else 3)
        elif answer != "ok":
            print(f"systemctl {verb} {unit}: {answer}", file=sys.stderr)
            code = 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
