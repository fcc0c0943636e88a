-- 0011: outboxd's tables move into a schema of their own, `outboxd`.
--
-- Until now they shared the application's schema (usually `public`) with
-- the tables that consumer plugins are granted, so a plugin's role needed
-- USAGE on the host's schema. Now a plugin's role holds USAGE only on the
-- application's schema, and outboxd's tables are not even visible to name
-- resolution under it. The host's connections search `outboxd` first (see
-- host/src/store/db.rs), so its unqualified statements always resolve to
-- these tables, whatever the application's schema holds.
--
-- What stays in the application's schema, because producers call it:
-- outbox_enqueue (now with its own search_path, so it finds outboxd.outbox
-- from any caller), outbox_notify (the trigger function) and
-- outboxd_row_fits (which plugin statements call).
--
-- Rolling upgrade: producers of an earlier release insert into `outbox`
-- unqualified on their own connections. A view `outbox` over
-- outboxd.outbox is left in the application's schema for them (an
-- auto-updatable view: INSERT ... ON CONFLICT ... RETURNING and SELECT
-- work through it), with the grants the table had. A later migration drops
-- it once no producer of a release before 0011 runs. Hosts of an earlier
-- release must be stopped or upgraded: their other statements fail (they
-- roll back and retry; nothing is lost or invented) until they run this
-- release.
--
-- Roles other than the owner that held privileges on outboxd's tables keep
-- them (they move with the tables) and get USAGE on the new schema, except
-- PUBLIC: a consumer plugin's role must never reach the schema.
--
-- Privileges: creating the schema needs CREATE on the database. A login
-- without it runs this migration once an administrator has run
-- `CREATE SCHEMA outboxd AUTHORIZATION <the host's login>` (CREATE SCHEMA
-- IF NOT EXISTS would check the database privilege even then, so the
-- schema is only created when it is missing).
DO $$
BEGIN
  IF to_regnamespace('outboxd') IS NULL THEN
    BEGIN
      CREATE SCHEMA outboxd;
    EXCEPTION WHEN insufficient_privilege THEN
      RAISE EXCEPTION 'outboxd keeps its tables in a schema of its own, and % may not create it in database %', current_user, current_database()
        USING ERRCODE = '42501',
              HINT = format('as a superuser, run: CREATE SCHEMA outboxd AUTHORIZATION %I; then migrate again', current_user);
    END;
  END IF;
END $$;
REVOKE ALL ON SCHEMA outboxd FROM PUBLIC;

DO $$
DECLARE
  host_tables text[] := ARRAY['outboxd_migrations', 'outbox', 'inbox',
    'transport_messages', 'transport_cursors', 'consumer_dead_letters',
    'plugins', 'plugin_activations', 'plugin_shadow_stats',
    'consumer_offsets'];
  app name := (SELECT n.nspname FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE c.oid = 'outboxd_migrations'::regclass);
  t text;
  g record;
BEGIN
  IF app = 'outboxd' THEN
    RETURN;
  END IF;
  FOR g IN
    SELECT DISTINCT a.grantee::regrole::text AS role
      FROM pg_class c, aclexplode(c.relacl) a
     WHERE c.relnamespace = app::regnamespace AND c.relname = ANY (host_tables)
       AND a.grantee <> 0 AND a.grantee <> c.relowner
  LOOP
    EXECUTE format('GRANT USAGE ON SCHEMA outboxd TO %s', g.role);
  END LOOP;
  FOREACH t IN ARRAY host_tables LOOP
    EXECUTE format('ALTER TABLE %I.%I SET SCHEMA outboxd', app, t);
  END LOOP;
  EXECUTE format('CREATE VIEW %I.outbox AS SELECT * FROM outboxd.outbox', app);
  FOR g IN
    SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS role,
           a.privilege_type AS privilege
      FROM pg_class c, aclexplode(c.relacl) a
     WHERE c.oid = 'outboxd.outbox'::regclass AND a.grantee <> c.relowner
  LOOP
    EXECUTE format('GRANT %s ON %I.outbox TO %s', g.privilege, app, g.role);
  END LOOP;
  EXECUTE format(
    'ALTER FUNCTION %I.outbox_enqueue(text, text, jsonb, jsonb) SET search_path = outboxd, pg_temp',
    app);
END $$;
