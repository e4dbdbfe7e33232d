-- Waiting for tasks to end (store/waits.py).
-- Fragments ({{_name}}) are shared by every file of this folder.

-- finished_among --
-- Which of these tasks have finished (WaitTask's one check per replica for every waiter).
SELECT t.id FROM lowtide.tasks t
WHERE t.id = ANY(%(ids)s::bigint[]) AND {{_finished}}

-- notify_finished --
-- Tells every replica which tasks a batch of reports finished (payload: their ids, comma
-- separated), so each resolves its WaitTask waiters at once.
SELECT pg_notify('lowtide_done', %(payload)s)
