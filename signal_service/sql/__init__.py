"""The signal service's named queries (queries.sql)."""
