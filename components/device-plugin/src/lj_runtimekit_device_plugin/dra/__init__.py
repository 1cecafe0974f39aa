"""Dynamic Resource Allocation (mode dra, docs/dra.md): what the node offers (:mod:`.offers`) and
its ResourceSlices (:mod:`.slices`, written by :mod:`.publish`); the kubelet's DRA plugin
(:mod:`.plugin`) preparing claims (:mod:`.prepare` over the pure :mod:`.plan`, :mod:`.claims`,
:mod:`.cdi`, :mod:`.checkpoint`, partitions on demand through :mod:`.runtime_partitions`); the
NRI plugin (:mod:`.nri` over :mod:`.ttrpc`) adding the annotations CDI leaves out
(:mod:`.cdi_annotations`).

Imports only the node core above it, never :mod:`..deviceplugin`.
"""
