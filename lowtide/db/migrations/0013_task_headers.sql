-- Headers a submitter attaches to a task ({"traceparent": "00-…"}), sent to the worker of every
-- attempt. A constant default: existing rows get {} without a table rewrite.

ALTER TABLE lowtide.tasks ADD COLUMN headers jsonb NOT NULL DEFAULT '{}';
