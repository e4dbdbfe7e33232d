"""`python -m soak`: lowtide's real services under a load of every kind of work and faults drawn
from a seed, with every promise checked during the run and at its end (docs/explanation/soak.md)."""
