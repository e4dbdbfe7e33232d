-- The planner expects the deferrable work of the last day again (scheduler_service.domain.demand):
-- it reads the last day's submissions with a latest start by submission time.

CREATE INDEX tasks_deferrable_created ON lowtide.tasks (created_at)
    WHERE latest_start IS NOT NULL;
