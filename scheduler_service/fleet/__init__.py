"""Who is connected: worker sessions and their registry, worker leases, heartbeat deadlines and
whether this replica leads. May import store, wire, rows and domain."""
