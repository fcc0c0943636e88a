//! Wake-ups, so a waiting worker need not poll fast: Postgres announces a
//! commit with NOTIFY on a channel; SQLite has no channels, and its commit
//! watcher (`sqlite_watch.rs`) stands in for the outbox's and the embedded
//! transport's.

use sqlx::PgPool;
use tokio::sync::watch;

use crate::store::Db;

/// What a listener waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// An event was enqueued (the `outbox` insert trigger notifies).
    Outbox,
    /// The embedded transport stored a message.
    Transport,
    /// A plugin version changed state in the registry.
    Plugins,
}

impl Channel {
    /// The Postgres channel name.
    pub const fn name(self) -> &'static str {
        match self {
            Channel::Outbox => OUTBOX_CHANNEL,
            Channel::Transport => TRANSPORT_CHANNEL,
            Channel::Plugins => "outboxd_plugins",
        }
    }
}

impl Db {
    /// A receiver that ticks after a commit that may concern `channel` (and
    /// after a lost LISTEN connection comes back), or `None` where this
    /// database cannot tell: SQLite's watcher sees only outbox and
    /// transport commits, and none at all on an in-memory database. The
    /// caller polls either way; the ticks only shorten its waits.
    pub async fn listen(
        &self,
        channel: Channel,
    ) -> Result<Option<watch::Receiver<u64>>, sqlx::Error> {
        match self {
            Db::Postgres(pool) => listen(pool, channel.name()).await.map(Some),
            Db::Sqlite(pool) => Ok(match channel {
                Channel::Outbox | Channel::Transport => {
                    crate::store::backend::sqlite_watch::subscribe(pool).await
                }
                Channel::Plugins => None,
            }),
        }
    }
}

/// Runs `$body` in one transaction on whichever pool `$db` holds (the same
/// statements on either database, with `$tx` the transaction) and, on
/// Postgres, announces `$payload` on `$channel` in that same transaction,
/// so no listener hears of a change it cannot read yet. Errors leave
/// through `?`.
macro_rules! in_announced_tx {
    ($db:expr, $channel:expr, $payload:expr, |$tx:ident| $body:block) => {
        match $db {
            $crate::store::Db::Postgres(pool) => {
                let mut $tx = pool.begin().await?;
                let out = $body;
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind($crate::store::Channel::name($channel))
                    .bind($payload)
                    .execute(&mut *$tx)
                    .await?;
                $tx.commit().await?;
                out
            }
            $crate::store::Db::Sqlite(pool) => {
                // IMMEDIATE: the body reads before it writes, and a deferred
                // transaction whose snapshot another writer has overtaken
                // cannot upgrade to a write (SQLITE_BUSY at once, the busy
                // timeout notwithstanding).
                let mut $tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                let out = $body;
                $tx.commit().await?;
                out
            }
        }
    };
}
pub(crate) use in_announced_tx;

/// The channel the `outbox_notify` trigger signals on.
pub const OUTBOX_CHANNEL: &str = "outboxd_outbox";

/// The channel a Postgres publish on the embedded transport notifies at
/// commit.
pub const TRANSPORT_CHANNEL: &str = "outboxd_transport";

/// Ticks the returned receiver on every notification on `channel` (and
/// after the LISTEN connection comes back); see `store::outbox::pg_claim::listen_for_events`.
pub async fn listen(
    pool: &PgPool,
    channel: &str,
) -> Result<tokio::sync::watch::Receiver<u64>, sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    let channel = channel.to_string();
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    tokio::spawn(async move {
        loop {
            let result = tokio::select! {
                r = listener.recv() => r,
                _ = tx.closed() => return,
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, channel, "LISTEN connection failed; polling until it is back");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            tx.send_modify(|v| *v = v.wrapping_add(1));
        }
    });
    Ok(rx)
}
