//! Standard Webhooks signatures: `webhook-signature` is `v1,` and the
//! base64 HMAC-SHA256 of `{webhook-id}.{webhook-timestamp}.{body}` under
//! the secret's decoded bytes, one per secret, space-separated, so a
//! receiver keeps verifying while a secret is rotated.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The prefix of a Standard Webhooks secret.
const PREFIX: &str = "whsec_";

/// The signing keys of one route: the decoded bytes of each secret.
#[derive(Clone)]
pub struct SigningKeys(Vec<Vec<u8>>);

impl std::fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKeys({} key(s), ***)", self.0.len())
    }
}

impl SigningKeys {
    /// The keys of `text`: one or more space-separated `whsec_<base64>`
    /// secrets of 24 to 64 bytes each. The error never quotes a secret.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut keys = Vec::new();
        for (i, secret) in text.split_whitespace().enumerate() {
            let n = i + 1;
            let Some(b64) = secret.strip_prefix(PREFIX) else {
                return Err(format!(
                    "secret {n} does not start with `{PREFIX}`; a signing secret is `{PREFIX}` and \
                     the base64 of 24 to 64 random bytes, e.g. from \
                     `echo whsec_$(openssl rand -base64 32)`"
                ));
            };
            let key = STANDARD.decode(b64).map_err(|_| {
                format!(
                    "secret {n} is not `{PREFIX}` followed by base64 (standard alphabet, padded)"
                )
            })?;
            if !(24..=64).contains(&key.len()) {
                return Err(format!(
                    "secret {n} decodes to {} bytes; use 24 to 64 random bytes",
                    key.len()
                ));
            }
            keys.push(key);
        }
        if keys.is_empty() {
            return Err("holds no secret; put one `whsec_…` secret in it (or several, space-separated, while rotating)".into());
        }
        Ok(Self(keys))
    }

    /// The `webhook-signature` value of one request.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        self.0
            .iter()
            .map(|key| signature(key, id, timestamp, body))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// One `v1,<base64>` signature.
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// Whether `header` (a `webhook-signature` value) holds a valid `v1`
/// signature of the request under one of `keys`, as a receiver checks it.
pub fn verify(keys: &SigningKeys, header: &str, id: &str, timestamp: i64, body: &[u8]) -> bool {
    let expected: Vec<String> = keys
        .0
        .iter()
        .map(|k| signature(k, id, timestamp, body))
        .collect();
    header.split_whitespace().any(|sig| {
        expected
            .iter()
            .any(|e| constant_time_eq(e.as_bytes(), sig.as_bytes()))
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference libraries' test vector.
    const KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: i64 = 1614265330;
    const BODY: &str = r#"{"test": 2432232314}"#;
    const EXPECTED: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn the_specification_vector_signs_and_verifies() {
        let keys = SigningKeys::parse(KEY).expect("parses");
        assert_eq!(keys.sign(ID, TS, BODY.as_bytes()), EXPECTED);
        assert!(verify(&keys, EXPECTED, ID, TS, BODY.as_bytes()));
        assert!(!verify(&keys, EXPECTED, ID, TS + 1, BODY.as_bytes()));
        assert!(!verify(&keys, EXPECTED, ID, TS, br#"{"test": 2432232315}"#));
    }

    #[test]
    fn two_secrets_give_two_signatures_each_verifying() {
        let other = format!("whsec_{}", STANDARD.encode([7u8; 32]));
        let both = SigningKeys::parse(&format!("{other} {KEY}")).expect("parses");
        let header = both.sign(ID, TS, BODY.as_bytes());
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1], EXPECTED);
        let old_only = SigningKeys::parse(KEY).expect("parses");
        assert!(verify(&old_only, &header, ID, TS, BODY.as_bytes()));
    }

    #[test]
    fn bad_secrets_are_refused_without_quoting_them() {
        for (text, says) in [
            ("", "holds no secret"),
            (
                "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                "does not start with `whsec_`",
            ),
            ("whsec_!!!notbase64", "not `whsec_` followed by base64"),
            ("whsec_AAAA", "decodes to 3 bytes"),
        ] {
            let e = SigningKeys::parse(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
            if text.len() > 8 {
                assert!(!e.contains(&text[6..]), "the secret is quoted: {e}");
            }
        }
    }
}
