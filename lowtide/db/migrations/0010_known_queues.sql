-- Every queue a task was ever submitted to has a row in lowtide.queues (the submit adds it), so
-- an idle queue still reports its metrics, with zeros, instead of vanishing.

INSERT INTO lowtide.queues (name)
SELECT DISTINCT queue FROM lowtide.tasks
ON CONFLICT (name) DO NOTHING;
