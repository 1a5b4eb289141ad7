//! The logins the dashboard keeps: in memory, behind a random token in an
//! `HttpOnly`, `SameSite=Strict` cookie, for [`SESSION_TTL`]; at most
//! [`MAX_SESSIONS`] at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};

use super::permissions::Permissions;
use crate::client::credentials::Credentials;

/// The session cookie's name.
pub const COOKIE: &str = "raftmq_session";
/// How long a login lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Logins kept at once; a new one past this ends the oldest.
pub const MAX_SESSIONS: usize = 4096;
/// Logins of one access key kept at once; a new one past this ends that
/// key's oldest (one user cannot push everyone else out).
pub const MAX_SESSIONS_PER_KEY: usize = 16;

struct Session {
    who: Credentials,
    /// What `who` may do, as read at login.
    may: Arc<Permissions>,
    until: Instant,
}

/// The logins, by token.
#[derive(Default)]
pub struct Sessions(Mutex<HashMap<String, Session>>);

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `who` logged in; the token for its cookie. Past
    /// [`MAX_SESSIONS_PER_KEY`] or [`MAX_SESSIONS`], the oldest login (of
    /// that key, or of all) ends.
    pub fn open(&self, who: Credentials, may: Permissions) -> String {
        let mut map = self.lock();
        let now = Instant::now();
        map.retain(|_, s| s.until > now);
        let oldest = |map: &HashMap<String, Session>, key: Option<&str>| {
            map.iter()
                .filter(|(_, s)| key.is_none_or(|k| s.who.access_key == k))
                .min_by_key(|(_, s)| s.until)
                .map(|(t, _)| t.clone())
        };
        let of_key = map.values().filter(|s| s.who.access_key == who.access_key).count();
        if of_key >= MAX_SESSIONS_PER_KEY
            && let Some(t) = oldest(&map, Some(&who.access_key))
        {
            map.remove(&t);
        }
        if map.len() >= MAX_SESSIONS
            && let Some(t) = oldest(&map, None)
        {
            map.remove(&t);
        }
        let token = hex::encode(rand::random::<[u8; 32]>());
        map.insert(
            token.clone(),
            Session {
                who,
                may: Arc::new(may),
                until: now + SESSION_TTL,
            },
        );
        token
    }

    /// The login behind `token`: who, and what they may do.
    pub fn get(&self, token: &str) -> Option<(Credentials, Arc<Permissions>)> {
        let map = self.lock();
        map.get(token)
            .filter(|s| s.until > Instant::now())
            .map(|s| (s.who.clone(), s.may.clone()))
    }

    pub fn close(&self, token: &str) {
        self.lock().remove(token);
    }
}

/// The session token a request carries, if any.
pub fn token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_found_among_other_cookies() {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, "a=1; raftmq_session=abc; b=2".parse().unwrap());
        assert_eq!(token(&h), Some("abc"));
        h.insert(header::COOKIE, "raftmq_sessionx=abc".parse().unwrap());
        assert_eq!(token(&h), None);
    }

    #[test]
    fn sessions_expire_and_close() {
        let s = Sessions::default();
        let who = Credentials {
            access_key: "u".into(),
            secret_key: "s".into(),
        };
        let t = s.open(who.clone(), Permissions::Unknown);
        assert_eq!(s.get(&t).unwrap().0.access_key, "u");
        assert!(s.get("other").is_none());
        s.close(&t);
        assert!(s.get(&t).is_none());
        // One key's logins past its share end its oldest, not others'.
        let other = s.open(
            Credentials {
                access_key: "v".into(),
                secret_key: "s".into(),
            },
            Permissions::Unknown,
        );
        let first = s.open(who.clone(), Permissions::Unknown);
        for _ in 0..MAX_SESSIONS_PER_KEY {
            s.open(who.clone(), Permissions::Unknown);
        }
        assert!(s.get(&first).is_none());
        assert!(s.get(&other).is_some());
    }
}
