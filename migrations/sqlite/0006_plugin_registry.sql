-- 0006: the plugin registry (see the Postgres migration of the same number;
-- SQLite hosts find changes by polling). Times are microseconds since the
-- epoch, as in 0001.
CREATE TABLE plugins (
  name         TEXT    NOT NULL,
  version      INTEGER NOT NULL CHECK (version > 0),
  sha256       TEXT    NOT NULL,
  world        TEXT    NOT NULL,
  wit_version  TEXT    NOT NULL,
  component    BLOB    NOT NULL,
  deployed_by  TEXT    NOT NULL,
  deployed_at  INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)),
  state        TEXT    NOT NULL DEFAULT 'candidate'
    CHECK (state IN ('candidate', 'active', 'retired')),
  shadow       INTEGER NOT NULL DEFAULT 0,
  auto_promote_after INTEGER,
  PRIMARY KEY (name, version),
  UNIQUE (name, sha256)
);
CREATE UNIQUE INDEX plugins_one_active ON plugins (name) WHERE state = 'active';

CREATE TABLE plugin_activations (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  name         TEXT    NOT NULL,
  version      INTEGER NOT NULL,
  activated_by TEXT    NOT NULL,
  activated_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)),
  FOREIGN KEY (name, version) REFERENCES plugins (name, version)
);

CREATE TABLE plugin_shadow_stats (
  name        TEXT    NOT NULL,
  version     INTEGER NOT NULL,
  host        TEXT    NOT NULL,
  matches     INTEGER NOT NULL DEFAULT 0,
  mismatches  INTEGER NOT NULL DEFAULT 0,
  errors      INTEGER NOT NULL DEFAULT 0,
  shadow_micros INTEGER NOT NULL DEFAULT 0,
  active_micros INTEGER NOT NULL DEFAULT 0,
  samples     TEXT    NOT NULL DEFAULT '[]',
  PRIMARY KEY (name, version, host)
);
