//! outboxd's tables live in a schema of their own on Postgres (migration
//! 0011), so a consumer plugin's role needs no USAGE on it. An earlier
//! release's database moves there, and its producers keep working.

use outboxd::store::{migrate, migrate_to};
use outboxd::{NewEvent, enqueue};
use sqlx::Row;

use crate::support::TestDb;

const HOST_TABLES: &[&str] = &[
    "outboxd_migrations",
    "outbox",
    "inbox",
    "transport_messages",
    "transport_cursors",
    "transport_members",
    "consumer_dead_letters",
    "plugins",
    "plugin_activations",
    "plugin_shadow_stats",
    "consumer_offsets",
    "outbound_calls",
    "route_pauses",
];

/// How each host table's name resolves: `(schema, relkind)` per table.
async fn homes(pool: &sqlx::PgPool) -> Vec<(String, String, String)> {
    sqlx::query(
        "SELECT n.nspname::text, c.relname::text, c.relkind::text FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relname = ANY ($1) AND c.relkind IN ('r', 'v')
          ORDER BY 1, 2",
    )
    .bind(HOST_TABLES)
    .fetch_all(pool)
    .await
    .expect("list host tables")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// Where the host tables are after 0011: every one in `outboxd`, and the
/// view `outbox` left in `public`.
fn moved_layout() -> Vec<(String, String, String)> {
    let mut want: Vec<(String, String, String)> = HOST_TABLES
        .iter()
        .map(|t| ("outboxd".to_string(), t.to_string(), "r".to_string()))
        .collect();
    want.push(("public".into(), "outbox".into(), "v".into()));
    want.sort();
    want
}

/// The statements a producer of the release before 0011 ran on its own
/// connection (default search path): the Rust enqueue's insert with an
/// operation key, and its lookup.
const OLD_INSERT: &str = "INSERT INTO outbox
    (id, aggregate_id, event_type, payload, headers, idempotency_tenant, idempotency_key, payload_fingerprint)
    VALUES (gen_random_uuid(), $1, 'old.release', '{}'::jsonb, '{}'::jsonb, 't', $2, 'fp')
    ON CONFLICT (idempotency_tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_releases_database_moves_into_outboxds_schema_and_its_producers_keep_working() {
    let t = TestDb::postgres_unmigrated().await;
    migrate_to(&t.db, 10)
        .await
        .expect("the schema of the release before 0011");
    let database = t.url.rsplit('/').next().expect("db name").to_string();
    let producer = format!("{database}_producer");
    t.exec(&format!("CREATE ROLE \"{producer}\" LOGIN")).await;
    t.exec(&format!(
        "GRANT SELECT, INSERT ON outbox TO \"{producer}\"; GRANT EXECUTE ON FUNCTION outbox_enqueue(text, text, jsonb, jsonb) TO \"{producer}\""
    ))
    .await;
    // The application's own connection: Postgres's default search path.
    let app = sqlx::PgPool::connect(&t.url).await.expect("app pool");
    let before: Option<uuid::Uuid> = sqlx::query_scalar(OLD_INSERT)
        .bind("before")
        .bind("k-before")
        .fetch_optional(&app)
        .await
        .expect("an event written before the upgrade");
    assert!(before.is_some());
    let outboxd::store::Db::Postgres(host) = &t.db else {
        unreachable!()
    };
    assert!(
        homes(host)
            .await
            .iter()
            .all(|(s, _, k)| s == "public" && k == "r"),
        "before 0011 the tables are in public: {:?}",
        homes(host).await
    );

    let report = migrate(&t.db).await.expect("upgrade");
    assert_eq!(
        report.applied.first().map(String::as_str),
        Some("0011_host_schema"),
        "0011 first, then the later ones: {:?}",
        report.applied
    );
    let want = moved_layout();
    assert_eq!(homes(host).await, want, "every table moved; a view is left");
    let moved: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outboxd.outbox WHERE aggregate_id = 'before'")
            .fetch_one(host)
            .await
            .expect("count");
    assert_eq!(
        moved, 1,
        "the event written before the upgrade moved with its table"
    );

    // An earlier release's producer, on the application's connection and
    // as a login of its own: its insert and its repeat still work.
    let as_producer =
        sqlx::PgPool::connect(&t.url.replacen("postgres@", &format!("{producer}@"), 1))
            .await
            .expect("producer login");
    for pool in [&app, &as_producer] {
        let key = format!("k-{}", uuid::Uuid::new_v4());
        let first: Option<uuid::Uuid> = sqlx::query_scalar(OLD_INSERT)
            .bind("after")
            .bind(&key)
            .fetch_optional(pool)
            .await
            .expect("an earlier release's insert through the view");
        assert!(first.is_some());
        let repeat: Option<uuid::Uuid> = sqlx::query_scalar(OLD_INSERT)
            .bind("after")
            .bind(&key)
            .fetch_optional(pool)
            .await
            .expect("its repeat");
        assert_eq!(
            repeat, None,
            "the operation key still holds through the view"
        );
        let via_function: uuid::Uuid =
            sqlx::query_scalar("SELECT outbox_enqueue('after', 'sql.producer', '{}'::jsonb)")
                .fetch_one(pool)
                .await
                .expect("outbox_enqueue finds outboxd.outbox from any search path");
        let found: i64 = sqlx::query_scalar("SELECT count(*) FROM outboxd.outbox WHERE id = $1")
            .bind(via_function)
            .fetch_one(host)
            .await
            .expect("count");
        assert_eq!(found, 1);
    }
    // This release's Rust enqueue, on the application's connection.
    let mut tx = app.begin().await.expect("begin");
    enqueue(
        &mut tx,
        NewEvent::new("after", "new.release", serde_json::json!({})),
    )
    .await
    .expect("this release's enqueue on the application's connection");
    tx.commit().await.expect("commit");
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        .fetch_one(host)
        .await
        .expect("count");
    assert_eq!(
        pending, 6,
        "the host sees every event, before and after the move"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_database_keeps_outboxds_tables_out_of_the_applications_schema() {
    let t = TestDb::postgres().await;
    let outboxd::store::Db::Postgres(host) = &t.db else {
        unreachable!()
    };
    let want = moved_layout();
    assert_eq!(homes(host).await, want);
    // The example's tables, created through the host's connections, land
    // in the application's schema, where plugin roles are granted them.
    outboxd_demo::billing::create_schema(&t.db)
        .await
        .expect("billing schema");
    let schema: String = sqlx::query_scalar(
        "SELECT relnamespace::regnamespace::text FROM pg_class WHERE relname = 'invoices'",
    )
    .fetch_one(host)
    .await
    .expect("invoices");
    assert_eq!(schema, "public");
    let public_usage: bool =
        sqlx::query_scalar("SELECT has_schema_privilege('public', 'outboxd', 'USAGE')")
            .fetch_one(host)
            .await
            .expect("acl");
    assert!(!public_usage, "PUBLIC has no USAGE on outboxd's schema");
}

/// A host login that may not create schemas (no CREATE on the database)
/// is told what to run; once an administrator has created `outboxd` for
/// it, every migration runs under that login.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_without_create_on_the_database_migrates_into_a_schema_made_for_it() {
    let t = TestDb::postgres_unmigrated().await;
    let database = t.url.rsplit('/').next().expect("db name").to_string();
    let login = format!("{database}_migrator");
    t.exec(&format!(
        "CREATE ROLE \"{login}\" LOGIN; GRANT CREATE ON SCHEMA public TO \"{login}\""
    ))
    .await;
    let url = t.url.replacen("postgres@", &format!("{login}@"), 1);
    let db = outboxd::store::Db::connect(&url, 2)
        .await
        .expect("connect as the login");
    let err = migrate(&db)
        .await
        .expect_err("it may not create the schema");
    let text = format!("{err:?}");
    assert!(
        text.contains("may not create it") && text.contains("CREATE SCHEMA outboxd AUTHORIZATION"),
        "{text}"
    );
    t.exec(&format!("CREATE SCHEMA outboxd AUTHORIZATION \"{login}\""))
        .await;
    let report = migrate(&db)
        .await
        .expect("migrates into the schema made for it");
    assert!(
        report.applied.iter().any(|m| m == "0011_host_schema"),
        "{report:?}"
    );
    let outboxd::store::Db::Postgres(host) = &t.db else {
        unreachable!()
    };
    let moved: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class WHERE relnamespace = 'outboxd'::regnamespace AND relkind = 'r'",
    )
    .fetch_one(host)
    .await
    .expect("count");
    assert_eq!(moved, HOST_TABLES.len() as i64);
    db.close().await;
}
