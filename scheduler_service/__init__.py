"""The scheduler service: task queue, worker streams, dispatch and maintenance.

One package per mechanism, each importing only the packages below it, from the bottom: domain,
rows, store (and its sql), wire, fleet, holds, observe, dispatch, workers and tasks, api; the
root (server, composition, maintenance) on top. docs/architecture/layout.md has the map and
the table of former module paths; tests/unit/test_packages.py keeps the rules.
"""
