-- Since when a queue has had no task due or running (NULL: it has some, or it was never looked
-- at): a queue idle for the retention is forgotten by the leader (forget_idle_queues), so that
-- lowtide.queues, and the gauges of every queue it knows, do not grow with every queue name ever
-- used. Adding a column without a default rewrites nothing.

ALTER TABLE lowtide.queues ADD COLUMN idle_since timestamp with time zone;
