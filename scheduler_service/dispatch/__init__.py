"""The claim loop and the limits it applies: one dispatcher per replica claims work for the free
slots of its workers, within the adaptive concurrency limits. May import observe, holds, fleet,
store, wire, rows and domain."""
