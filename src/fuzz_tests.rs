//! Property tests of the decoders and validators a caller reaches in this
//! crate (the HTTP/2 shim and receipt handles have theirs beside them):
//! whatever the input, an answer or a clear refusal, never a panic, and
//! what is accepted keeps the limits it was checked against.
//!
//! PROPTEST_CASES sets the count (256 unless told); a longer run is
//! `PROPTEST_CASES=100000 cargo test --lib fuzz`.

use proptest::prelude::*;
use raftmq_raft::command::{MAX_QUEUES, TopicConfig, TopicMessageType};
use raftmq_raft::held::{HeldId, TimerKey};
use raftmq_raft::message::MessageView;
use raftmq_raft::secret::GroupSecret;

use crate::broker::held::{timers, transactions};
use crate::broker::seal::Seal;
use crate::filter::Filter;
use crate::namesrv::registry;
use crate::proto::pb;
use crate::proto::rocketmq::v2;
use crate::proto::v2_message::{self, Limits};

/// Text as a caller might send it: printable, unicode, control characters.
fn text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::string::string_regex(&format!("[a-zA-Z0-9_%|-]{{0,{max}}}")).unwrap(),
        proptest::string::string_regex(&format!("[ -~]{{0,{max}}}")).unwrap(),
        proptest::string::string_regex(&format!(".{{0,{max}}}")).unwrap(),
    ]
}

fn queues() -> impl Strategy<Value = u32> {
    prop_oneof![
        0u32..16,
        Just(MAX_QUEUES),
        Just(MAX_QUEUES + 1),
        Just(u32::MAX),
        any::<u32>()
    ]
}

fn topic_data() -> impl Strategy<Value = pb::TopicData> {
    (
        text(140),
        queues(),
        queues(),
        any::<u32>(),
        prop_oneof![Just(String::new()), Just("FIFO".to_string()), text(10)],
    )
        .prop_map(|(name, read_queues, write_queues, perm, message_type)| pb::TopicData {
            name,
            read_queues,
            write_queues,
            perm,
            message_type,
        })
}

fn v2_message() -> impl Strategy<Value = v2::Message> {
    (
        text(140),
        text(80),
        proptest::option::of(text(40)),
        proptest::collection::vec(text(40), 0..4),
        proptest::collection::btree_map(text(20), text(40), 0..4),
        proptest::option::of(text(40)),
        0i32..7,
        proptest::option::of(any::<i64>()),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(
            |(topic, id, tag, keys, props, group, kind, delivery, body)| v2::Message {
                topic: Some(v2::Resource {
                    resource_namespace: String::new(),
                    name: topic,
                }),
                user_properties: props.into_iter().collect(),
                system_properties: Some(v2::SystemProperties {
                    message_id: id,
                    tag,
                    keys,
                    message_group: group,
                    message_type: kind,
                    delivery_timestamp: delivery.map(|s| prost_types::Timestamp { seconds: s, nanos: 0 }),
                    ..Default::default()
                }),
                body: body.into(),
            },
        )
}

fn seal() -> Seal {
    Seal::new(GroupSecret::from_bytes([9; 32]))
}

/// One thing that happens to a NameServer's registry.
#[derive(Debug, Clone)]
enum RegistryStep {
    Beat(pb::BrokerHeartbeat, Option<std::net::IpAddr>),
    Unregister(String, String, u64, Option<std::net::IpAddr>),
    Expire(u64),
}

fn registry_step() -> impl Strategy<Value = RegistryStep> {
    let name =
        |names: &'static [&'static str]| prop_oneof![proptest::sample::select(names).prop_map(str::to_string), text(8)];
    let node = prop_oneof![0u64..20, Just(u64::MAX)];
    let from = proptest::option::of(prop_oneof![
        Just(std::net::IpAddr::from([10, 0, 0, 1])),
        Just(std::net::IpAddr::from([10, 0, 0, 2])),
    ]);
    let beat = (
        name(&["c1", "c2"]),
        name(&["g1", "g2", "g3"]),
        node.clone(),
        name(&["leader", "follower", "learner", "candidate"]),
        any::<u64>(),
        name(&["10.0.0.1:8081", "10.0.0.2:8081", "b-0.b:8081"]),
        proptest::collection::vec(topic_data(), 0..3),
        any::<u64>(),
        from.clone(),
    )
        .prop_map(
            |(cluster, group, node_id, role, term, addr, topics, applied_index, from)| {
                RegistryStep::Beat(
                    pb::BrokerHeartbeat {
                        cluster,
                        group,
                        node_id,
                        role,
                        term,
                        client_addr: addr.clone(),
                        raft_addr: addr,
                        applied_index,
                        topics,
                        ..Default::default()
                    },
                    from,
                )
            },
        );
    prop_oneof![
        6 => beat,
        1 => (name(&["c1"]), name(&["g1", "g2"]), node, from)
            .prop_map(|(c, g, n, f)| RegistryStep::Unregister(c, g, n, f)),
        1 => (0u64..200).prop_map(RegistryStep::Expire),
    ]
}

proptest! {
    /// A NameServer heartbeat: what passes builds bounded routes.
    #[test]
    fn heartbeats(cluster in text(140), group in text(140), role in text(10), addr in text(30),
                  topics in proptest::collection::vec(topic_data(), 0..4)) {
        let hb = pb::BrokerHeartbeat {
            cluster,
            group,
            node_id: 1,
            role,
            term: 1,
            client_addr: addr.clone(),
            raft_addr: addr,
            topics,
            ..Default::default()
        };
        if registry::validate(&hb).is_ok() {
            for t in &hb.topics {
                prop_assert!(t.read_queues <= MAX_QUEUES && t.write_queues <= MAX_QUEUES);
            }
        }
    }

    /// Heartbeats (validated first, as the service does), unregistrations
    /// and expiries in any order: the registry never panics, and every
    /// route it answers stays within its bounds, with one leader at most
    /// per group.
    #[test]
    fn registry_sequences(steps in proptest::collection::vec(registry_step(), 0..24)) {
        let mut r = registry::Registry::default();
        let t0 = std::time::Instant::now();
        for (i, step) in steps.into_iter().enumerate() {
            let now = t0 + std::time::Duration::from_secs(i as u64 * 10);
            match step {
                RegistryStep::Beat(hb, from) => {
                    if registry::validate(&hb).is_ok() {
                        let _ = r.heartbeat(hb, from, now);
                    }
                }
                RegistryStep::Unregister(c, g, n, from) => {
                    let _ = r.unregister(&c, &g, n, from);
                }
                RegistryStep::Expire(secs) => {
                    r.expire(now, std::time::Duration::from_secs(secs));
                }
            }
            for topic in r.topic_names() {
                let Some(route) = r.route(&topic) else { continue };
                prop_assert!(route.groups.len() <= registry::MAX_GROUPS);
                for g in &route.groups {
                    let q = g.queues.as_ref().expect("a route names its queues");
                    prop_assert!(q.read_queues <= MAX_QUEUES && q.write_queues <= MAX_QUEUES);
                    prop_assert!(g.nodes.len() <= registry::MAX_NODES_PER_GROUP);
                    prop_assert!(g.nodes.iter().filter(|n| n.leader).count() <= 1);
                }
            }
            let _ = r.cluster_info(now);
        }
    }

    /// A producer's message through validation: an accepted one is one the
    /// log accepts.
    #[test]
    fn v2_messages(m in v2_message(), fifo: bool) {
        let topic = TopicConfig {
            name: "T".into(),
            read_queues: 4,
            write_queues: 4,
            perm: 6,
            message_type: if fifo { TopicMessageType::Fifo } else { TopicMessageType::Mixed },
        };
        let limits = Limits { max_body: 32, now_ms: 1_700_000_000_000, max_delay_ms: 86_400_000, delay_levels_ms: &[1000, 5000] };
        if let Ok(out) = v2_message::incoming(m, &topic, &limits) {
            prop_assert!(out.message.validate().is_ok(), "{:?}", out.message);
            prop_assert!(out.message.body.len() <= 32);
        }
    }

    /// Raw bytes as a SendMessageRequest: prost refuses or the messages go
    /// through validation.
    #[test]
    fn v2_send_requests(raw in proptest::collection::vec(any::<u8>(), 0..256)) {
        use prost::Message as _;
        if let Ok(req) = v2::SendMessageRequest::decode(raw.as_slice()) {
            let topic = TopicConfig { name: "T".into(), read_queues: 1, write_queues: 1, perm: 6, message_type: TopicMessageType::Mixed };
            let limits = Limits { max_body: 1 << 20, now_ms: 0, max_delay_ms: 1, delay_levels_ms: &[] };
            for m in req.messages {
                let _ = v2_message::incoming(m, &topic, &limits);
            }
        }
    }

    /// Tag and SQL92 filters: parsed or refused, and a parsed one checks
    /// any message without a panic.
    #[test]
    fn filters(expr in text(200), sql in "[a-zA-Z0-9 ()=<>!'.,_-]{0,120}", m in v2_message()) {
        let _ = Filter::tags(&expr);
        let topic = TopicConfig { name: "T".into(), read_queues: 1, write_queues: 1, perm: 6, message_type: TopicMessageType::Mixed };
        let limits = Limits { max_body: 1 << 20, now_ms: 0, max_delay_ms: 1, delay_levels_ms: &[] };
        let Ok(out) = v2_message::incoming(m, &topic, &limits) else { return Ok(()) };
        let mut stored = Vec::new();
        out.message.encode(1, &mut stored);
        let (view, _) = MessageView::parse(&stored).unwrap();
        for f in [Filter::sql(&sql), Filter::sql(&expr), Filter::tags(&expr)].into_iter().flatten() {
            let _ = f.matches(&view);
        }
    }

    /// Transaction ids and recall handles: only sealed ones decode, and
    /// each names what it was made for.
    #[test]
    fn transaction_ids_and_recall_handles(s in text(200), index: u64, ordinal: u32, due: u64, id in "[A-Z0-9]{1,32}") {
        prop_assert_eq!(transactions::parse_transaction_id(&seal(), "T", "M", &s), None);
        prop_assert_eq!(timers::parse_recall_handle(&seal(), "T", &s), None);
        let held = HeldId { index, ordinal };
        let t = transactions::transaction_id(&seal(), "T", &id, held);
        prop_assert_eq!(transactions::parse_transaction_id(&seal(), "T", &id, &t), Some(held));
        let key = TimerKey { due_ms: due, id: held };
        let h = timers::recall_handle(&seal(), "T", &key, &id);
        prop_assert_eq!(timers::parse_recall_handle(&seal(), "T", &h), Some((key, id.as_str())));
    }
}
