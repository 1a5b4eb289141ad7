//! What each `apache.rocketmq.v2` call needs under ACL (`[acl]`), as
//! RocketMQ 5's proxy asks it: sending needs `Pub` on the topic; receiving,
//! acknowledging and offsets need `Sub` on the topic and on the group.
//! Where RocketMQ checks less, this checks more: every topic of a send
//! (not only the first message's), and the topic of an invisibility
//! change.

use raftmq_raft::acl::{Action, Check, ResourceType};

use crate::proto::rocketmq::v2;

const PUB: &[Action] = &[Action::Pub];
const SUB: &[Action] = &[Action::Sub];
/// A route serves both producers and consumers.
const PUB_OR_SUB: &[Action] = &[Action::Pub, Action::Sub];

/// A request that knows what it needs.
pub trait Guarded {
    fn checks(&self) -> Vec<Check>;
}

fn name(r: Option<&v2::Resource>) -> String {
    r.map(|r| r.name.clone()).unwrap_or_default()
}

fn topic(r: Option<&v2::Resource>, actions: &'static [Action]) -> Check {
    Check {
        kind: ResourceType::Topic,
        name: name(r),
        actions,
    }
}

fn group(r: Option<&v2::Resource>) -> Check {
    Check {
        kind: ResourceType::Group,
        name: name(r),
        actions: SUB,
    }
}

fn queue_topic(q: Option<&v2::MessageQueue>) -> Option<&v2::Resource> {
    q.and_then(|q| q.topic.as_ref())
}

impl Guarded for v2::QueryRouteRequest {
    fn checks(&self) -> Vec<Check> {
        vec![topic(self.topic.as_ref(), PUB_OR_SUB)]
    }
}

impl Guarded for v2::HeartbeatRequest {
    fn checks(&self) -> Vec<Check> {
        use v2::ClientType as T;
        let consumer = matches!(
            T::try_from(self.client_type),
            Ok(T::PushConsumer | T::SimpleConsumer | T::PullConsumer | T::LitePushConsumer)
        );
        match &self.group {
            Some(g) if consumer && !g.name.is_empty() => vec![group(Some(g))],
            _ => vec![],
        }
    }
}

impl Guarded for v2::SendMessageRequest {
    fn checks(&self) -> Vec<Check> {
        let mut out: Vec<Check> = Vec::new();
        for m in &self.messages {
            let c = topic(m.topic.as_ref(), PUB);
            if !out.contains(&c) {
                out.push(c);
            }
        }
        out
    }
}

impl Guarded for v2::QueryAssignmentRequest {
    fn checks(&self) -> Vec<Check> {
        vec![group(self.group.as_ref()), topic(self.topic.as_ref(), SUB)]
    }
}

impl Guarded for v2::ReceiveMessageRequest {
    fn checks(&self) -> Vec<Check> {
        vec![
            group(self.group.as_ref()),
            topic(queue_topic(self.message_queue.as_ref()), SUB),
        ]
    }
}

impl Guarded for v2::AckMessageRequest {
    fn checks(&self) -> Vec<Check> {
        vec![group(self.group.as_ref()), topic(self.topic.as_ref(), SUB)]
    }
}

impl Guarded for v2::ForwardMessageToDeadLetterQueueRequest {
    fn checks(&self) -> Vec<Check> {
        vec![group(self.group.as_ref()), topic(self.topic.as_ref(), SUB)]
    }
}

impl Guarded for v2::ChangeInvisibleDurationRequest {
    fn checks(&self) -> Vec<Check> {
        vec![group(self.group.as_ref()), topic(self.topic.as_ref(), SUB)]
    }
}

impl Guarded for v2::PullMessageRequest {
    fn checks(&self) -> Vec<Check> {
        vec![
            group(self.group.as_ref()),
            topic(queue_topic(self.message_queue.as_ref()), SUB),
        ]
    }
}

impl Guarded for v2::UpdateOffsetRequest {
    fn checks(&self) -> Vec<Check> {
        vec![
            group(self.group.as_ref()),
            topic(queue_topic(self.message_queue.as_ref()), SUB),
        ]
    }
}

impl Guarded for v2::GetOffsetRequest {
    fn checks(&self) -> Vec<Check> {
        vec![
            group(self.group.as_ref()),
            topic(queue_topic(self.message_queue.as_ref()), SUB),
        ]
    }
}

impl Guarded for v2::QueryOffsetRequest {
    fn checks(&self) -> Vec<Check> {
        vec![topic(queue_topic(self.message_queue.as_ref()), SUB)]
    }
}

impl Guarded for v2::EndTransactionRequest {
    fn checks(&self) -> Vec<Check> {
        vec![topic(self.topic.as_ref(), PUB)]
    }
}

impl Guarded for v2::RecallMessageRequest {
    fn checks(&self) -> Vec<Check> {
        vec![topic(self.topic.as_ref(), PUB)]
    }
}

impl Guarded for v2::NotifyClientTerminationRequest {
    fn checks(&self) -> Vec<Check> {
        match &self.group {
            Some(g) if !g.name.is_empty() => vec![group(Some(g))],
            _ => vec![],
        }
    }
}

impl Guarded for v2::SyncLiteSubscriptionRequest {
    fn checks(&self) -> Vec<Check> {
        vec![group(self.group.as_ref()), topic(self.topic.as_ref(), SUB)]
    }
}

/// A client's Telemetry settings: a producer that names a topic receives
/// the check-backs (with message bodies) of that topic's transactions, so
/// it needs `Pub` on each; a consumer's subscription needs `Sub` on the
/// group and on each topic, as its receives do.
impl Guarded for v2::Settings {
    fn checks(&self) -> Vec<Check> {
        // As many as the broker keeps of a client (the rest are dropped
        // unseen), so that a long list cannot make a long check.
        let cap = crate::broker::clients::MAX_CLIENT_TOPICS;
        match &self.pub_sub {
            Some(v2::settings::PubSub::Publishing(p)) => {
                p.topics.iter().take(cap).map(|t| topic(Some(t), PUB)).collect()
            }
            Some(v2::settings::PubSub::Subscription(s)) => std::iter::once(group(s.group.as_ref()))
                .chain(s.subscriptions.iter().take(cap).map(|e| topic(e.topic.as_ref(), SUB)))
                .collect(),
            None => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(n: &str) -> Option<v2::Resource> {
        Some(v2::Resource {
            resource_namespace: String::new(),
            name: n.into(),
        })
    }

    #[test]
    fn sends_need_pub_on_every_topic_and_receives_sub_on_both() {
        let msg = |t: &str| v2::Message {
            topic: res(t),
            ..Default::default()
        };
        let send = v2::SendMessageRequest {
            messages: vec![msg("a"), msg("b"), msg("a")],
        };
        let names: Vec<String> = send.checks().into_iter().map(|c| c.to_string()).collect();
        assert_eq!(names, ["Pub on Topic:a", "Pub on Topic:b"]);
        let receive = v2::ReceiveMessageRequest {
            group: res("g"),
            message_queue: Some(v2::MessageQueue {
                topic: res("t"),
                ..Default::default()
            }),
            ..Default::default()
        };
        let names: Vec<String> = receive.checks().into_iter().map(|c| c.to_string()).collect();
        assert_eq!(names, ["Sub on Group:g", "Sub on Topic:t"]);
        let producer = v2::HeartbeatRequest {
            group: res("g"),
            client_type: v2::ClientType::Producer as i32,
        };
        assert!(producer.checks().is_empty());
    }

    #[test]
    fn telemetry_settings_need_what_their_calls_would() {
        let publishing = v2::Settings {
            pub_sub: Some(v2::settings::PubSub::Publishing(v2::Publishing {
                topics: vec![res("a").unwrap(), res("b").unwrap()],
                ..Default::default()
            })),
            ..Default::default()
        };
        let names: Vec<String> = publishing.checks().into_iter().map(|c| c.to_string()).collect();
        assert_eq!(names, ["Pub on Topic:a", "Pub on Topic:b"]);
        let subscription = v2::Settings {
            pub_sub: Some(v2::settings::PubSub::Subscription(v2::Subscription {
                group: res("g"),
                subscriptions: vec![v2::SubscriptionEntry {
                    topic: res("t"),
                    expression: None,
                }],
                ..Default::default()
            })),
            ..Default::default()
        };
        let names: Vec<String> = subscription.checks().into_iter().map(|c| c.to_string()).collect();
        assert_eq!(names, ["Sub on Group:g", "Sub on Topic:t"]);
    }
}
