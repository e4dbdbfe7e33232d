"""Typed rows: what the store's queries return, as frozen dataclasses whose fields are the
queries' columns (filled by psycopg's `class_row` through `Database.fetch_as`). Above the store
nothing indexes a dict; a column added to a query is a field added here. May import domain only."""
