"""What the scheduler tells about itself: metrics, per-task figures, traces and carbon totals.
May import holds, fleet, store, wire, rows and domain."""
