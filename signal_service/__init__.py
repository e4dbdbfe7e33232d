"""The signal service (not built yet: see issue 3).

Nothing here serves a signal today; `lowtide up` does not start one, and the scheduler does not
read one yet.
"""
