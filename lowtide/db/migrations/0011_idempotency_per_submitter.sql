-- Idempotency keys belong to their submitter (the token's name): another submitter's key neither
-- returns that submitter's task nor keeps the caller's own from being created. Tasks submitted
-- with auth off (submitted_by NULL) share one scope among themselves (NULLS NOT DISTINCT). The
-- key comes first, so the lookup by key stays an index search.

DROP INDEX lowtide.tasks_idempotency_key;

CREATE UNIQUE INDEX tasks_idempotency_key ON lowtide.tasks (idempotency_key, submitted_by) NULLS NOT DISTINCT
    WHERE idempotency_key IS NOT NULL;
