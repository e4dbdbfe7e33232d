"""lowtide's gRPC protocol, shared by ``lowtide_client`` and the services.

- ``lowtide_proto.lowtide.v1`` and ``lowtide_proto.externalscaler``: the stubs generated from
  ``protos/`` by ``make proto`` (never edited by hand).
- ``lowtide_proto.durations``: "250ms" / "1h30m" durations and their protobuf form.
- ``lowtide_proto.backoff``: the jittered exponential ``Backoff`` of every retry and reconnect loop.
- ``lowtide_proto.channel``: ``Security`` and ``open_channel``, the channel (TLS, token, keepalive)
  every client opens.
"""
