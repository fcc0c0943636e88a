//! Postgres roles for consumer plugins: the database's own wall around
//! plugin SQL. A consumer plugin's statements run under its
//! `consumers[].db_role` (`SET LOCAL ROLE`), which must hold exactly the
//! grants of `consumers[].tables`: no TEMP (granted to PUBLIC by default),
//! no CREATE, no USAGE on outboxd's schema (`outboxd`), no privilege on
//! outboxd's tables, functions or sequences, and
//! nothing on any other table.
//!
//! [`check`] runs before a consumer starts and refuses it with the SQL that
//! fixes it; [`provision`] runs that SQL (`outboxd plugin-roles`, and
//! `outboxd migrate` when the host's login may create roles).

use sqlx::PgPool;

use crate::store::HOST_SCHEMA;
use outboxd_core::config::ConsumerSection;
use outboxd_core::sql_gate::is_host_table;

/// `"name"`, for SQL text; names are checked to be plain identifiers.
fn q(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Where the role's SQL applies: the database, the host's login and the
/// application's schema, which holds the tables plugins are granted (the
/// first schema of the host's search path after outboxd's own).
#[derive(Debug, Clone)]
pub struct Site {
    pub database: String,
    pub host_user: String,
    pub schema: String,
    pub host_is_superuser: bool,
}

pub async fn site(pool: &PgPool) -> Result<Site, sqlx::Error> {
    let (database, host_user, schema, host_is_superuser): (String, String, String, bool) =
        sqlx::query_as(
            "SELECT current_database(), current_user,
                    coalesce((SELECT s FROM unnest(current_schemas(false)) WITH ORDINALITY AS u(s, i)
                               WHERE s <> $1 ORDER BY i LIMIT 1), 'public'),
                    (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)",
        )
        .bind(HOST_SCHEMA)
        .fetch_one(pool)
        .await?;
    Ok(Site {
        database,
        host_user,
        schema,
        host_is_superuser,
    })
}

/// The statements that give `c`'s plugin a role of its own, as the docs and
/// the startup error show them. Idempotent except `CREATE ROLE`, which
/// [`provision`] skips for a role that exists.
pub fn provisioning_sql(site: &Site, c: &ConsumerSection, role: &str) -> Vec<String> {
    let r = q(role);
    let mut sql = vec![
        format!("CREATE ROLE {r} NOLOGIN NOINHERIT"),
        // TEMP is granted to PUBLIC by default, and a temporary table
        // shadows any table of the same name for the session.
        format!(
            "REVOKE TEMPORARY ON DATABASE {} FROM PUBLIC",
            q(&site.database)
        ),
        format!(
            "GRANT TEMPORARY ON DATABASE {} TO {}",
            q(&site.database),
            q(&site.host_user)
        ),
        format!(
            "REVOKE EXECUTE ON FUNCTION {}.outbox_enqueue(text, text, jsonb, jsonb) FROM PUBLIC",
            q(&site.schema)
        ),
        format!(
            "REVOKE EXECUTE ON FUNCTION {}.outbox_notify() FROM PUBLIC",
            q(&site.schema)
        ),
        // outboxd's own schema: not even name resolution reaches it.
        format!("REVOKE ALL ON SCHEMA {} FROM PUBLIC", q(HOST_SCHEMA)),
        format!("REVOKE ALL ON SCHEMA {} FROM {r}", q(HOST_SCHEMA)),
        format!("GRANT USAGE ON SCHEMA {} TO {r}", q(&site.schema)),
    ];
    for t in &c.tables.read {
        if !c.tables.write.contains(t) {
            sql.push(format!(
                "GRANT SELECT ON {}.{} TO {r}",
                q(&site.schema),
                q(t)
            ));
        }
    }
    for t in &c.tables.write {
        sql.push(format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {}.{} TO {r}",
            q(&site.schema),
            q(t)
        ));
        // A `serial` column's sequence (identity columns need nothing).
        sql.push(format!(
            "DO $$ DECLARE s text; BEGIN FOR s IN SELECT pg_get_serial_sequence(a.attrelid::regclass::text, a.attname) FROM pg_attribute a WHERE a.attrelid = '{}.{}'::regclass AND a.attnum > 0 AND NOT a.attisdropped AND pg_get_serial_sequence(a.attrelid::regclass::text, a.attname) IS NOT NULL LOOP EXECUTE format('GRANT USAGE ON SEQUENCE %s TO %I', s, '{role}'); END LOOP; END $$",
            q(&site.schema).replace('\'', "''"),
            q(t).replace('\'', "''")
        ));
    }
    if !site.host_is_superuser {
        // The host switches to the role with SET LOCAL ROLE.
        sql.push(format!("GRANT {r} TO {}", q(&site.host_user)));
    }
    sql
}

fn show(sql: &[String]) -> String {
    sql.iter()
        .map(|s| format!("  {s};"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks that `c`'s role exists and holds exactly its grants; the error
/// names the key and shows the SQL to run (`index` is the consumer's place
/// in the config, for the key).
pub async fn check(pool: &PgPool, index: usize, c: &ConsumerSection) -> Result<(), RoleCheckError> {
    let key = format!("consumers[{index}].db_role");
    let Some(role) = &c.db_role else {
        return Err(RoleCheckError::Refused(format!(
            "{key}: a consumer plugin on Postgres needs a role of its own; set it and run `outboxd plugin-roles`"
        )));
    };
    let site = site(pool).await?;
    let fix = || {
        format!(
            "run `outboxd plugin-roles` (it needs a login that may create roles), or this SQL as a superuser:\n{}",
            show(&provisioning_sql(&site, c, role))
        )
    };
    let problems = problems(pool, role, &site.schema, c).await?;
    if problems.is_empty() {
        return Ok(());
    }
    Err(RoleCheckError::Refused(format!(
        "{key}: role `{role}` of consumer `{}` is not safe for plugin SQL:\n{}\n{}",
        c.name,
        problems
            .iter()
            .map(|p| format!("  - {p}"))
            .collect::<Vec<_>>()
            .join("\n"),
        fix()
    )))
}

/// Why [`check`] did not pass a consumer's role.
#[derive(Debug, thiserror::Error)]
pub enum RoleCheckError {
    /// The check's own queries failed: the connection, not the role (start-up
    /// tries again when the error is transient).
    #[error("database error while checking the plugin role: {0}")]
    Database(#[from] sqlx::Error),
    /// The role is missing or unsafe: what is wrong, and the fix.
    #[error("{0}")]
    Refused(String),
}

/// A relation the role holds a privilege on: schema, name, SELECT, a
/// write, TRUNCATE/REFERENCES/TRIGGER, in the host's schema, and the table
/// owning it when it is a sequence.
type HeldRelation = (String, String, bool, bool, bool, bool, Option<String>);

/// Everything wrong with `role` for `c`, in words.
async fn problems(
    pool: &PgPool,
    role: &str,
    app_schema: &str,
    c: &ConsumerSection,
) -> Result<Vec<String>, sqlx::Error> {
    let mut out = Vec::new();
    let attrs: Option<(bool, bool, bool, bool)> = sqlx::query_as(
        "SELECT rolsuper, rolcreaterole, rolcreatedb, rolbypassrls FROM pg_roles WHERE rolname = $1",
    )
    .bind(role)
    .fetch_optional(pool)
    .await?;
    let Some((superuser, createrole, createdb, bypassrls)) = attrs else {
        out.push(format!("the role `{role}` does not exist"));
        return Ok(out);
    };
    if superuser || createrole || createdb || bypassrls {
        out.push("it has SUPERUSER, CREATEROLE, CREATEDB or BYPASSRLS".into());
    }
    let (can_switch, temp, create_db, member_of_host): (bool, bool, bool, bool) = sqlx::query_as(
        "SELECT pg_has_role(session_user, $1, 'MEMBER'),
                has_database_privilege($1, current_database(), 'TEMPORARY'),
                has_database_privilege($1, current_database(), 'CREATE'),
                $1 <> current_user AND pg_has_role($1, current_user, 'MEMBER')",
    )
    .bind(role)
    .fetch_one(pool)
    .await?;
    if !can_switch {
        out.push(format!(
            "the host's login cannot SET ROLE to it (GRANT {} TO the host's login)",
            q(role)
        ));
    }
    if temp {
        out.push(
            "it may create temporary tables (TEMPORARY is granted to PUBLIC by default)".into(),
        );
    }
    if create_db {
        out.push("it has CREATE on the database".into());
    }
    if member_of_host {
        out.push("it is a member of the host's role, so it has the host's privileges".into());
    }
    let schemas: Vec<String> = sqlx::query_scalar(
        "SELECT nspname FROM pg_namespace
          WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'
            AND has_schema_privilege($1, oid, 'CREATE')",
    )
    .bind(role)
    .fetch_all(pool)
    .await?;
    for s in schemas {
        out.push(format!("it has CREATE on schema `{s}`"));
    }
    let host_schema_usage: bool = sqlx::query_scalar(
        "SELECT coalesce((SELECT has_schema_privilege($1, oid, 'USAGE') FROM pg_namespace WHERE nspname = $2), false)",
    )
    .bind(role)
    .bind(HOST_SCHEMA)
    .fetch_one(pool)
    .await?;
    if host_schema_usage {
        out.push(format!("it has USAGE on outboxd's schema `{HOST_SCHEMA}`"));
    }
    // Every relation outside the catalogs the role has any privilege on.
    // A sequence is reported with the table that owns it (a `serial`
    // column's): USAGE on it is part of writing that table.
    let held: Vec<HeldRelation> = sqlx::query_as(
        "SELECT n.nspname, c.relname,
                has_table_privilege($1, c.oid, 'SELECT'),
                has_table_privilege($1, c.oid, 'INSERT, UPDATE, DELETE'),
                has_table_privilege($1, c.oid, 'TRUNCATE, REFERENCES, TRIGGER'),
                n.nspname = $2,
                (SELECT t.relname FROM pg_depend d JOIN pg_class t ON t.oid = d.refobjid
                  WHERE c.relkind = 'S' AND d.classid = 'pg_class'::regclass
                    AND d.objid = c.oid AND d.refclassid = 'pg_class'::regclass
                    AND d.deptype IN ('a', 'i') LIMIT 1)
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
            AND n.nspname NOT IN ('pg_catalog', 'information_schema')
            AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp%'
            AND (has_any_column_privilege($1, c.oid, 'SELECT, INSERT, UPDATE, REFERENCES')
                 OR has_table_privilege($1, c.oid, 'DELETE, TRUNCATE, TRIGGER'))",
    )
    .bind(role)
    .bind(app_schema)
    .fetch_all(pool)
    .await?;
    for (schema, table, select, write, other, in_host_schema, owner) in held {
        let name = format!("{schema}.{table}");
        if in_host_schema
            && owner
                .as_deref()
                .is_some_and(|t| c.tables.may_write(t) && !is_host_table(t))
        {
            continue;
        }
        if is_host_table(&table) {
            out.push(format!("it has privileges on outboxd's table `{name}`"));
            continue;
        }
        if !in_host_schema {
            out.push(format!(
                "it has privileges on `{name}`, outside the schema plugin SQL uses"
            ));
            continue;
        }
        if other {
            out.push(format!(
                "it has TRUNCATE, REFERENCES or TRIGGER on `{name}`"
            ));
        }
        if write && !c.tables.may_write(&table) {
            out.push(format!(
                "it may write `{name}`, which is not in consumers[].tables.write"
            ));
        } else if select && !c.tables.may_read(&table) {
            out.push(format!(
                "it may read `{name}`, which is not in consumers[].tables.read"
            ));
        }
    }
    for t in c.tables.read.iter().chain(&c.tables.write) {
        let granted: Option<bool> = sqlx::query_scalar(
            "SELECT has_table_privilege($1, c.oid, 'SELECT')
               FROM pg_class c WHERE c.oid = to_regclass(quote_ident($2) || '.' || quote_ident($3))",
        )
        .bind(role)
        .bind(app_schema)
        .bind(t)
        .fetch_optional(pool)
        .await?
        .flatten();
        if granted == Some(false) {
            out.push(format!(
                "it cannot read `{t}`, which consumers[].tables lists"
            ));
        }
    }
    let functions: Vec<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p
           JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname = $2 AND p.proname LIKE 'outbox\\_%'
            AND has_function_privilege($1, p.oid, 'EXECUTE')",
    )
    .bind(role)
    .bind(app_schema)
    .fetch_all(pool)
    .await?;
    for f in functions {
        out.push(format!("it may execute outboxd's function `{f}`"));
    }
    Ok(out)
}

/// Creates or repairs the role of every plugin consumer in `consumers`
/// (those on Postgres with a `db_role`); returns what it ran.
pub async fn provision(
    pool: &PgPool,
    consumers: &[ConsumerSection],
) -> Result<Vec<String>, String> {
    let site = site(pool).await.map_err(|e| e.to_string())?;
    let mut ran = Vec::new();
    for c in consumers.iter().filter(|c| c.plugin_name().is_some()) {
        let Some(role) = &c.db_role else { continue };
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
                .bind(role)
                .fetch_one(pool)
                .await
                .map_err(|e| e.to_string())?;
        for (i, stmt) in provisioning_sql(&site, c, role).into_iter().enumerate() {
            if i == 0 && exists {
                continue;
            }
            sqlx::raw_sql(&stmt).execute(pool).await.map_err(|e| {
                format!(
                    "consumer `{}`: `{stmt}` failed: {e}; run the SQL of `outboxd plugin-roles --print` as a superuser",
                    c.name
                )
            })?;
            ran.push(stmt);
        }
    }
    Ok(ran)
}

/// Whether the host's login may create roles (so `outboxd migrate` can
/// provision them itself).
pub async fn may_create_roles(pool: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user",
    )
    .fetch_one(pool)
    .await
}

/// The whole SQL for `consumers`, for `outboxd plugin-roles --print`.
pub async fn print_sql(
    pool: &PgPool,
    consumers: &[ConsumerSection],
) -> Result<String, sqlx::Error> {
    let site = site(pool).await?;
    let mut out = String::new();
    for (i, c) in consumers.iter().enumerate() {
        if c.plugin_name().is_none() {
            continue;
        }
        let Some(role) = &c.db_role else {
            out.push_str(&format!(
                "-- consumers[{i}] ({}) has no db_role; set one\n",
                c.name
            ));
            continue;
        };
        out.push_str(&format!(
            "-- consumers[{i}] ({}): its plugin's SQL runs as {role}\n",
            c.name
        ));
        for s in provisioning_sql(&site, c, role) {
            out.push_str(&s);
            out.push_str(";\n");
        }
    }
    Ok(out)
}

/// The plugin roles of a database that has them: the functions above on
/// its pool, for callers that hold a [`Db`](crate::store::Db).
#[derive(Debug, Clone, Copy)]
pub struct PluginRoles<'a>(&'a PgPool);

impl<'a> PluginRoles<'a> {
    /// `None` on SQLite, which needs no roles: its authorizer confines
    /// plugin SQL to `consumers[].tables` (`sqlite_plugin_guard.rs`).
    pub fn of(db: &'a crate::store::Db) -> Option<Self> {
        match db {
            crate::store::Db::Postgres(pool) => Some(Self(pool)),
            crate::store::Db::Sqlite(_) => None,
        }
    }

    /// [`check`].
    pub async fn check(self, index: usize, c: &ConsumerSection) -> Result<(), RoleCheckError> {
        check(self.0, index, c).await
    }

    /// [`provision`].
    pub async fn provision(self, consumers: &[ConsumerSection]) -> Result<Vec<String>, String> {
        provision(self.0, consumers).await
    }

    /// [`may_create_roles`].
    pub async fn may_create(self) -> Result<bool, sqlx::Error> {
        may_create_roles(self.0).await
    }

    /// [`print_sql`].
    pub async fn print_sql(self, consumers: &[ConsumerSection]) -> Result<String, sqlx::Error> {
        print_sql(self.0, consumers).await
    }
}
