"""The long-lived heap of a service process kept out of the cyclic garbage collector's full passes.

A started scheduler holds some 55,000 objects that live as long as the process: modules, the
generated protobuf classes, OpenTelemetry's instruments, the pools and parts built at start.
CPython's full (oldest-generation) collection walks every tracked object, and under a steady
load one runs every few seconds: each stopped the event loop for 20-140 ms here (up to 670 ms on
a busy machine), and every call in flight waited, the p99 of a steady 100 submits a second being
that pause. Frozen once the service has started, those objects are never walked again; what the
service allocates afterwards is collected as before.
"""

from __future__ import annotations

import gc


def freeze_started() -> None:
    """Collects what start-up left behind, then freezes every object alive now (gc.freeze): called
    once, when a service or worker process has started."""
    gc.collect()
    gc.freeze()
