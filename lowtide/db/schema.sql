-- lowtide's schema after migration 0026_placed_claims_by_priority.sql: what the migrations in
-- lowtide/db/migrations make, one table whole in one place. Written by `make schema`
-- (scripts/schema_snapshot.py), never by hand; the migrations are what a database runs.

CREATE SCHEMA IF NOT EXISTS lowtide;


CREATE TABLE lowtide.adaptive_limits (
    activity_type text NOT NULL,
    limit_value double precision NOT NULL,
    baseline_ms double precision,
    baseline_at timestamp with time zone,
    slow_start boolean DEFAULT true NOT NULL,
    latency_ms double precision,
    failure_rate double precision DEFAULT 0 NOT NULL,
    samples integer DEFAULT 0 NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE ONLY lowtide.adaptive_limits
    ADD CONSTRAINT adaptive_limits_pkey PRIMARY KEY (activity_type);


CREATE TABLE lowtide.adaptive_samples (
    id bigint NOT NULL,
    scheduler_id text NOT NULL,
    activity_type text NOT NULL,
    window_start timestamp with time zone NOT NULL,
    window_end timestamp with time zone NOT NULL,
    succeeded integer NOT NULL,
    failed integer NOT NULL,
    timed_out integer NOT NULL,
    run_ms double precision NOT NULL,
    ok_run_ms double precision NOT NULL
);

ALTER TABLE lowtide.adaptive_samples ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME lowtide.adaptive_samples_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

ALTER TABLE ONLY lowtide.adaptive_samples
    ADD CONSTRAINT adaptive_samples_pkey PRIMARY KEY (id);


CREATE TABLE lowtide.carbon_totals (
    activity_type text NOT NULL,
    tasks bigint NOT NULL,
    sum_at_submit double precision NOT NULL,
    sum_at_dispatch double precision NOT NULL
);

ALTER TABLE ONLY lowtide.carbon_totals
    ADD CONSTRAINT carbon_totals_pkey PRIMARY KEY (activity_type);


CREATE TABLE lowtide.forecast_actuals (
    signal text NOT NULL,
    at timestamp with time zone NOT NULL,
    value double precision NOT NULL
);

ALTER TABLE ONLY lowtide.forecast_actuals
    ADD CONSTRAINT forecast_actuals_pkey PRIMARY KEY (signal, at);


CREATE TABLE lowtide.forecast_calibrations (
    signal text NOT NULL,
    learned_at timestamp with time zone NOT NULL,
    body jsonb NOT NULL
);

ALTER TABLE ONLY lowtide.forecast_calibrations
    ADD CONSTRAINT forecast_calibrations_pkey PRIMARY KEY (signal);


CREATE TABLE lowtide.forecast_issues (
    signal text NOT NULL,
    issued_at timestamp with time zone NOT NULL,
    at timestamp with time zone[] NOT NULL,
    value double precision[] NOT NULL
);

ALTER TABLE ONLY lowtide.forecast_issues
    ADD CONSTRAINT forecast_issues_pkey PRIMARY KEY (signal, issued_at);


CREATE TABLE lowtide.leader (
    name text NOT NULL,
    holder text NOT NULL,
    expires_at timestamp with time zone NOT NULL
);

ALTER TABLE ONLY lowtide.leader
    ADD CONSTRAINT leader_pkey PRIMARY KEY (name);


CREATE TABLE lowtide.queues (
    name text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    paused_at timestamp with time zone,
    idle_since timestamp with time zone
);

ALTER TABLE ONLY lowtide.queues
    ADD CONSTRAINT queues_pkey PRIMARY KEY (name);


CREATE TABLE lowtide.scheduler_replicas (
    id text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    seen_at timestamp with time zone DEFAULT now() NOT NULL,
    stopped boolean DEFAULT false NOT NULL
);

ALTER TABLE ONLY lowtide.scheduler_replicas
    ADD CONSTRAINT scheduler_replicas_pkey PRIMARY KEY (id);

CREATE INDEX scheduler_replicas_seen_at ON lowtide.scheduler_replicas USING btree (seen_at);


CREATE TABLE lowtide.schedules (
    id bigint NOT NULL,
    name text NOT NULL,
    cron text NOT NULL,
    time_zone text NOT NULL,
    activity_type text NOT NULL,
    queue text NOT NULL,
    pool text NOT NULL,
    payload bytea DEFAULT '\x'::bytea NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    start_tolerance_ms bigint NOT NULL,
    on_miss text NOT NULL,
    estimated_duration_ms bigint NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    generation integer DEFAULT 0 NOT NULL,
    next_fire_at timestamp with time zone NOT NULL,
    last_fire_at timestamp with time zone,
    last_task_id bigint,
    last_conflict text,
    last_conflict_at timestamp with time zone,
    conflicts bigint DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schedules_on_miss_check CHECK ((on_miss = ANY (ARRAY['run_late'::text, 'skip'::text])))
);

ALTER TABLE lowtide.schedules ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME lowtide.schedules_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

ALTER TABLE ONLY lowtide.schedules
    ADD CONSTRAINT schedules_name_key UNIQUE (name);

ALTER TABLE ONLY lowtide.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (id);

CREATE INDEX schedules_due ON lowtide.schedules USING btree (next_fire_at) WHERE (NOT paused);


CREATE TABLE lowtide.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE ONLY lowtide.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);


CREATE TABLE lowtide.signals (
    name text NOT NULL,
    unit text NOT NULL,
    threshold double precision NOT NULL,
    value double precision,
    observed_at timestamp with time zone,
    source text DEFAULT ''::text NOT NULL,
    version bigint DEFAULT 1 NOT NULL,
    stale boolean DEFAULT false NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    forecast_at timestamp with time zone[] DEFAULT '{}'::timestamp with time zone[] NOT NULL,
    forecast_value double precision[] DEFAULT '{}'::double precision[] NOT NULL,
    forecast_source text DEFAULT ''::text NOT NULL,
    forecast_version bigint DEFAULT 0 NOT NULL,
    forecast_issued_at timestamp with time zone,
    forecast_expected_error double precision[] DEFAULT '{}'::double precision[] NOT NULL
);

ALTER TABLE ONLY lowtide.signals
    ADD CONSTRAINT signals_pkey PRIMARY KEY (name);


CREATE TABLE lowtide.signal_history (
    name text NOT NULL,
    version bigint NOT NULL,
    value double precision NOT NULL,
    observed_at timestamp with time zone NOT NULL,
    source text NOT NULL,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE ONLY lowtide.signal_history
    ADD CONSTRAINT signal_history_pkey PRIMARY KEY (name, version);

ALTER TABLE ONLY lowtide.signal_history
    ADD CONSTRAINT signal_history_name_fkey FOREIGN KEY (name) REFERENCES lowtide.signals(name) ON DELETE CASCADE;


CREATE TABLE lowtide.tasks (
    id bigint NOT NULL,
    queue text NOT NULL,
    kind text NOT NULL,
    activity_type text NOT NULL,
    payload bytea NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    idempotency_key text,
    state text DEFAULT 'pending'::text NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    max_attempts integer NOT NULL,
    initial_backoff_ms bigint NOT NULL,
    backoff_coefficient double precision NOT NULL,
    max_backoff_ms bigint NOT NULL,
    non_retryable_error_types text[] DEFAULT '{}'::text[] NOT NULL,
    schedule_to_start_ms bigint,
    start_to_close_ms bigint,
    heartbeat_ms bigint,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    schedule_to_start_deadline timestamp with time zone,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    worker_id text,
    close_deadline timestamp with time zone,
    heartbeat_deadline timestamp with time zone,
    result bytea,
    error_type text,
    error_message text,
    error_non_retryable boolean,
    cancel_requested boolean DEFAULT false NOT NULL,
    max_defer_ms bigint,
    hold_deadline timestamp with time zone,
    released_by text,
    signal_at_submit double precision,
    signal_at_dispatch double precision,
    pool text DEFAULT 'default'::text NOT NULL,
    start_at timestamp with time zone,
    start_tolerance_ms bigint,
    on_miss text,
    estimated_duration_ms bigint,
    missed boolean DEFAULT false NOT NULL,
    miss_reason text,
    start_hit boolean,
    deps_pending integer DEFAULT 0 NOT NULL,
    has_dependents boolean DEFAULT false NOT NULL,
    shed_reason text,
    resources jsonb,
    latest_start timestamp with time zone,
    planned_release_at timestamp with time zone,
    planned_intensity double precision,
    plan_reason text,
    submitted_by text,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    heartbeat_details bytea,
    pools text[],
    planned_pool text,
    CONSTRAINT tasks_kind_check CHECK ((kind = ANY (ARRAY['activity'::text, 'workflow'::text]))),
    CONSTRAINT tasks_on_miss_check CHECK ((on_miss = ANY (ARRAY['run_late'::text, 'skip'::text]))),
    CONSTRAINT tasks_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'running'::text, 'completed'::text, 'failed'::text, 'cancelled'::text, 'timed_out'::text, 'skipped'::text, 'shed'::text])))
);

ALTER TABLE lowtide.tasks ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME lowtide.tasks_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

ALTER TABLE ONLY lowtide.tasks
    ADD CONSTRAINT tasks_pkey PRIMARY KEY (id);

CREATE INDEX tasks_claim_placed ON lowtide.tasks USING btree (planned_pool, queue, activity_type, priority DESC, planned_release_at, id) WHERE ((state = 'pending'::text) AND (planned_pool IS NOT NULL) AND (start_at IS NULL) AND (resources IS NULL));

CREATE INDEX tasks_claim_regular ON lowtide.tasks USING btree (queue, activity_type, priority DESC, run_at, id) WHERE ((state = 'pending'::text) AND (start_at IS NULL) AND (resources IS NULL));

CREATE INDEX tasks_claim_resources ON lowtide.tasks USING btree (queue, priority DESC, run_at, id) WHERE ((state = 'pending'::text) AND (resources IS NOT NULL));

CREATE INDEX tasks_claim_workflow ON lowtide.tasks USING btree (queue, activity_type, priority DESC, run_at, id) WHERE ((state = 'pending'::text) AND (kind = 'workflow'::text));

CREATE INDEX tasks_close_deadline ON lowtide.tasks USING btree (close_deadline) WHERE ((state = 'running'::text) AND (close_deadline IS NOT NULL));

CREATE INDEX tasks_deferrable_created ON lowtide.tasks USING btree (created_at) WHERE (latest_start IS NOT NULL);

CREATE INDEX tasks_finished_at ON lowtide.tasks USING btree (finished_at) WHERE (state = ANY (ARRAY['completed'::text, 'failed'::text, 'cancelled'::text, 'timed_out'::text, 'skipped'::text, 'shed'::text]));

CREATE INDEX tasks_fixed_due ON lowtide.tasks USING btree (pool, run_at) WHERE ((state = 'pending'::text) AND (start_at IS NOT NULL));

CREATE INDEX tasks_heartbeat_deadline ON lowtide.tasks USING btree (heartbeat_deadline) WHERE ((state = 'running'::text) AND (heartbeat_deadline IS NOT NULL));

CREATE INDEX tasks_hold_deadline ON lowtide.tasks USING btree (queue, activity_type, hold_deadline) WHERE ((state = 'pending'::text) AND (hold_deadline IS NOT NULL));

CREATE UNIQUE INDEX tasks_idempotency_key ON lowtide.tasks USING btree (idempotency_key, submitted_by) NULLS NOT DISTINCT WHERE (idempotency_key IS NOT NULL);

CREATE INDEX tasks_plannable ON lowtide.tasks USING btree (id) WHERE ((state = 'pending'::text) AND (attempt = 0) AND (latest_start IS NOT NULL));

CREATE INDEX tasks_running_resources ON lowtide.tasks USING btree (id) WHERE ((state = 'running'::text) AND (resources IS NOT NULL));

CREATE INDEX tasks_running_type ON lowtide.tasks USING btree (activity_type) WHERE (state = 'running'::text);

CREATE INDEX tasks_running_worker ON lowtide.tasks USING btree (worker_id) WHERE (state = 'running'::text);

CREATE INDEX tasks_schedule_to_start_deadline ON lowtide.tasks USING btree (schedule_to_start_deadline) WHERE ((state = 'pending'::text) AND (schedule_to_start_deadline IS NOT NULL));

CREATE INDEX tasks_start_outcome ON lowtide.tasks USING btree (pool, start_hit) WHERE (start_hit IS NOT NULL);

CREATE INDEX tasks_start_unmarked ON lowtide.tasks USING btree (start_at) WHERE ((state = 'pending'::text) AND (start_at IS NOT NULL) AND (attempt = 0) AND (NOT missed));

CREATE INDEX tasks_state_id ON lowtide.tasks USING btree (state, id);


CREATE TABLE lowtide.reservations (
    task_id bigint NOT NULL,
    pool text NOT NULL,
    window_start timestamp with time zone NOT NULL,
    window_end timestamp with time zone NOT NULL
);

ALTER TABLE ONLY lowtide.reservations
    ADD CONSTRAINT reservations_pkey PRIMARY KEY (task_id);

CREATE INDEX reservations_pool_window ON lowtide.reservations USING btree (pool, window_start, window_end);

ALTER TABLE ONLY lowtide.reservations
    ADD CONSTRAINT reservations_task_id_fkey FOREIGN KEY (task_id) REFERENCES lowtide.tasks(id) ON DELETE CASCADE;


CREATE TABLE lowtide.schedule_tasks (
    schedule_id bigint NOT NULL,
    task_id bigint NOT NULL,
    fire_at timestamp with time zone NOT NULL
);

ALTER TABLE ONLY lowtide.schedule_tasks
    ADD CONSTRAINT schedule_tasks_pkey PRIMARY KEY (schedule_id, task_id);

CREATE INDEX schedule_tasks_task ON lowtide.schedule_tasks USING btree (task_id);

ALTER TABLE ONLY lowtide.schedule_tasks
    ADD CONSTRAINT schedule_tasks_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES lowtide.schedules(id) ON DELETE CASCADE;

ALTER TABLE ONLY lowtide.schedule_tasks
    ADD CONSTRAINT schedule_tasks_task_id_fkey FOREIGN KEY (task_id) REFERENCES lowtide.tasks(id) ON DELETE CASCADE;


CREATE TABLE lowtide.task_dependencies (
    task_id bigint NOT NULL,
    depends_on bigint NOT NULL
);

ALTER TABLE ONLY lowtide.task_dependencies
    ADD CONSTRAINT task_dependencies_pkey PRIMARY KEY (task_id, depends_on);

CREATE INDEX task_dependencies_depends_on ON lowtide.task_dependencies USING btree (depends_on);

ALTER TABLE ONLY lowtide.task_dependencies
    ADD CONSTRAINT task_dependencies_depends_on_fkey FOREIGN KEY (depends_on) REFERENCES lowtide.tasks(id) ON DELETE CASCADE;

ALTER TABLE ONLY lowtide.task_dependencies
    ADD CONSTRAINT task_dependencies_task_id_fkey FOREIGN KEY (task_id) REFERENCES lowtide.tasks(id) ON DELETE CASCADE;
--
-- PostgreSQL database dump complete
--


CREATE TABLE lowtide.workers (
    id text NOT NULL,
    pool text NOT NULL,
    queues text[] NOT NULL,
    activity_types text[] NOT NULL,
    slots integer NOT NULL,
    scheduler_id text NOT NULL,
    connected_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_expires_at timestamp with time zone NOT NULL,
    token_name text
);

ALTER TABLE ONLY lowtide.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (id);
