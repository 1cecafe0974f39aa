"""DRA objects for the scheduler benchmarks on KWOK nodes: the suite's DeviceClasses as
deployed, a node's ResourceSlice in the shape the device plugin's DRA mode publishes, claims and
claim templates for whole GPUs, and pods that use them; and a node's slices with
``dra_partitions: dynamic`` (every GPU whole and as every MIG instance that could be made on it,
on one counter set per GPU).

The benchmarks may not import the device plugin (components stay independent), so the slice is
written here from the same rules: one pool per node named after it, one device per whole GPU named
``gpu-<index>``, the driver's attributes and the ``memory`` capacity.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

GROUP, VERSION = "resource.k8s.io", "v1"
API_VERSION = f"{GROUP}/{VERSION}"
DRIVER = "lj-runtimekit.aliyun.com"
GPU_CLASS = "gpu.lj-runtimekit.aliyun.com"
MIG_CLASS = "mig.lj-runtimekit.aliyun.com"
SHARE_CLASS = "gpu-share.lj-runtimekit.aliyun.com"
#: MIG profiles of an 80 GB GPU: (compute slices, GiB, how many fit).
MIG_PROFILES = ((1, 10, 7), (2, 20, 3), (3, 40, 2), (4, 40, 1), (7, 80, 1))
PLURALS = {
    "DeviceClass": "deviceclasses",
    "ResourceSlice": "resourceslices",
    "ResourceClaim": "resourceclaims",
    "ResourceClaimTemplate": "resourceclaimtemplates",
}
DEVICE_CLASSES = Path(__file__).resolve().parents[4] / "deploy/deviceplugin/05-deviceclasses.yaml"


def device_classes(path: Path = DEVICE_CLASSES) -> list[dict[str, Any]]:
    """The DeviceClasses of ``path`` (the suite's, as deployed); it must hold :data:`GPU_CLASS`."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    classes = [d for d in docs if d.get("kind") == "DeviceClass"]
    if not any(c["metadata"]["name"] == GPU_CLASS for c in classes):
        raise ValueError(f"{path} has no DeviceClass {GPU_CLASS}")
    return classes


def share_capacity(memory: str = "80Gi") -> dict[str, Any]:
    """The consumable capacity the driver gives a shareable GPU (``cores`` percent, ``memory``;
    a request naming neither takes all of both)."""
    return {
        "cores": {
            "value": "100",
            "requestPolicy": {
                "default": "100",
                "validRange": {"min": "1", "max": "100", "step": "1"},
            },
        },
        "memory": {
            "value": memory,
            "requestPolicy": {"default": memory, "validRange": {"min": "1Mi"}},
        },
    }


def gpu_slice(node: str, gpus: int = 8, *, shareable: bool = False) -> dict[str, Any]:
    """``node``'s ResourceSlice: ``gpus`` whole H800s (80 GiB) in NVLink islands of four;
    ``shareable``: each also takes shares (consumable capacity), as the driver publishes them."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "index": {"int": i},
                "runtimeDeviceID": {"string": f"gpu-{i}"},
                "uuid": {"string": f"GPU-{node}-{i:04d}"[:64]},
                "vendor": {"string": "NVIDIA"},
                "model": {"string": "H800"},
                "pciBusID": {"string": f"0000:{i % 256:02x}:00.0"},
                "numaNode": {"int": i // 4 % 2},
                "nvlinkIsland": {"int": i // 4},
                "pcieSwitch": {"int": i // 2},
                "computeCapability": {"version": "9.0.0"},
                "driverVersion": {"version": "550.54.15"},
                "runtimeVersion": {"version": "1.14.0"},
            },
            "capacity": share_capacity() if shareable else {"memory": {"value": "80Gi"}},
            **({"allowMultipleAllocations": True} if shareable else {}),
        }
        for i in range(gpus)
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-0"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _slice(node: str, index: int, count: int, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-{index}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
            **body,
        },
    }


def mig_slices(node: str, gpus: int = 8) -> list[dict[str, Any]]:
    """``node``'s slices with partitions on demand: per GPU the whole device and 14 MIG
    instances drawing on its counter set (7 compute slices, 80 GiB), 4 GPUs a slice (the API's
    64 devices when they consume counters), and the counter sets in a slice of their own."""
    per_gpu: list[list[dict[str, Any]]] = []
    for i in range(gpus):
        counters = f"gpu-{i}-counters"
        whole = {
            "name": f"gpu-{i}",
            "attributes": {"type": {"string": "gpu"}, "runtimeDeviceID": {"string": f"gpu-{i}"}},
            "capacity": {"memory": {"value": "80Gi"}},
            "consumesCounters": [
                {
                    "counterSet": counters,
                    "counters": {"compute-slices": {"value": "7"}, "memory": {"value": "80Gi"}},
                }
            ],
        }
        devices = [whole]
        for g, gb, fit in MIG_PROFILES:
            devices += [
                {
                    "name": f"gpu-{i}-mig-{g}g-{gb}gb-{k}",
                    "attributes": {
                        "type": {"string": "mig"},
                        "profile": {"string": f"{g}g.{gb}gb"},
                        "runtimeDeviceID": {"string": f"gpu-{i}"},
                    },
                    "capacity": {"memory": {"value": f"{gb}Gi"}},
                    "consumesCounters": [
                        {
                            "counterSet": counters,
                            "counters": {
                                "compute-slices": {"value": str(g)},
                                "memory": {"value": f"{gb}Gi"},
                            },
                        }
                    ],
                }
                for k in range(fit)
            ]
        per_gpu.append(devices)
    chunks = [[d for gpu in per_gpu[i : i + 4] for d in gpu] for i in range(0, gpus, 4)]
    sets = [
        {
            "name": f"gpu-{i}-counters",
            "counters": {"compute-slices": {"value": "7"}, "memory": {"value": "80Gi"}},
        }
        for i in range(gpus)
    ]
    set_chunks = [sets[i : i + 8] for i in range(0, gpus, 8)]
    count = len(chunks) + len(set_chunks)
    out = [_slice(node, n, count, {"devices": c}) for n, c in enumerate(chunks)]
    first = len(chunks)
    out += [_slice(node, first + n, count, {"sharedCounters": c}) for n, c in enumerate(set_chunks)]
    return out


def mig_claim_spec(profile: str = "1g.10gb") -> dict[str, Any]:
    """A claim's spec: one MIG instance of ``profile``."""
    expression = f'device.attributes["{DRIVER}"].profile == "{profile}"'
    exactly = {
        "deviceClassName": MIG_CLASS,
        "allocationMode": "ExactCount",
        "count": 1,
        "selectors": [{"cel": {"expression": expression}}],
    }
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def claim_spec(device_class: str = GPU_CLASS, count: int = 1) -> dict[str, Any]:
    """A claim's spec: ``count`` devices of ``device_class``."""
    exactly = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def share_claim_spec(cores: int, memory: str) -> dict[str, Any]:
    """A claim's spec: a share of one GPU, ``cores`` percent and ``memory`` of it."""
    exactly = {
        "deviceClassName": SHARE_CLASS,
        "allocationMode": "ExactCount",
        "count": 1,
        "capacity": {"requests": {"cores": str(cores), "memory": memory}},
    }
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def resource_claim(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": spec,
    }


def claim_template(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": spec},
    }


def use_claim(pod: dict[str, Any], source: dict[str, str]) -> dict[str, Any]:
    """``pod`` with the pod claim ``gpu`` from ``source`` (``resourceClaimName`` or
    ``resourceClaimTemplateName``), used by its first container."""
    pod["spec"]["resourceClaims"] = [{"name": "gpu", **source}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return pod


def create(api: client.ApiClient, body: dict[str, Any], namespace: str | None = None) -> None:
    """Create a ``resource.k8s.io`` object (cluster-scoped without ``namespace``)."""
    custom: Any = client.CustomObjectsApi(api)
    plural = PLURALS[body["kind"]]
    if namespace is None:
        custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
    else:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)


@contextlib.contextmanager
def suite_device_classes(api_client: Callable[[], Any]) -> Iterator[None]:
    """The suite's DeviceClasses while the block runs; those it made (not those that existed)
    are deleted after it, so that other tests of the session meet no extended-resource mapping
    (``aliyun.com/gpu`` served by DRA). ``api_client``: a fresh client per use (a context)."""
    made: list[str] = []
    try:
        with api_client() as api:
            for device_class in device_classes():
                try:
                    create(api, device_class)
                    made.append(device_class["metadata"]["name"])
                except ApiException as e:
                    if e.status != 409:
                        raise
        yield
    finally:
        with api_client() as api:
            custom: Any = client.CustomObjectsApi(api)
            for name in made:
                try:
                    custom.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", name)
                except ApiException as e:
                    if e.status != 404:
                        raise


def delete_claims(api: client.ApiClient, namespace: str, deadline_s: float = 300.0) -> bool:
    """Delete the namespace's claims, generated or not, and wait until they are gone (their
    devices free again); False when some are left at the deadline."""
    custom: Any = client.CustomObjectsApi(api)
    custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims")
    end = time.monotonic() + deadline_s
    while True:
        left = custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "resourceclaims", limit=1
        )
        if not left["items"]:
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.5)
