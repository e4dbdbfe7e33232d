"""The signal service: the cost signal (grid carbon intensity or a power price) from a feed or an
operator, whether it is high, kept in PostgreSQL and pushed to every subscriber (issue 3)."""
