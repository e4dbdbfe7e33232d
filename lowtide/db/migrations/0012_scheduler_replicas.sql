-- Each scheduler replica's lifetime as the database saw it (started, last seen, stopped cleanly),
-- so a fixed start missed while no scheduler ran says so, and from when to when.

CREATE TABLE lowtide.scheduler_replicas (
    id          text PRIMARY KEY,
    started_at  timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now(),
    stopped     boolean NOT NULL DEFAULT false
);

CREATE INDEX scheduler_replicas_seen_at ON lowtide.scheduler_replicas (seen_at);
