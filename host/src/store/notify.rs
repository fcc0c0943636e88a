//! Wake-ups, so a waiting worker need not poll fast: Postgres announces a
//! commit with NOTIFY on a channel; SQLite has no channels, and its commit
//! watcher (`sqlite_watch.rs`) stands in for the outbox's and the embedded
//! transport's.

use tokio::sync::watch;

use super::Db;

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
            Channel::Outbox => super::postgres::NOTIFY_CHANNEL,
            Channel::Transport => super::transport::NOTIFY_CHANNEL,
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
            Db::Postgres(pool) => super::postgres::listen(pool, channel.name())
                .await
                .map(Some),
            Db::Sqlite(pool) => Ok(match channel {
                Channel::Outbox | Channel::Transport => super::sqlite_watch::subscribe(pool).await,
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
