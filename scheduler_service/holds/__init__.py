"""When work may start: cost holds (the signal), planned release of deferrable work, and slot
holds for fixed starts. May import fleet, store, wire, rows and domain."""
