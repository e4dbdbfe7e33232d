-- The newest heartbeat details an activity reported (its progress), shown by GetTask and
-- `lowtide task get`. Nullable, no default: no table rewrite.

ALTER TABLE lowtide.tasks ADD COLUMN heartbeat_details bytea;
