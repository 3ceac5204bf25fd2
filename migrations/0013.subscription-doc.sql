-- 0013: each subscription keeps the JSON document the API sends for it (its `doc` column),
-- written by a trigger whenever the row changes (sql/api.sql), so a list page reads 100
-- documents instead of building them: building was two thirds of the page's database
-- time. `migrate` fills it for the rows that exist (sql/api.sql, after this).
ALTER TABLE webhooks.subscriptions ADD COLUMN IF NOT EXISTS doc text;
