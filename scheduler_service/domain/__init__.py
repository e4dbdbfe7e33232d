"""The scheduling decisions: pure functions of state and `now` over small frozen dataclasses.

Nothing in this package does I/O; it is tested without a database or a network. It imports
nothing of the service outside itself.
"""
