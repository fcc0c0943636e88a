-- 0006: the plugin registry. Every host sharing the database runs the
-- version of each plugin whose state is 'active'; versions are immutable
-- (a new sha256 under a name is a new version, the same sha256 is a no-op).
-- A state change and its pg_notify('outboxd_plugins', name) share one
-- transaction, so a host never hears of a change it cannot read.
CREATE TABLE plugins (
  name         text        NOT NULL,
  version      integer     NOT NULL CHECK (version > 0),
  sha256       text        NOT NULL,
  world        text        NOT NULL,
  wit_version  text        NOT NULL,
  component    bytea       NOT NULL,
  deployed_by  text        NOT NULL,
  deployed_at  timestamptz NOT NULL DEFAULT now(),
  state        text        NOT NULL DEFAULT 'candidate'
    CHECK (state IN ('candidate', 'active', 'retired')),
  -- A candidate with shadow = true runs next to the active version on live
  -- traffic; its outputs are compared, never published.
  shadow       boolean     NOT NULL DEFAULT false,
  -- Promote the shadow after this many events with no mismatch and no error.
  auto_promote_after bigint,
  PRIMARY KEY (name, version),
  UNIQUE (name, sha256)
);
CREATE UNIQUE INDEX plugins_one_active ON plugins (name) WHERE state = 'active';

-- Every activation, newest last: what `rollback` walks back through.
CREATE TABLE plugin_activations (
  id           bigserial   PRIMARY KEY,
  name         text        NOT NULL,
  version      integer     NOT NULL,
  activated_by text        NOT NULL,
  activated_at timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (name, version) REFERENCES plugins (name, version)
);

-- Shadow-run counters, one row per host and candidate version.
CREATE TABLE plugin_shadow_stats (
  name        text    NOT NULL,
  version     integer NOT NULL,
  host        text    NOT NULL,
  matches     bigint  NOT NULL DEFAULT 0,
  mismatches  bigint  NOT NULL DEFAULT 0,
  errors      bigint  NOT NULL DEFAULT 0,
  shadow_micros bigint NOT NULL DEFAULT 0,
  active_micros bigint NOT NULL DEFAULT 0,
  samples     text    NOT NULL DEFAULT '[]',
  PRIMARY KEY (name, version, host)
);
