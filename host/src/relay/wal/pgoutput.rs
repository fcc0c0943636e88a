//! Decoding the `pgoutput` messages the replication stream carries
//! (protocol version 1, text format), and turning an outbox insert into the
//! [`OutboxEvent`] the polling claim would have read.
//!
//! The replication client hands over Begin and Commit itself; what reaches
//! this module is every other message: Relation describes a table's columns
//! before its first change in a session, Insert carries a new row, and the
//! rest (Type, Origin, Update, Delete, Truncate) are recognised and passed
//! over, since the publication streams inserts only.

use std::collections::HashMap;

use chrono::{DateTime, NaiveDateTime, Utc};

use crate::event::{EventId, OutboxEvent, parse_headers};

/// What a stream message was. Begin and Commit arrive decoded by the
/// replication client and never reach [`decode`].
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Relation(Relation),
    Insert {
        relation: u32,
        row: Vec<Option<String>>,
    },
    /// Type, Origin, Update, Delete, Truncate, or a logical message:
    /// nothing the relay acts on.
    Other(u8),
}

/// A table's identity and columns, as a Relation message describes them.
#[derive(Debug, Clone, PartialEq)]
pub struct Relation {
    pub id: u32,
    pub namespace: String,
    pub name: String,
    pub columns: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    #[error("pgoutput: message truncated while reading {0}")]
    Truncated(&'static str),
    #[error("pgoutput: {0} is not valid UTF-8")]
    NotUtf8(&'static str),
    #[error("pgoutput: empty message")]
    Empty,
    #[error("pgoutput: an Insert without its new tuple (tag `{0}`)")]
    NoNewTuple(char),
    #[error("pgoutput: unknown column kind `{0}` in a tuple")]
    ColumnKind(char),
    #[error(
        "pgoutput: an Insert for relation {0} before its Relation message; the stream is out of step"
    )]
    UnknownRelation(u32),
    #[error(
        "pgoutput: the outbox row has no column `{0}`; run `outboxd migrate` so the table matches this outboxd"
    )]
    MissingColumn(&'static str),
    #[error("pgoutput: outbox column `{column}` holds `{value}`, which is not {expected}")]
    BadValue {
        column: &'static str,
        value: String,
        expected: &'static str,
    },
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError::Truncated(what));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn cstr(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let end = self
            .rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::Truncated(what))?;
        let s = std::str::from_utf8(&self.rest[..end]).map_err(|_| DecodeError::NotUtf8(what))?;
        self.rest = &self.rest[end + 1..];
        Ok(s.to_string())
    }
}

/// Decodes one pgoutput message (the payload of an XLogData frame).
pub fn decode(data: &[u8]) -> Result<Message, DecodeError> {
    let mut r = Reader { rest: data };
    let tag = r.u8("the message tag").map_err(|_| DecodeError::Empty)?;
    match tag {
        b'R' => {
            let id = r.u32("the relation id")?;
            let namespace = r.cstr("the relation's namespace")?;
            let name = r.cstr("the relation's name")?;
            let _replica_identity = r.u8("the replica identity")?;
            let count = r.u16("the column count")?;
            let mut columns = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let _flags = r.u8("a column's flags")?;
                columns.push(r.cstr("a column's name")?);
                let _type_oid = r.u32("a column's type")?;
                let _typmod = r.u32("a column's type modifier")?;
            }
            Ok(Message::Relation(Relation {
                id,
                namespace,
                name,
                columns,
            }))
        }
        b'I' => {
            let relation = r.u32("the relation id")?;
            let kind = r.u8("the tuple tag")?;
            if kind != b'N' {
                return Err(DecodeError::NoNewTuple(kind as char));
            }
            let count = r.u16("the tuple's column count")?;
            let mut row = Vec::with_capacity(count as usize);
            for _ in 0..count {
                match r.u8("a column's kind")? {
                    b'n' => row.push(None),
                    // An unchanged TOASTed value cannot occur in an insert;
                    // reading it as absent keeps the decoder total.
                    b'u' => row.push(None),
                    b't' => {
                        let len = r.u32("a column's length")? as usize;
                        let bytes = r.take(len, "a column's value")?;
                        let text = std::str::from_utf8(bytes)
                            .map_err(|_| DecodeError::NotUtf8("a column's value"))?;
                        row.push(Some(text.to_string()));
                    }
                    other => return Err(DecodeError::ColumnKind(other as char)),
                }
            }
            Ok(Message::Insert { relation, row })
        }
        other => Ok(Message::Other(other)),
    }
}

/// The outbox table's column positions, from its Relation message.
#[derive(Debug, Clone)]
pub struct OutboxColumns {
    seq: usize,
    id: usize,
    aggregate_id: usize,
    event_type: usize,
    payload: usize,
    headers: usize,
    created_at: usize,
    attempts: usize,
    redrive_with: Option<usize>,
}

impl OutboxColumns {
    pub fn of(relation: &Relation) -> Result<Self, DecodeError> {
        let find = |name: &'static str| {
            relation
                .columns
                .iter()
                .position(|c| c == name)
                .ok_or(DecodeError::MissingColumn(name))
        };
        Ok(Self {
            seq: find("seq")?,
            id: find("id")?,
            aggregate_id: find("aggregate_id")?,
            event_type: find("event_type")?,
            payload: find("payload")?,
            headers: find("headers")?,
            created_at: find("created_at")?,
            attempts: find("attempts")?,
            redrive_with: find("redrive_with").ok(),
        })
    }

    /// The event an inserted outbox row stands for.
    pub fn event(&self, row: &[Option<String>]) -> Result<OutboxEvent, DecodeError> {
        let text = |i: usize, column: &'static str| -> Result<&str, DecodeError> {
            row.get(i)
                .and_then(|v| v.as_deref())
                .ok_or(DecodeError::BadValue {
                    column,
                    value: "NULL".into(),
                    expected: "a value",
                })
        };
        let bad =
            |column: &'static str, value: &str, expected: &'static str| DecodeError::BadValue {
                column,
                value: value.chars().take(80).collect(),
                expected,
            };
        let seq_text = text(self.seq, "seq")?;
        let seq: i64 = seq_text
            .parse()
            .map_err(|_| bad("seq", seq_text, "an integer"))?;
        let id_text = text(self.id, "id")?;
        let id = uuid::Uuid::parse_str(id_text).map_err(|_| bad("id", id_text, "a UUID"))?;
        let created_text = text(self.created_at, "created_at")?;
        let created_at = parse_timestamptz(created_text).ok_or_else(|| {
            bad(
                "created_at",
                created_text,
                "an ISO timestamp in UTC (the replication connection sets DateStyle=ISO, TimeZone=UTC)",
            )
        })?;
        let attempts_text = text(self.attempts, "attempts")?;
        let attempts: i32 = attempts_text
            .parse()
            .map_err(|_| bad("attempts", attempts_text, "an integer"))?;
        let headers_text = text(self.headers, "headers")?;
        // As in the polling claim: corrupt headers travel as one diagnostic
        // header instead of stopping the relay.
        let headers = parse_headers(seq, headers_text).unwrap_or_else(|problem| {
            std::iter::once(("outboxd-header-error".to_string(), problem)).collect()
        });
        Ok(OutboxEvent {
            seq,
            id: EventId(id),
            aggregate_id: text(self.aggregate_id, "aggregate_id")?.to_string(),
            event_type: text(self.event_type, "event_type")?.to_string(),
            payload: text(self.payload, "payload")?.to_string(),
            headers,
            created_at,
            attempts,
            redrive_with: self
                .redrive_with
                .and_then(|i| row.get(i).cloned().flatten()),
        })
    }
}

/// `2026-12-02 15:44:13.123456+00` (DateStyle ISO, TimeZone UTC); other
/// offsets are honoured too.
fn parse_timestamptz(s: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f%#z") {
        return Some(t.with_timezone(&Utc));
    }
    // A bare timestamp (no offset) is UTC.
    NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f")
        .ok()
        .map(|t| t.and_utc())
}

/// The relations seen on one replication session, and which one is the
/// outbox.
#[derive(Debug, Default)]
pub struct Relations {
    outbox: HashMap<u32, OutboxColumns>,
    others: std::collections::HashSet<u32>,
}

impl Relations {
    /// Records a Relation message; an outbox table is recognised by its
    /// schema and name.
    pub fn learn(&mut self, relation: &Relation) -> Result<(), DecodeError> {
        if relation.namespace == crate::store::HOST_SCHEMA && relation.name == "outbox" {
            self.outbox
                .insert(relation.id, OutboxColumns::of(relation)?);
            self.others.remove(&relation.id);
        } else {
            self.outbox.remove(&relation.id);
            self.others.insert(relation.id);
        }
        Ok(())
    }

    /// The event of an inserted row: `Ok(None)` for a table other than the
    /// outbox (a publication may list more).
    pub fn event(
        &self,
        relation: u32,
        row: &[Option<String>],
    ) -> Result<Option<OutboxEvent>, DecodeError> {
        match self.outbox.get(&relation) {
            Some(columns) => columns.event(row).map(Some),
            None if self.others.contains(&relation) => Ok(None),
            None => Err(DecodeError::UnknownRelation(relation)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation(id: u32, namespace: &str, name: &str, columns: &[&str]) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(id.to_be_bytes());
        m.extend(namespace.as_bytes());
        m.push(0);
        m.extend(name.as_bytes());
        m.push(0);
        m.push(b'd');
        m.extend((columns.len() as u16).to_be_bytes());
        for c in columns {
            m.push(0);
            m.extend(c.as_bytes());
            m.push(0);
            m.extend(25u32.to_be_bytes());
            m.extend((-1i32).to_be_bytes());
        }
        m
    }

    fn insert(id: u32, values: &[Option<&str>]) -> Vec<u8> {
        let mut m = vec![b'I'];
        m.extend(id.to_be_bytes());
        m.push(b'N');
        m.extend((values.len() as u16).to_be_bytes());
        for v in values {
            match v {
                None => m.push(b'n'),
                Some(s) => {
                    m.push(b't');
                    m.extend((s.len() as u32).to_be_bytes());
                    m.extend(s.as_bytes());
                }
            }
        }
        m
    }

    const COLUMNS: &[&str] = &[
        "seq",
        "id",
        "aggregate_id",
        "event_type",
        "payload",
        "headers",
        "created_at",
        "published_at",
        "attempts",
        "redrive_with",
    ];

    fn row(seq: &str, created: &str) -> Vec<Option<&'static str>> {
        let seq: &'static str = Box::leak(seq.to_string().into_boxed_str());
        let created: &'static str = Box::leak(created.to_string().into_boxed_str());
        vec![
            Some(seq),
            Some("0b6a6c1e-8f0a-4c57-9f1e-1d0c3f6f2a10"),
            Some("order-7"),
            Some("order.created"),
            Some(r#"{"amount": 12, "big": 12345678901234567890}"#),
            Some(r#"{"traceparent": "00-abc-def-01"}"#),
            Some(created),
            None,
            Some("0"),
            None,
        ]
    }

    #[test]
    fn an_outbox_insert_becomes_the_event_the_claim_would_read() {
        let mut rels = Relations::default();
        let Message::Relation(r) =
            decode(&relation(16400, "outboxd", "outbox", COLUMNS)).expect("test value")
        else {
            panic!("not a relation")
        };
        rels.learn(&r).expect("test value");
        let Message::Insert {
            relation,
            row: values,
        } = decode(&insert(16400, &row("42", "2026-12-02 15:44:13.123456+00")))
            .expect("test value")
        else {
            panic!("not an insert")
        };
        let ev = rels
            .event(relation, &values)
            .expect("test value")
            .expect("the outbox");
        assert_eq!(ev.seq, 42);
        assert_eq!(ev.aggregate_id, "order-7");
        assert_eq!(ev.event_type, "order.created");
        // The payload is the jsonb text as stored, big numbers untouched.
        assert_eq!(ev.payload, r#"{"amount": 12, "big": 12345678901234567890}"#);
        assert_eq!(ev.headers["traceparent"], "00-abc-def-01");
        assert_eq!(
            ev.created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "2026-12-02T15:44:13.123456Z"
        );
        assert_eq!(ev.attempts, 0);
        assert_eq!(ev.redrive_with, None);
    }

    #[test]
    fn offsets_and_whole_seconds_parse() {
        assert_eq!(
            parse_timestamptz("2026-12-02 17:44:13+02").expect("test value"),
            parse_timestamptz("2026-12-02 15:44:13.000000+00").expect("test value")
        );
        assert!(parse_timestamptz("12/02/2026 15:44:13 UTC").is_none());
    }

    #[test]
    fn other_tables_are_passed_over_and_unknown_relations_are_errors() {
        let mut rels = Relations::default();
        let Message::Relation(r) =
            decode(&relation(7, "public", "outbox", &["seq"])).expect("test value")
        else {
            panic!()
        };
        rels.learn(&r).expect("test value");
        assert_eq!(rels.event(7, &[Some("1".into())]), Ok(None));
        assert_eq!(rels.event(8, &[]), Err(DecodeError::UnknownRelation(8)));
    }

    #[test]
    fn an_outbox_table_without_a_needed_column_names_it_and_the_fix() {
        let mut rels = Relations::default();
        let Message::Relation(r) =
            decode(&relation(9, "outboxd", "outbox", &["seq", "id"])).expect("test value")
        else {
            panic!()
        };
        let err = rels.learn(&r).expect_err("an error");
        assert_eq!(err, DecodeError::MissingColumn("aggregate_id"));
        assert!(err.to_string().contains("outboxd migrate"));
    }

    #[test]
    fn truncated_and_malformed_messages_are_errors_not_panics() {
        let full = insert(16400, &row("42", "2026-12-02 15:44:13+00"));
        for cut in 0..full.len() {
            // Every prefix decodes to an error (or, for the bare tag, the
            // tag's own error); none panics.
            let _ = decode(&full[..cut]);
        }
        assert_eq!(decode(&[]), Err(DecodeError::Empty));
        assert_eq!(
            decode(&[b'I', 0, 0, 0, 1, b'K']),
            Err(DecodeError::NoNewTuple('K'))
        );
        assert_eq!(
            decode(&[b'I', 0, 0, 0, 1, b'N', 0, 1, b'x']),
            Err(DecodeError::ColumnKind('x'))
        );
        assert!(matches!(decode(b"Yabc"), Ok(Message::Other(b'Y'))));
        let mut rels = Relations::default();
        let Message::Relation(r) =
            decode(&relation(1, "outboxd", "outbox", COLUMNS)).expect("test value")
        else {
            panic!()
        };
        rels.learn(&r).expect("test value");
        let mut bad = row("forty-two", "2026-12-02 15:44:13+00");
        let err = rels.event(
            1,
            &bad.iter().map(|v| v.map(String::from)).collect::<Vec<_>>(),
        );
        assert!(
            matches!(err, Err(DecodeError::BadValue { column: "seq", .. })),
            "{err:?}"
        );
        bad[0] = Some("1");
        bad[6] = Some("yesterday");
        let err = rels.event(
            1,
            &bad.iter().map(|v| v.map(String::from)).collect::<Vec<_>>(),
        );
        assert!(
            matches!(
                err,
                Err(DecodeError::BadValue {
                    column: "created_at",
                    ..
                })
            ),
            "{err:?}"
        );
    }
}
