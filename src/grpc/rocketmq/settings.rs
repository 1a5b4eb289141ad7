//! The settings a broker answers a client's Telemetry `Settings` with: the
//! client's own, completed with what the broker decides. The official
//! clients depend on these: a producer rejects every send while its
//! `max_body_size` is 0, a push consumer long-polls only as long as
//! `long_polling_timeout` says and learns its retry schedule and maximum
//! attempts from `backoff_policy`.

use std::time::Duration;

use raftmq_raft::consumption::GroupConfig;

use crate::broker::config::BrokerConfig;
use crate::proto::rocketmq::v2;
use crate::proto::v2_message::duration;

/// RocketMQ's redelivery delays after a failed consumption: delay levels 3
/// to 18 (10 s, 30 s, 1 min ... 2 h).
pub const RETRY_DELAYS_S: [u64; 16] = [
    10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
];
/// Messages a push consumer asks for per receive.
pub const RECEIVE_BATCH_SIZE: i32 = 32;
/// Send attempts a producer makes (RocketMQ's default is 3; a failover
/// costs a client one or two, so allow a few more).
pub const PRODUCER_MAX_ATTEMPTS: i32 = 5;

/// The effective settings for a client that sent `s`. `group` is the
/// consumer group's configuration (consumers only).
pub fn effective(s: &v2::Settings, cfg: &BrokerConfig, group: Option<&GroupConfig>) -> v2::Settings {
    let mut out = s.clone();
    out.metric = Some(v2::Metric {
        on: false,
        endpoints: None,
    });
    match out.pub_sub.take() {
        Some(v2::settings::PubSub::Publishing(mut p)) => {
            p.max_body_size = cfg.max_body_bytes.min(i32::MAX as usize) as i32;
            p.validate_message_type = true;
            out.backoff_policy = Some(v2::RetryPolicy {
                max_attempts: PRODUCER_MAX_ATTEMPTS,
                strategy: Some(v2::retry_policy::Strategy::ExponentialBackoff(v2::ExponentialBackoff {
                    initial: Some(duration(Duration::from_millis(10))),
                    max: Some(duration(Duration::from_secs(1))),
                    multiplier: 2.0,
                })),
            });
            out.pub_sub = Some(v2::settings::PubSub::Publishing(p));
        }
        Some(v2::settings::PubSub::Subscription(mut sub)) => {
            if let Some(g) = group {
                sub.fifo = Some(g.fifo);
                out.backoff_policy = Some(v2::RetryPolicy {
                    max_attempts: g.max_delivery_attempts.min(i32::MAX as u32) as i32,
                    strategy: Some(v2::retry_policy::Strategy::CustomizedBackoff(v2::CustomizedBackoff {
                        next: RETRY_DELAYS_S
                            .iter()
                            .map(|s| duration(Duration::from_secs(*s)))
                            .collect(),
                    })),
                });
            }
            sub.receive_batch_size = Some(RECEIVE_BATCH_SIZE);
            sub.long_polling_timeout = Some(duration(Duration::from_millis(cfg.long_polling_timeout_ms)));
            out.pub_sub = Some(v2::settings::PubSub::Subscription(sub));
        }
        None => {}
    }
    out
}
