//! Broker stand-ins in the test process: [`ScriptedPublisher`], which
//! records what it acknowledges and fails on cue, and [`msg`], a message to
//! publish.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use outboxd::broker::PublishError;
use outboxd::broker::Publisher;
use outboxd::message::OutgoingMessage;

/// A broker stand-in that records what it acknowledges and fails on cue,
/// so a test can take the broker down and bring it back.
#[derive(Default)]
pub struct ScriptedPublisher {
    pub sent: Mutex<Vec<OutgoingMessage>>,
    pub failing: AtomicBool,
    pub permanent: AtomicBool,
}

impl ScriptedPublisher {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn failing() -> Arc<Self> {
        let p = Self::default();
        p.failing.store(true, Ordering::SeqCst);
        Arc::new(p)
    }

    pub fn set_failing(&self, on: bool) {
        self.failing.store(on, Ordering::SeqCst);
    }

    pub fn sent(&self) -> Vec<OutgoingMessage> {
        self.sent.lock().expect("lock").clone()
    }
}

impl Publisher for ScriptedPublisher {
    async fn publish(&self, msg: OutgoingMessage) -> Result<(), PublishError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(if self.permanent.load(Ordering::SeqCst) {
                PublishError::Permanent("message too large".into())
            } else {
                PublishError::Retryable("broker unavailable".into())
            });
        }
        self.sent.lock().expect("lock").push(msg);
        Ok(())
    }
}

/// A message for `topic` and `key` whose payload is `{"n": n}`, with a
/// fresh message id.
pub fn msg(topic: &str, key: &str, n: usize) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.into(),
        key: key.as_bytes().to_vec(),
        payload: format!("{{\"n\":{n}}}").into_bytes(),
        headers: vec![(
            "message-id".into(),
            uuid::Uuid::new_v4().to_string().into_bytes(),
        )],
        message_id: uuid::Uuid::new_v4(),
        created_at: chrono::Utc::now(),
    }
}
