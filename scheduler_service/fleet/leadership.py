"""Whether this replica holds the leader lease: kept by Maintenance (its sign-of-life statement
takes or keeps the lease every interval), read by the work only the leader does (moving the
adaptive limits). Made before both, so neither is handed the other after construction."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Leadership:
    leading: bool = False
