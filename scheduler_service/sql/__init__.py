"""The scheduler's named queries (lowtide.db.load_queries reads them); no Python here."""
