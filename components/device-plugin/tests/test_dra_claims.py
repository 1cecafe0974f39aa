"""Reading a ResourceClaim's allocation: the share id and consumed capacity of each result, and
the quantities the apiserver writes there (outside input: anything may arrive)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.dra.claims import claim_allocation, container_of, quantity

GIB = 1 << 30


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("30", 30),
        ("10Gi", 10 * GIB),
        ("1Mi", 1 << 20),
        ("80Gi", 80 * GIB),
        ("85899345920", 80 * GIB),
        ("10G", 10**10),
        ("1e3", 1000),
        ("1E3", 1000),
        ("0.5", 1),  # a fraction rounds up, as the allocator rounds a request up
        ("100m", 1),
        ("1.5Gi", 3 * GIB // 2),
        ("0", 0),
        ("-1", None),
        ("", None),
        ("ten", None),
        ("1Qi", None),
        ("9Ei", None),  # past 2^63
    ],
    ids=repr,
)
def test_quantities(text: str, value: int | None) -> None:
    assert quantity(text) == value


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_quantity_never_raises(text: str) -> None:
    got = quantity(text)
    assert got is None or 0 <= got < 2**63


def claim(results: list[Any]) -> Any:
    return {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def test_share_id_and_consumed_capacity_are_read_per_result() -> None:
    base = {"request": "gpu", "driver": "d", "pool": "p"}
    got = claim_allocation(
        claim(
            [
                {**base, "device": "gpu-0"},
                {
                    **base,
                    "device": "gpu-1",
                    "shareID": "7c5d0a3e-0000-4000-8000-000000000001",
                    "consumedCapacity": {"cores": "30", "memory": "10Gi", "odd": "lots"},
                },
                {**base, "device": "gpu-2", "shareID": None, "consumedCapacity": ["garbage"]},
            ]
        )
    )
    whole, share, garbled = got.results
    assert (whole.share_id, dict(whole.consumed)) == ("", {})
    assert share.share_id == "7c5d0a3e-0000-4000-8000-000000000001"
    assert dict(share.consumed) == {"cores": 30, "memory": 10 * GIB}  # unreadable ones left out
    assert (garbled.share_id, dict(garbled.consumed)) == ("", {})


def test_the_container_a_claim_serves() -> None:
    pod = {
        "spec": {
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"}],
            "containers": [
                {"name": "side"},
                {"name": "main", "resources": {"claims": [{"name": "gpus"}]}},
            ],
        },
        "status": {
            "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x1"}],
            "extendedResourceClaimStatus": {
                "resourceClaimName": "p-extended-resources-y2",
                "requestMappings": [
                    {"containerName": "side", "resourceName": "aliyun.com/gpu-core",
                     "requestName": "container-0-request-0"},
                ],
            },
        },
    }  # fmt: skip
    assert container_of(pod, "p-gpus-x1") == "main"
    # the claim a scheduler made for the pod's extended resources (KEP-5004, or ours)
    assert container_of(pod, "p-extended-resources-y2") == "side"
    assert container_of(pod, "other") == ""
