"""The scheduler service: task queue, worker streams, dispatch and maintenance."""
