//! `raftmq group ...`: consumer groups in every broker group, through the
//! NameServers: create and update (FIFO delivery, maximum attempts), list,
//! progress per queue (broker offset, consumer offset, lag), and offset
//! resets to a point in time.

use clap::Subcommand;

use crate::cli::connect::{channel, group_endpoints};
use crate::cli::produce::parse_duration;
use crate::proto::pb;
use crate::proto::pb::broker_client::BrokerClient;

#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// Create a consumer group in every broker group (or one, with --broker).
    Create(GroupArgs),
    /// Change a consumer group's settings: only what is given changes.
    Update(GroupUpdateArgs),
    /// List the consumer groups.
    List {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
    },
    /// The clients of a consumer group, on every node they speak to (client
    /// id, type, language, version, address, last heartbeat).
    Connections {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The consumer group.
        #[arg(long)]
        group: String,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// A consumer group's position in each queue: broker offset, consumer
    /// offset, lag, and messages in flight.
    Progress {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The consumer group.
        #[arg(long)]
        group: String,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Move a consumer group, in every queue of a topic, to the first message
    /// stored at or after a time; what is in flight is dropped.
    ResetOffset {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The consumer group.
        #[arg(long)]
        group: String,
        /// The topic whose queues move.
        #[arg(long)]
        topic: String,
        /// Milliseconds since the epoch (0: the beginning), or an age like 10m
        /// or 2h ("that long ago").
        #[arg(long)]
        to_timestamp: String,
    },
}

#[derive(Debug, clap::Args)]
pub struct GroupArgs {
    /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
    #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
    namesrv: String,
    /// Consumer group name: letters, digits, '%', '|', '_' and '-'.
    #[arg(long)]
    group: String,
    /// Deliver each queue in order: a queue's next message only after the
    /// previous one is acknowledged (FIFO consumption).
    #[arg(long)]
    fifo: bool,
    /// Deliveries before a message moves to %DLQ%<group>; 0 (the default)
    /// means the broker's max_delivery_attempts (16).
    #[arg(long, default_value_t = 0)]
    max_attempts: u32,
    /// Only this broker group.
    #[arg(long)]
    broker: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct GroupUpdateArgs {
    /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
    #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
    namesrv: String,
    /// The consumer group to change.
    #[arg(long)]
    group: String,
    /// FIFO consumption on (true) or off (false); unchanged if not given.
    #[arg(long)]
    fifo: Option<bool>,
    /// Deliveries before a message moves to %DLQ%<group>; 0 means the
    /// broker's max_delivery_attempts (16). Unchanged if not given.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Only this broker group.
    #[arg(long)]
    broker: Option<String>,
}

fn describe_group(fifo: bool, max_attempts: u32) -> String {
    format!(
        "{}, {}",
        if fifo { "FIFO" } else { "concurrent" },
        match max_attempts {
            0 => "the broker's default of deliveries".to_string(),
            n => format!("at most {n} deliveries"),
        }
    )
}

/// A time flag: milliseconds since the epoch (0: the beginning), or an age
/// with its unit ("10m": ten minutes ago).
pub fn timestamp_of(flag: &str, s: &str) -> anyhow::Result<u64> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    let age = parse_duration(s).map_err(|e| anyhow::anyhow!("{flag}: {e}, or milliseconds since the epoch"))?;
    Ok(crate::clock::now_ms().saturating_sub(age.as_millis() as u64))
}

fn print_progress(broker: &str, p: &pb::GroupProgressResponse) {
    for q in &p.queues {
        println!(
            "{:<12} {:<24} {:>5} {:>14} {:>14} {:>10} {:>9}",
            broker, q.topic, q.queue, q.broker_offset, q.consumer_offset, q.lag, q.inflight
        );
    }
}

fn progress_header() {
    println!(
        "{:<12} {:<24} {:>5} {:>14} {:>14} {:>10} {:>9}",
        "broker", "topic", "queue", "broker offset", "consumer off.", "lag", "inflight"
    );
}

pub async fn run(cmd: GroupCommand) -> anyhow::Result<()> {
    match cmd {
        GroupCommand::Update(a) => {
            crate::broker::pop::validate_group(&a.group).map_err(|e| anyhow::anyhow!("--group: {e}"))?;
            if a.fifo.is_none() && a.max_attempts.is_none() {
                anyhow::bail!("nothing to change: give --fifo true|false or --max-attempts");
            }
            let mut current = Vec::new();
            for (broker, addr) in group_endpoints(&a.namesrv, a.broker.as_deref()).await? {
                let old = match BrokerClient::new(channel(&addr)?)
                    .get_consumer_group(pb::GetConsumerGroupRequest { name: a.group.clone() })
                    .await
                {
                    Ok(g) => g.into_inner(),
                    Err(s) if s.code() == tonic::Code::NotFound => {
                        anyhow::bail!("no such consumer group: {} in broker group {broker}", a.group)
                    }
                    Err(s) => anyhow::bail!("broker group {broker}: {}", s.message()),
                };
                current.push((broker, addr, old));
            }
            for (broker, addr, old) in current {
                let fifo = a.fifo.unwrap_or(old.fifo);
                let max = a.max_attempts.unwrap_or(old.max_delivery_attempts);
                BrokerClient::new(channel(&addr)?)
                    .put_consumer_group(pb::PutConsumerGroupRequest {
                        name: a.group.clone(),
                        fifo,
                        max_delivery_attempts: max,
                    })
                    .await
                    .map_err(|s| anyhow::anyhow!("broker group {broker}: {}", s.message()))?;
                let before = describe_group(old.fifo, old.max_delivery_attempts);
                let after = describe_group(fifo, max);
                if before == after {
                    println!(
                        "consumer group {} in broker group {broker}: unchanged ({after})",
                        a.group
                    );
                } else {
                    println!(
                        "consumer group {} in broker group {broker}: {before} -> {after}",
                        a.group
                    );
                }
            }
        }
        GroupCommand::Create(a) => {
            crate::broker::pop::validate_group(&a.group).map_err(|e| anyhow::anyhow!("--group: {e}"))?;
            for (broker, addr) in group_endpoints(&a.namesrv, a.broker.as_deref()).await? {
                BrokerClient::new(channel(&addr)?)
                    .put_consumer_group(pb::PutConsumerGroupRequest {
                        name: a.group.clone(),
                        fifo: a.fifo,
                        max_delivery_attempts: a.max_attempts,
                    })
                    .await
                    .map_err(|s| anyhow::anyhow!("broker group {broker}: {}", s.message()))?;
                println!(
                    "consumer group {} in broker group {broker}: {}{}",
                    a.group,
                    if a.fifo { "FIFO" } else { "concurrent" },
                    if a.max_attempts > 0 {
                        format!(", at most {} deliveries", a.max_attempts)
                    } else {
                        String::new()
                    }
                );
            }
        }
        GroupCommand::List { namesrv } => {
            println!(
                "{:<12} {:<32} {:<10} {:>12}",
                "broker", "consumer group", "delivery", "max attempts"
            );
            for (broker, addr) in group_endpoints(&namesrv, None).await? {
                let list = BrokerClient::new(channel(&addr)?)
                    .list_consumer_groups(pb::ListConsumerGroupsRequest {})
                    .await
                    .map_err(|s| anyhow::anyhow!("broker group {broker}: {}", s.message()))?
                    .into_inner();
                for g in list.groups {
                    println!(
                        "{:<12} {:<32} {:<10} {:>12}",
                        broker,
                        g.name,
                        if g.fifo { "FIFO" } else { "concurrent" },
                        g.max_delivery_attempts
                    );
                }
            }
        }
        GroupCommand::Connections { namesrv, group, json } => {
            super::connections::consumers(&namesrv, &group, json).await?
        }
        GroupCommand::Progress { namesrv, group, json } => {
            crate::broker::pop::validate_group(&group).map_err(|e| anyhow::anyhow!("--group: {e}"))?;
            let brokers = group_endpoints(&namesrv, None).await?;
            // A typo is an error, not an empty table.
            let mut known = false;
            for (broker, addr) in &brokers {
                match BrokerClient::new(channel(addr)?)
                    .get_consumer_group(pb::GetConsumerGroupRequest { name: group.clone() })
                    .await
                {
                    Ok(_) => known = true,
                    Err(s) if s.code() == tonic::Code::NotFound => {}
                    Err(s) => anyhow::bail!("broker group {broker}: {}", s.message()),
                }
            }
            if !known {
                anyhow::bail!("no such consumer group: {group}");
            }
            let mut all = Vec::new();
            for (broker, addr) in brokers {
                let p = BrokerClient::new(channel(&addr)?)
                    .group_progress(pb::GroupProgressRequest { group: group.clone() })
                    .await
                    .map_err(|s| anyhow::anyhow!("broker group {broker}: {}", s.message()))?
                    .into_inner();
                all.push((broker, p));
            }
            if json {
                let queues: Vec<serde_json::Value> = all
                    .iter()
                    .flat_map(|(b, p)| {
                        p.queues.iter().map(move |q| {
                            serde_json::json!({
                                "broker": b, "topic": q.topic, "queue": q.queue,
                                "broker_offset": q.broker_offset, "consumer_offset": q.consumer_offset,
                                "lag": q.lag, "inflight": q.inflight,
                            })
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({ "group": group, "queues": queues }))?
                );
            } else {
                progress_header();
                for (b, p) in &all {
                    print_progress(b, p);
                }
                let lag: u64 = all.iter().flat_map(|(_, p)| &p.queues).map(|q| q.lag).sum();
                println!("total lag: {lag}");
            }
        }
        GroupCommand::ResetOffset {
            namesrv,
            group,
            topic,
            to_timestamp,
        } => {
            crate::broker::pop::validate_group(&group).map_err(|e| anyhow::anyhow!("--group: {e}"))?;
            raftmq_store::queue_table::validate_topic(&topic).map_err(|e| anyhow::anyhow!("--topic: {e}"))?;
            let ts = timestamp_of("--to-timestamp", &to_timestamp)?;
            let mut rows = Vec::new();
            for (broker, addr) in group_endpoints(&namesrv, None).await? {
                let p = BrokerClient::new(channel(&addr)?)
                    .reset_offset(pb::ResetOffsetRequest {
                        group: group.clone(),
                        topic: topic.clone(),
                        timestamp_ms: ts,
                    })
                    .await;
                match p {
                    Ok(p) => rows.push((broker, p.into_inner())),
                    // A broker group without the topic has nothing to reset.
                    Err(s) if s.code() == tonic::Code::NotFound => {}
                    Err(s) => anyhow::bail!("broker group {broker}: {}", s.message()),
                }
            }
            if rows.is_empty() {
                anyhow::bail!("no such topic: {topic}");
            }
            progress_header();
            for (broker, p) in &rows {
                print_progress(broker, p);
            }
        }
    }
    Ok(())
}
