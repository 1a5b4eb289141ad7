//! RocketMQ 5's request signature for gRPC (ACL 2.0), both sides: clients
//! sign with [`Credentials::sign_into`], the broker reads what a request
//! carries with [`Signed::of`] and checks it with [`Signed::verify`].
//!
//! The wire form, as the official clients send it:
//!
//! | header           | value                                                                 |
//! |------------------|-----------------------------------------------------------------------|
//! | `x-mq-date-time` | `yyyyMMdd'T'HHmmss'Z'` (the Java and Python clients write local time there, the Node client UTC) |
//! | `authorization`  | `MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex>` |
//!
//! The signature is HMAC-SHA1 keyed by the secret key over the date-time
//! text, hex-encoded (upper case from Java and Node, lower case from
//! Python: both are accepted). Only the date-time is signed, so a
//! captured header can be replayed until the broker's clock-skew window
//! refuses its date (and TLS keeps it from being captured).

use hmac::{Hmac, Mac};
use tonic::metadata::MetadataMap;

pub const AUTHORIZATION: &str = "authorization";
pub const DATE_TIME: &str = "x-mq-date-time";
const ALGORITHM: &str = "MQv2-HMAC-SHA1";
const DATE_TIME_FORMAT: &str = "%Y%m%dT%H%M%SZ";
/// The longest `authorization` value read (an access key of 64 bytes and
/// a 40-digit signature need about 130).
pub const MAX_AUTHORIZATION: usize = 1024;
/// SHA-1's output.
const SIGNATURE_LEN: usize = 20;

type HmacSha1 = Hmac<sha1::Sha1>;

/// An access key and its secret key.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

fn mac(secret: &str) -> HmacSha1 {
    // HMAC takes a key of any length.
    HmacSha1::new_from_slice(secret.as_bytes()).expect("HMAC accepts every key length")
}

impl Credentials {
    /// The two headers for a request made at `now`.
    pub fn sign(&self, now: chrono::DateTime<chrono::Utc>) -> (String, String) {
        let date_time = now.format(DATE_TIME_FORMAT).to_string();
        let mut m = mac(&self.secret_key);
        m.update(date_time.as_bytes());
        let signature = hex::encode_upper(m.finalize().into_bytes());
        (
            format!(
                "{ALGORITHM} Credential={}, SignedHeaders={DATE_TIME}, Signature={signature}",
                self.access_key
            ),
            date_time,
        )
    }

    /// Signs a request's metadata now. An access key that is no header
    /// value (not visible ASCII) signs nothing: the broker then refuses
    /// the call as unauthenticated, which says what is wrong.
    pub fn sign_into(&self, m: &mut MetadataMap) {
        let (authorization, date_time) = self.sign(chrono::Utc::now());
        if let (Ok(a), Ok(d)) = (authorization.parse(), date_time.parse()) {
            m.insert(AUTHORIZATION, a);
            m.insert(DATE_TIME, d);
        }
    }
}

/// What a request's signature headers say.
#[derive(Debug, PartialEq, Eq)]
pub struct Signed<'a> {
    pub access_key: &'a str,
    signature: [u8; SIGNATURE_LEN],
    date_time: &'a str,
}

impl<'a> Signed<'a> {
    /// Reads the headers; `Ok(None)` when the request carries no
    /// `authorization` (or one with an empty access key, as the Python
    /// client sends without credentials).
    pub fn of(m: &'a MetadataMap) -> Result<Option<Signed<'a>>, String> {
        let Some(auth) = m.get(AUTHORIZATION) else {
            return Ok(None);
        };
        let auth = auth
            .to_str()
            .map_err(|_| "the authorization header is not text".to_string())?;
        if auth.len() > MAX_AUTHORIZATION {
            return Err(format!(
                "the authorization header is longer than {MAX_AUTHORIZATION} bytes"
            ));
        }
        let Some((_, fields)) = auth.trim().split_once(' ') else {
            return Err("the authorization header is not `MQv2-HMAC-SHA1 Credential=.., Signature=..`".into());
        };
        let (mut access_key, mut signature) = (None, None);
        for field in fields.split(',').map(str::trim).filter(|f| !f.is_empty()) {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| format!("authorization field {field:?} has no `=`"))?;
            match k.trim() {
                // `<access key>` or `<access key>/<scope>`.
                "Credential" => access_key = Some(v.split('/').next().unwrap_or("").trim()),
                "Signature" => signature = Some(v.trim()),
                _ => {}
            }
        }
        let access_key = access_key.unwrap_or("");
        if access_key.is_empty() {
            return Ok(None);
        }
        let mut sig = [0u8; SIGNATURE_LEN];
        hex::decode_to_slice(signature.unwrap_or(""), &mut sig)
            .map_err(|_| "the authorization header's Signature is not 40 hex digits".to_string())?;
        let date_time = m
            .get(DATE_TIME)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| format!("a signed request needs the {DATE_TIME} header"))?;
        Ok(Some(Signed {
            access_key,
            signature: sig,
            date_time,
        }))
    }

    /// Whether `secret_key` made the signature (constant-time).
    pub fn verify(&self, secret_key: &str) -> bool {
        let mut m = mac(secret_key);
        m.update(self.date_time.as_bytes());
        m.verify_slice(&self.signature).is_ok()
    }

    /// How far the signed date-time is from `now_ms` (ms since the epoch),
    /// or None when it is not a date-time.
    pub fn skew_ms(&self, now_ms: i64) -> Option<u64> {
        let t = chrono::NaiveDateTime::parse_from_str(self.date_time, DATE_TIME_FORMAT).ok()?;
        Some(t.and_utc().timestamp_millis().abs_diff(now_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: &str, date: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(AUTHORIZATION, auth.parse().unwrap());
        m.insert(DATE_TIME, date.parse().unwrap());
        m
    }

    #[test]
    fn signs_as_the_official_clients_and_verifies_either_case() {
        let c = Credentials {
            access_key: "alice".into(),
            secret_key: "alice-secret".into(),
        };
        let now = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let (auth, date) = c.sign(now);
        assert_eq!(date, "20231114T221320Z");
        assert!(
            auth.starts_with("MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature="),
            "{auth}"
        );
        let m = headers(&auth, &date);
        let s = Signed::of(&m).unwrap().unwrap();
        assert_eq!(s.access_key, "alice");
        assert!(s.verify("alice-secret"));
        assert!(!s.verify("alice-secreT"));
        assert_eq!(s.skew_ms(1_700_000_000_000 + 5_000), Some(5_000));
        // The Python client's lower-case hex.
        let lower = headers(
            &auth.replace(&auth[auth.len() - 40..], &auth[auth.len() - 40..].to_lowercase()),
            &date,
        );
        assert!(Signed::of(&lower).unwrap().unwrap().verify("alice-secret"));
        // A date-time other than the one signed.
        let other = headers(&auth, "20231114T221321Z");
        assert!(!Signed::of(&other).unwrap().unwrap().verify("alice-secret"));
    }

    #[test]
    fn absent_empty_and_malformed_headers() {
        assert_eq!(Signed::of(&MetadataMap::new()), Ok(None));
        let empty = headers(
            "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=",
            "x",
        );
        assert_eq!(Signed::of(&empty), Ok(None));
        for bad in [
            "MQv2-HMAC-SHA1",
            "MQv2-HMAC-SHA1 Credential=a, Signature=zz",
            "MQv2-HMAC-SHA1 Credential=a, Signature=00",
            "MQv2-HMAC-SHA1 Credential=a, Nothing",
        ] {
            assert!(Signed::of(&headers(bad, "20231114T221320Z")).is_err(), "{bad}");
        }
        let mut no_date = MetadataMap::new();
        no_date.insert(
            AUTHORIZATION,
            format!("MQv2-HMAC-SHA1 Credential=a, Signature={}", "0".repeat(40))
                .parse()
                .unwrap(),
        );
        assert!(Signed::of(&no_date).is_err());
        let long = format!("MQv2-HMAC-SHA1 Credential={}", "a".repeat(MAX_AUTHORIZATION));
        assert!(Signed::of(&headers(&long, "x")).is_err());
    }
}
