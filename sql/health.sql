-- Health of each worker's background tasks (the LISTEN connection, the recorder of
-- attempts, the pruner, and the claim loop itself). A worker writes a row when one of its
-- tasks crashes and is restarted; `webhooks status` shows the recent ones. The worker
-- tolerates the table's absence (it logs and goes on), so it can be added by a later
-- migration. Rows older than WEBHOOKS_RETENTION are pruned by the workers.
CREATE TABLE IF NOT EXISTS webhooks.worker_tasks (
    worker         text NOT NULL,  -- host:pid:n of the worker process
    task           text NOT NULL,  -- listener, recorder, pruner or loop
    restarts       integer NOT NULL DEFAULT 0,  -- crashes of this task in this process
    last_error     text,           -- the last crash: exception type and message
    last_crash_at  timestamptz,
    PRIMARY KEY (worker, task)
);
CREATE INDEX IF NOT EXISTS worker_tasks_crash_idx ON webhooks.worker_tasks (last_crash_at);
