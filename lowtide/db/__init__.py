"""PostgreSQL access shared by both services: a small connector over psycopg, named queries
loaded from `.sql` files, numbered migrations, and the embedded server for laptops.

Nothing outside this package imports psycopg.
"""

from lowtide.db.connector import CommittedUnread, Database, Transaction, statement_aborted
from lowtide.db.migrations import apply_migrations
from lowtide.db.queries import load_queries

__all__ = ["CommittedUnread", "Database", "Transaction", "apply_migrations", "load_queries", "statement_aborted"]
