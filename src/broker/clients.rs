//! The clients a node knows: who they are (client id, type, group, the
//! address they speak from), when they last spoke, and their Telemetry
//! stream, on which the broker can send them commands (transaction
//! check-backs).
//!
//! Soft state, per node: a client heartbeats every node it talks to, so each
//! node knows the clients that use it. Entries silent for [`CLIENT_TTL`]
//! are dropped.
//!
//! A client id belongs to the [`Owner`] that first used it, for as long as
//! its entry lives: the IP address it speaks from and, under ACL, the user
//! it authenticated as. A caller elsewhere, or another user on the same
//! host, cannot take over another client's Telemetry stream (and with it
//! the check-backs of its transactions, with their message bodies), nor
//! say goodbye in its name. The official clients make their ids from host
//! name, process id and start time, so a real client never meets this. At
//! most `limits.max_clients` ids are tracked.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::error::BrokerError;
use crate::proto::rocketmq::v2;
use crate::proto::rocketmq::v2::Code;

/// A client silent this long is forgotten (RocketMQ: 120 s).
pub const CLIENT_TTL: Duration = Duration::from_secs(120);
/// Longest client id accepted (the official clients' are under 64 bytes).
pub const MAX_CLIENT_ID_LEN: usize = 128;
/// Expired entries are looked for at most this often (the sweep walks them
/// all).
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Topics a producer, and subscriptions a consumer, is remembered with at
/// most (both come from the client's settings); names and expressions
/// are cut at the filter bound.
pub const MAX_CLIENT_TOPICS: usize = 1024;
const MAX_EXPRESSION_LEN: usize = 4096;

/// One subscription of a consumer, as its settings name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub topic: String,
    /// "TAG" or "SQL".
    pub expression_type: String,
    pub expression: String,
}

/// Who a client id belongs to (see [`crate::broker::auth::owner_of`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    /// The address it speaks from (none: a caller tonic could not name).
    pub ip: Option<IpAddr>,
    /// The user it authenticated as, under ACL (a member node: `node:<group>/<id>`).
    pub user: Option<String>,
}

/// Sends server commands down a client's Telemetry stream.
pub type TelemetrySender = mpsc::Sender<Result<v2::TelemetryCommand, tonic::Status>>;

#[derive(Debug, Clone)]
pub struct ClientInfo {
    pub client_type: v2::ClientType,
    /// Consumer group, or producer group where the client names one.
    pub group: Option<String>,
    pub language: String,
    /// The client library's version, as it reports it.
    pub version: String,
    /// Who the id belongs to.
    pub owner: Owner,
    pub last_seen: Instant,
    /// The client's current Telemetry stream (its id, its sender).
    pub telemetry: Option<(u64, TelemetrySender)>,
    /// Topics a producer said it publishes to (its settings).
    pub topics: Vec<String>,
    /// What a consumer said it subscribes to (its settings).
    pub subscriptions: Vec<Subscription>,
    /// Messages delivered to it, and acknowledged by it, through this node
    /// (mqadmin consumerStatus's per-client numbers).
    pub received: u64,
    pub acked: u64,
    pub last_receive: Option<Instant>,
}

struct Table {
    clients: HashMap<String, ClientInfo>,
    swept: Instant,
}

pub struct Clients {
    inner: Mutex<Table>,
    max: usize,
}

/// Checks a client id from the `x-mq-client-id` header.
pub fn validate_id(id: &str) -> Result<(), BrokerError> {
    if id.is_empty() {
        return Err(BrokerError::Refused(
            Code::ClientIdRequired,
            "the x-mq-client-id header is missing".into(),
        ));
    }
    if id.len() > MAX_CLIENT_ID_LEN || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(BrokerError::Refused(
            Code::BadRequest,
            format!("a client id is at most {MAX_CLIENT_ID_LEN} printable ASCII characters"),
        ));
    }
    Ok(())
}

impl Clients {
    pub fn new(max: usize) -> Clients {
        Clients {
            inner: Mutex::new(Table {
                clients: HashMap::new(),
                swept: Instant::now(),
            }),
            max,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, ClientInfo>) -> R) -> R {
        let mut t = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        if now.duration_since(t.swept) >= SWEEP_EVERY {
            t.clients.retain(|_, c| now.duration_since(c.last_seen) < CLIENT_TTL);
            t.swept = now;
        }
        f(&mut t.clients)
    }

    /// The entry of `id` if `owner` may use it.
    fn owned<'a>(
        m: &'a mut HashMap<String, ClientInfo>,
        id: &str,
        owner: &Owner,
    ) -> Result<Option<&'a mut ClientInfo>, BrokerError> {
        match m.get_mut(id) {
            Some(c) if c.owner != *owner && Instant::now().duration_since(c.last_seen) < CLIENT_TTL => {
                let by = if c.owner.ip != owner.ip {
                    "a client at another address"
                } else {
                    "another user"
                };
                Err(BrokerError::Refused(
                    Code::Forbidden,
                    format!("client id {id} is in use by {by}"),
                ))
            }
            c => Ok(c),
        }
    }

    /// Records that a client spoke (heartbeat or settings) as `owner`.
    pub fn seen(
        &self,
        id: &str,
        owner: &Owner,
        client_type: v2::ClientType,
        group: Option<String>,
        language: &str,
        version: &str,
    ) -> Result<(), BrokerError> {
        validate_id(id)?;
        self.with(|m| {
            let now = Instant::now();
            let e = match Self::owned(m, id, owner)? {
                Some(e) => e,
                None => {
                    if m.len() >= self.max {
                        return Err(BrokerError::Refused(
                            Code::TooManyRequests,
                            format!("this node tracks {} clients, its limit (limits.max_clients)", m.len()),
                        ));
                    }
                    m.insert(
                        id.to_string(),
                        ClientInfo {
                            client_type,
                            group: None,
                            language: String::new(),
                            version: String::new(),
                            owner: owner.clone(),
                            last_seen: now,
                            telemetry: None,
                            topics: Vec::new(),
                            subscriptions: Vec::new(),
                            received: 0,
                            acked: 0,
                            last_receive: None,
                        },
                    );
                    m.get_mut(id).expect("just inserted")
                }
            };
            // An expired entry that was not swept yet is taken over whole.
            if e.owner != *owner {
                e.owner = owner.clone();
            }
            e.last_seen = now;
            // Bounded: both come from the client.
            if !language.is_empty() {
                e.language = language.chars().take(32).collect();
            }
            if !version.is_empty() {
                e.version = version.chars().take(32).collect();
            }
            if client_type != v2::ClientType::Unspecified {
                e.client_type = client_type;
            }
            if group.as_deref().is_some_and(|g| !g.is_empty()) {
                e.group = group;
            }
            Ok(())
        })
    }

    /// Keeps a client's Telemetry stream for server commands.
    pub fn attach(&self, id: &str, owner: &Owner, stream: u64, tx: TelemetrySender) -> Result<(), BrokerError> {
        self.with(|m| {
            if let Some(c) = Self::owned(m, id, owner)? {
                c.telemetry = Some((stream, tx));
            }
            Ok(())
        })
    }

    /// Records the topics a producer publishes to.
    pub fn publishes(&self, id: &str, owner: &Owner, mut topics: Vec<String>) -> Result<(), BrokerError> {
        topics.truncate(MAX_CLIENT_TOPICS);
        self.with(|m| {
            if let Some(c) = Self::owned(m, id, owner)? {
                c.topics = topics;
            }
            Ok(())
        })
    }

    /// Records what a consumer subscribes to.
    pub fn subscribes(&self, id: &str, owner: &Owner, mut subs: Vec<Subscription>) -> Result<(), BrokerError> {
        subs.truncate(MAX_CLIENT_TOPICS);
        for s in &mut subs {
            s.expression = s.expression.chars().take(MAX_EXPRESSION_LEN).collect();
        }
        self.with(|m| {
            if let Some(c) = Self::owned(m, id, owner)? {
                c.subscriptions = subs;
            }
            Ok(())
        })
    }

    /// Counts messages delivered to a client (`received`) and acknowledged
    /// by it (`acked`) through this node; ids of other addresses count
    /// nothing.
    pub fn consumed(&self, id: &str, owner: &Owner, received: u64, acked: u64) {
        self.with(|m| {
            if let Ok(Some(c)) = Self::owned(m, id, owner) {
                c.received = c.received.saturating_add(received);
                c.acked = c.acked.saturating_add(acked);
                if received > 0 {
                    c.last_receive = Some(Instant::now());
                }
            }
        });
    }

    /// Telemetry streams of live producers of `topic`: (client id, sender).
    pub fn producers_of(&self, topic: &str) -> Vec<(String, TelemetrySender)> {
        self.with(|m| {
            m.iter()
                .filter(|(_, c)| c.client_type == v2::ClientType::Producer && c.topics.iter().any(|t| t == topic))
                .filter_map(|(id, c)| c.telemetry.as_ref().map(|(_, tx)| (id.clone(), tx.clone())))
                .collect()
        })
    }

    /// A client's Telemetry stream ended (unless a newer one replaced it).
    pub fn detach(&self, id: &str, stream: u64) {
        self.with(|m| {
            if let Some(c) = m.get_mut(id)
                && c.telemetry.as_ref().is_some_and(|(s, _)| *s == stream)
            {
                c.telemetry = None;
            }
        });
    }

    /// A client that said goodbye, from its own address.
    pub fn remove(&self, id: &str, owner: &Owner) -> Result<(), BrokerError> {
        self.with(|m| {
            if Self::owned(m, id, owner)?.is_some() {
                m.remove(id);
            }
            Ok(())
        })
    }

    /// Every live client: (client id, info).
    pub fn all(&self) -> Vec<(String, ClientInfo)> {
        self.with(|m| m.iter().map(|(k, c)| (k.clone(), c.clone())).collect())
    }

    /// Live clients of a group: (client id, info).
    pub fn of_group(&self, group: &str) -> Vec<(String, ClientInfo)> {
        self.with(|m| {
            m.iter()
                .filter(|(_, c)| c.group.as_deref() == Some(group))
                .map(|(k, c)| (k.clone(), c.clone()))
                .collect()
        })
    }

    pub fn len(&self) -> usize {
        self.with(|m| m.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Owner {
        Owner {
            ip: Some(IpAddr::from([127, 0, 0, last])),
            user: None,
        }
    }

    fn user(name: &str) -> Owner {
        Owner {
            user: Some(name.into()),
            ..ip(1)
        }
    }

    #[test]
    fn tracks_groups_and_goodbyes() {
        let c = Clients::new(100);
        let a = &ip(1);
        c.seen(
            "a",
            a,
            v2::ClientType::SimpleConsumer,
            Some("G".into()),
            "PYTHON",
            "1.0",
        )
        .unwrap();
        c.seen("b", a, v2::ClientType::Producer, None, "RUST", "1.0").unwrap();
        assert!(c.seen("", a, v2::ClientType::Producer, None, "RUST", "1.0").is_err());
        // A later heartbeat without a type or group keeps what was known.
        c.seen("a", a, v2::ClientType::Unspecified, None, "PYTHON", "1.0")
            .unwrap();
        let g = c.of_group("G");
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].1.client_type, v2::ClientType::SimpleConsumer);
        assert_eq!(c.len(), 2);
        c.remove("a", a).unwrap();
        assert!(c.of_group("G").is_empty());
        // Producers are found by topic, once they have a stream.
        c.publishes("b", a, vec!["T".into()]).unwrap();
        assert!(c.producers_of("T").is_empty());
        let (tx, _rx) = mpsc::channel(1);
        c.attach("b", a, 1, tx).unwrap();
        assert_eq!(c.producers_of("T").len(), 1);
        assert!(c.producers_of("U").is_empty());
    }

    #[test]
    fn an_id_belongs_to_its_address_and_the_table_is_bounded() {
        let c = Clients::new(2);
        c.seen("a", &ip(1), v2::ClientType::Producer, None, "JAVA", "1.0")
            .unwrap();
        c.publishes("a", &ip(1), vec!["T".into()]).unwrap();
        let (tx, _rx) = mpsc::channel(1);
        c.attach("a", &ip(1), 1, tx).unwrap();
        // Someone elsewhere cannot speak as "a", take its stream or remove it.
        let e = c
            .seen("a", &ip(2), v2::ClientType::Producer, None, "JAVA", "1.0")
            .unwrap_err();
        assert_eq!(e.v2_status().code, Code::Forbidden as i32);
        let (tx2, _rx2) = mpsc::channel(1);
        assert!(c.attach("a", &ip(2), 2, tx2).is_err());
        assert!(c.publishes("a", &ip(2), vec![]).is_err());
        assert!(c.remove("a", &ip(2)).is_err());
        assert_eq!(c.producers_of("T").len(), 1);
        // Bad ids, and more clients than the limit.
        for bad in ["x y", "\u{1}", &"x".repeat(MAX_CLIENT_ID_LEN + 1)] {
            assert!(
                c.seen(bad, &ip(1), v2::ClientType::Producer, None, "JAVA", "1.0")
                    .is_err()
            );
        }
        c.seen("b", &ip(1), v2::ClientType::Producer, None, "JAVA", "1.0")
            .unwrap();
        let e = c
            .seen("c", &ip(1), v2::ClientType::Producer, None, "JAVA", "1.0")
            .unwrap_err();
        assert_eq!(e.v2_status().code, Code::TooManyRequests as i32);
        c.remove("b", &ip(1)).unwrap();
        c.seen("c", &ip(1), v2::ClientType::Producer, None, "JAVA", "1.0")
            .unwrap();
    }

    #[test]
    fn under_acl_an_id_belongs_to_its_user_too() {
        let c = Clients::new(10);
        c.seen("a", &user("alice"), v2::ClientType::Producer, None, "JAVA", "1.0")
            .unwrap();
        // Bob, on the same host, cannot take alice's id.
        let e = c
            .seen("a", &user("bob"), v2::ClientType::Producer, None, "JAVA", "1.0")
            .unwrap_err();
        assert!(e.to_string().contains("another user"), "{e}");
        let (tx, _rx) = mpsc::channel(1);
        assert!(c.attach("a", &user("bob"), 1, tx).is_err());
        assert!(c.remove("a", &user("bob")).is_err());
        c.remove("a", &user("alice")).unwrap();
    }
}
