"""The command line every LJ RuntimeKit daemon shares, by the Kubernetes component conventions.

Shape file (docs/shape.md): every component with a command line carries this file as ``cli.py``,
byte for byte; ``tests/shape_tests/test_drift.py`` fails when a copy differs from
``tests/shape_tests/canonical/cli.py``. Change the reference and copy it in the same commit.

A component's settings are one frozen dataclass; each field made by :func:`setting` (or by one of
the shared settings below) is one flag ``--<key-with-dashes>``, one environment variable
``LJ_RUNTIMEKIT_<COMPONENT>_<KEY>`` and one snake_case key of the ConfigMap file. The shared
settings keep the names, meaning and defaults operators know from kube-scheduler and the
controller-runtime managers; a component adds only the settings that are its own. Old spellings
live on for one feature version as :class:`Deprecated` aliases (guide §4.1).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "text", "json")
#: Values that were renamed: key → old value → new value (noted as deprecated when used).
RENAMED_VALUES: Mapping[str, Mapping[str, str]] = {"log_format": {"console": "text"}}
#: Go's strconv.ParseBool, as Kubernetes flags read booleans.
TRUE = ("1", "t", "T", "TRUE", "true", "True")
FALSE = ("0", "f", "F", "FALSE", "false", "False")


def setting(
    help: str,
    default: Any,
    *,
    choices: Sequence[str] = (),
    address: bool = False,
    shared: bool = False,
    kind: str = "",
) -> Any:
    """A settings field: ``help`` says unit, default and why; ``choices`` are checked at load;
    ``address`` marks a ``host:port``; ``shared`` one of the settings below; ``kind`` the
    loader's type when it is not the field's annotation (``"yaml"``: a list or map, parsed by
    the component)."""
    metadata = {
        "help": help,
        "choices": tuple(choices),
        "address": address,
        "shared": shared,
        "kind": kind,
    }
    return dataclasses.field(default=default, metadata=metadata)


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def env_name(prefix: str, key: str) -> str:
    return prefix + key.upper()


def parse_bool(raw: str) -> bool:
    if raw in TRUE:
        return True
    if raw in FALSE:
        return False
    raise ValueError(f"{raw!r} is not a boolean (true or false)")


def bind_address(value: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``; an empty host: every address) as (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{value!r}: expected host:port, e.g. 0.0.0.0:9501 or :9501")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r}: port {int(port)}: expected 0..65535")
    host = host.removeprefix("[").removesuffix("]")
    return host or "0.0.0.0", int(port)


def with_host(address: str, host: str) -> str:
    """``address`` with its host replaced (for a deprecated ``--listen-address``)."""
    port = address.rpartition(":")[2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def with_port(address: str, port: int) -> str:
    """``address`` with its port replaced (for a deprecated ``--port``)."""
    return f"{address.rpartition(':')[0]}:{port}"


# --- the shared settings: same name, meaning and default in every component -------------------


def kubeconfig() -> Any:
    return setting(
        "Path of a kubeconfig file; empty: the in-cluster ServiceAccount.", "", shared=True
    )


def kube_api_qps(default: float) -> Any:
    return setting(
        "Requests per second to the apiserver, on average (client-side).", default, shared=True
    )


def kube_api_burst(default: int) -> Any:
    return setting(
        "Requests to the apiserver allowed at once above --kube-api-qps.", default, shared=True
    )


def leader_elect() -> Any:
    return setting(
        "Take a coordination.k8s.io Lease before working, so one replica of several acts "
        "(--leader-elect=false for a single replica).",
        True,
        shared=True,
    )


def leader_elect_lease_duration() -> Any:
    return setting(
        "Seconds a follower waits, after it last saw the Lease record change, before it takes "
        "the Lease over (timed by its own clock: no clock agreement between replicas needed).",
        15.0,
        shared=True,
    )


def leader_elect_renew_deadline() -> Any:
    return setting(
        "Seconds the leader keeps trying to renew before it stops leading; shorter than the "
        "lease duration.",
        10.0,
        shared=True,
    )


def leader_elect_retry_period() -> Any:
    return setting("Seconds between tries to take or renew the Lease.", 2.0, shared=True)


def leader_elect_resource_namespace() -> Any:
    return setting("Namespace of the leader-election Lease.", "kube-system", shared=True)


def leader_elect_resource_name(default: str) -> Any:
    return setting("Name of the leader-election Lease.", default, shared=True)


def metrics_bind_address(default: str) -> Any:
    return setting(
        "host:port of the /metrics server, which also serves /healthz; port 0 picks a free one.",
        default,
        address=True,
        shared=True,
    )


def health_probe_bind_address() -> Any:
    return setting(
        "host:port of a second server for /healthz (probes); empty: only the metrics server "
        "serves it.",
        "",
        address=True,
        shared=True,
    )


def log_level() -> Any:
    return setting(
        "Log level: debug, info, warning or error.", "info", choices=LOG_LEVELS, shared=True
    )


def log_format() -> Any:
    return setting(
        "Log format: text, json, or auto (json when stderr is not a terminal, as in a pod).",
        "auto",
        choices=LOG_FORMATS,
        shared=True,
    )


@dataclass(frozen=True)
class Deprecated:
    """An old spelling of a setting, kept for one feature version with a warning naming the new.

    The old flag, environment variable and ConfigMap key all still work. ``part`` says what the
    old value was: ``""`` the whole new value, ``"host"``/``"port"`` one part of a bind address
    (the old ``--listen-address``/``--port`` pair), ``"not"`` the new boolean's inverse (an old
    ``--no-x`` switch). ``flag=False``: the old spelling was a ConfigMap key only, never a flag.
    """

    old: str
    new: str
    kind: str = "str"
    part: str = ""
    until: str = ""
    flag: bool = True

    def apply(self, current: Any, value: Any) -> Any:
        if self.part == "not":
            return not value
        if self.part == "host":
            return with_host(str(current), str(value))
        if self.part == "port":
            return with_port(str(current), int(value))
        return value


def _metavar(f: dataclasses.Field[Any]) -> str:
    if f.metadata.get("choices"):
        return "{" + ",".join(f.metadata["choices"]) + "}"
    if f.metadata.get("address"):
        return "HOST:PORT"
    return {"bool": "BOOL", "int": "INT", "float": "FLOAT"}.get(str(f.type), "STR")


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return "true" if default else "false"
    return '""' if default == "" else str(default)


def parser(
    prog: str,
    description: str,
    fields: Iterable[dataclasses.Field[Any]],
    *,
    env_prefix: str,
    version: str,
    deprecated: Sequence[Deprecated] = (),
) -> argparse.ArgumentParser:
    """The daemon's parser: every value is read as text and typed by the settings loader, so a
    bad flag, environment variable or ConfigMap key gets the same error naming key and value."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=f"{description}\n\nEvery flag --a-b also reads the environment variable "
        f"{env_prefix}A_B and the key a_b of the --config file; precedence: flag > environment "
        "> file > default.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"{prog} {version}")
    p.add_argument(
        "--config",
        metavar="FILE",
        help=f"ConfigMap YAML file (version: v1, snake_case keys) (default: none; env "
        f"{env_name(env_prefix, 'config')})",
    )
    own = p.add_argument_group(f"{prog} flags")
    shared = p.add_argument_group("shared Kubernetes-component flags (docs/shape.md)")
    for f in fields:
        names = [flag_name(f.name)]
        if f.name == "log_level":
            names.insert(0, "-v")
        extra: dict[str, Any] = {}
        if str(f.type) == "bool":
            extra = {"nargs": "?", "const": "true"}  # --flag, --flag=false, --flag false
        (shared if f.metadata.get("shared") else own).add_argument(
            *names,
            dest=f.name,
            metavar=_metavar(f),
            help=f"{f.metadata['help']} (default: {_shown(f.default)}; env "
            f"{env_name(env_prefix, f.name)})",
            **extra,
        )
    if deprecated:
        old = p.add_argument_group("deprecated spellings (each logs a warning naming the new)")
        for d in (d for d in deprecated if d.flag):
            switch: dict[str, Any] = {"nargs": "?", "const": "true"} if d.kind == "bool" else {}
            old.add_argument(
                flag_name(d.old),
                dest=d.old,
                metavar={"int": "INT", "float": "FLOAT", "bool": "BOOL"}.get(d.kind, "STR"),
                help=f"use {flag_name(d.new)} (removed in {d.until})",
                **switch,
            )
    return p
