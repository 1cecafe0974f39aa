"""Every component entry point that takes a Kubernetes name refuses one with a trailing newline.

The checks are ``k8s_names`` (a shape file, anchored with ``\\Z``); a ``^…$`` pattern let
``"gpu\\n"`` through. Each case calls the component's own validator, with a valid name first so
that the refusal is the newline's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lj_runtimekit_controller import names as controller_names
from lj_runtimekit_controller import partition_layout as controller_layout
from lj_runtimekit_device_plugin import settings as device_plugin_settings
from lj_runtimekit_device_plugin.dra import cdi as device_plugin_cdi
from lj_runtimekit_device_plugin.errors import ConfigError as DevicePluginConfigError
from lj_runtimekit_device_plugin.model import Injection
from lj_runtimekit_job_agent import partition_layout as agent_layout
from lj_runtimekit_operator import policy as operator_policy
from lj_runtimekit_operator.errors import PolicyError
from lj_runtimekit_scheduler import settings as scheduler_settings
from lj_runtimekit_scheduler.errors import ConfigError


def _label_value_kept(value: str) -> None:
    # the controller hashes what is no label value rather than refusing it
    if controller_names.label_value(value) != value:
        raise ValueError(f"{value!r} is no label value")


def _policy(spec: dict[str, Any]) -> Callable[[], object]:
    obj = {"metadata": {"name": "suite", "uid": "u-1", "generation": 1}, "spec": spec}
    return lambda: operator_policy.parse(obj, "registry.example", "v1.14.0")


def _selector(key: str, value: str) -> dict[str, Any]:
    return {"components": {"exporter": {"nodeSelector": {key: value}}}}


def _cdi_annotation(key: str) -> object:
    # the device plugin's CDI spec of a claim: its annotation keys are Kubernetes qualified names
    injection = Injection(annotations=((key, "v"),))
    device = device_plugin_cdi.PreparedDevice("gpu", "node-a", "gpu-0", injection)
    return device_plugin_cdi.claim_spec("uid-1", [device], device_plugin_cdi.DEFAULT_KIND)


CASES: dict[str, tuple[Callable[[str], object], str, type[Exception]]] = {
    "controller label value": (_label_value_kept, "gpu", ValueError),
    "device plugin node label prefix": (
        lambda n: device_plugin_settings.Settings(node_label_prefix=n),
        "gpu.example.com",
        DevicePluginConfigError,
    ),
    "device plugin DRA driver name": (
        lambda n: device_plugin_settings.Settings(dra_driver_name=n),
        "gpu.example.com",
        DevicePluginConfigError,
    ),
    "device plugin CDI annotation key": (
        _cdi_annotation,
        "example.com/gpu",
        device_plugin_cdi.InvalidCDI,
    ),
    "controller layout name": (
        controller_layout.check_name,
        "a100-mig",
        controller_layout.LayoutError,
    ),
    "job agent layout name": (agent_layout.check_name, "a100-mig", agent_layout.LayoutError),
    "operator namespace": (
        lambda n: _policy({"namespace": n})(),
        "kube-system",
        PolicyError,
    ),
    "operator selector key": (
        lambda n: _policy(_selector(n, "yes"))(),
        "example.com/gpu",
        PolicyError,
    ),
    "operator selector value": (
        lambda n: _policy(_selector("gpu", n))(),
        "a100",
        PolicyError,
    ),
    "scheduler DRA driver name": (
        lambda n: scheduler_settings.Settings(dra_driver_name=n),
        "gpu.example.com",
        ConfigError,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_name_with_a_trailing_newline_is_refused(case: str) -> None:
    check, valid, error = CASES[case]
    check(valid)
    with pytest.raises(error):
        check(valid + "\n")
