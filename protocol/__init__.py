"""pipetrain.protocol: the host link protocol, shared by the RTL engine and the host.

:mod:`.wire` is the wire format (constants, frames, CRC, link sizes, payload codecs) and
:mod:`.device_model` the byte-exact Python model of the RTL link engine
(:mod:`pipetrain.hdl.link`). The host client is :mod:`pipetrain.host.client`; the specification
is ``docs/protocol.md``.
"""
