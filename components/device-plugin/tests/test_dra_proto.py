"""The vendored kubelet DRA and plugin registration APIs keep the kubelet's wire names and numbers
(a real kubelet calls these exact method paths and reads these field numbers)."""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor

from lj_runtimekit_interface.dra.v1 import api_pb2 as dra
from lj_runtimekit_interface.dra.v1beta1 import api_pb2 as beta
from lj_runtimekit_interface.pluginregistration.v1 import api_pb2 as reg


def _fields(message: Descriptor) -> dict[str, int]:
    return {f.name: f.number for f in message.fields}


def test_dra_service_paths() -> None:
    service = dra.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert service.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]


def test_dra_field_numbers() -> None:
    assert _fields(dra.Claim.DESCRIPTOR) == {"namespace": 1, "uid": 2, "name": 3}
    assert _fields(dra.Device.DESCRIPTOR) == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert _fields(dra.NodePrepareResourceResponse.DESCRIPTOR) == {"devices": 1, "error": 2}
    assert _fields(dra.NodeUnprepareResourceResponse.DESCRIPTOR) == {"error": 1}
    assert _fields(dra.NodePrepareResourcesRequest.DESCRIPTOR) == {"claims": 1}
    assert _fields(dra.NodeUnprepareResourcesRequest.DESCRIPTOR) == {"claims": 1}
    response = dra.NodePrepareResourcesResponse(
        claims={"uid-1": dra.NodePrepareResourceResponse(error="x")}
    )
    assert response.claims["uid-1"].error == "x"


def test_registration_paths_and_fields() -> None:
    service = reg.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    assert _fields(reg.PluginInfo.DESCRIPTOR) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert _fields(reg.RegistrationStatus.DESCRIPTOR) == {"plugin_registered": 1, "error": 2}


def test_dra_v1beta1_is_v1_without_the_share_id() -> None:
    service = beta.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert service.full_name == "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    v1_device = {n: f for n, f in _fields(dra.Device.DESCRIPTOR).items() if n != "share_id"}
    assert _fields(beta.Device.DESCRIPTOR) == v1_device
    for name in ("Claim", "NodePrepareResourceResponse", "NodeUnprepareResourceResponse"):
        v1 = dra.DESCRIPTOR.message_types_by_name[name]
        assert _fields(beta.DESCRIPTOR.message_types_by_name[name]) == _fields(v1)
