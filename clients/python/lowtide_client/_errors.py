"""Exceptions that activities raise to steer the scheduler."""

from __future__ import annotations


class NonRetryableError(Exception):
    """Raise (or subclass) this in an activity to fail its task without further attempts.

    Retrying only helps with transient trouble; a malformed payload or a refused business
    rule fails the same way every time, and retrying it just burns the retry budget. The
    worker reports such a failure with ``non_retryable=True``. The task's
    ``non_retryable_error_types`` offers the same for exception classes you do not control:
    the scheduler compares them with the failure's ``error_type`` (the class name).
    """
