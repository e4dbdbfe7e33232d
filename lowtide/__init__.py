"""lowtide: a cost-aware task scheduler (CLI, configuration and what both services share)."""
