-- webhooks.start_backfill takes the owner's limit of running backfills: the one-argument
-- function goes, and `migrate` installs the new one from sql/backfill.sql.
DROP FUNCTION IF EXISTS webhooks.start_backfill(bigint);
