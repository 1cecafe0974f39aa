"""The kubelet's device plugin API (mode device-plugin): one plugin per extended resource on its
own socket (:mod:`.plugins`, :mod:`.server`), ``Allocate`` through the Runtime (:mod:`.allocate`),
the scheduler's shared-GPU handshake (:mod:`.handshake`, :mod:`.assignment`, :mod:`.headroom`),
the injection annotations' check (:mod:`.annotations`) and vfio-pci devices (:mod:`.vfio`).

Imports only the node core above it, never :mod:`..dra`.
"""
