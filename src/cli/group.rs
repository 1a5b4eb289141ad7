//! `raftmq group ...`: consumer groups in every broker group, through the
//! NameServers: create, update (FIFO delivery, maximum attempts), list,
//! delete, their clients; progress and offset moves are in
//! [`super::progress`].

use clap::Subcommand;

use crate::cli::connect::group_endpoints;
use crate::cli::produce::parse_duration;
use crate::proto::pb;

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
    /// What each client of a consumer group subscribes to and consumed
    /// through each node (received, acked, receives waiting, last
    /// delivery), and whether the clients subscribe alike (mqadmin
    /// consumerStatus).
    Status {
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
    /// Where consumer groups are: with --group, its position in each queue
    /// (broker offset, consumer offset, lag, in flight, msgs/s); without,
    /// every group's totals (mqadmin consumerProgress).
    Progress {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// One consumer group (default: every group).
        #[arg(long)]
        group: Option<String>,
        /// Sample twice this far apart for consume rates (0: no rates).
        #[arg(long, value_parser = parse_duration, default_value = "1s")]
        interval: std::time::Duration,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Delete a consumer group in every broker group (or one, with
    /// --broker): its settings, offsets and in-flight messages. Its
    /// dead-letter topic stays.
    Delete {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The consumer group.
        #[arg(long)]
        group: String,
        /// Only this broker group.
        #[arg(long)]
        broker: Option<String>,
    },
    /// Skip a consumer group's backlog in a topic: every queue moves to its
    /// end, what is in flight is dropped (mqadmin skipAccumulatedMessage).
    SkipBacklog {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The consumer group.
        #[arg(long)]
        group: String,
        /// The topic.
        #[arg(long)]
        topic: String,
    },
    /// Make a consumer group continue in a topic where another one is, queue
    /// by queue (mqadmin cloneGroupOffset).
    CloneOffsets {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The group whose offsets are copied.
        #[arg(long)]
        from: String,
        /// The group that moves.
        #[arg(long)]
        to: String,
        /// The topic.
        #[arg(long)]
        topic: String,
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

pub async fn run(cmd: GroupCommand) -> anyhow::Result<()> {
    match cmd {
        GroupCommand::Update(a) => {
            crate::broker::pop::validate_group(&a.group).map_err(|e| anyhow::anyhow!("--group: {e}"))?;
            if a.fifo.is_none() && a.max_attempts.is_none() {
                anyhow::bail!("nothing to change: give --fifo true|false or --max-attempts");
            }
            let mut current = Vec::new();
            for (broker, addr) in group_endpoints(&a.namesrv, a.broker.as_deref()).await? {
                let old = match crate::cli::connect::broker(&addr)?
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
                crate::cli::connect::broker(&addr)?
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
                crate::cli::connect::broker(&addr)?
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
                let list = crate::cli::connect::broker(&addr)?
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
        GroupCommand::Status { namesrv, group, json } => {
            super::connections::consumer_status(&namesrv, &group, json).await?
        }
        GroupCommand::Progress {
            namesrv,
            group,
            interval,
            json,
        } => super::progress::progress(&namesrv, group.as_deref(), interval, json).await?,
        GroupCommand::Delete { namesrv, group, broker } => {
            crate::broker::pop::validate_group(&group).map_err(|e| anyhow::anyhow!("--group: {e}"))?;
            let mut deleted = 0;
            for (b, addr) in group_endpoints(&namesrv, broker.as_deref()).await? {
                match crate::cli::connect::broker(&addr)?
                    .delete_consumer_group(pb::GetConsumerGroupRequest { name: group.clone() })
                    .await
                {
                    Ok(_) => {
                        deleted += 1;
                        println!("deleted consumer group {group} in broker group {b}");
                    }
                    Err(s) if s.code() == tonic::Code::NotFound => {}
                    Err(s) => anyhow::bail!("broker group {b}: {}", s.message()),
                }
            }
            if deleted == 0 {
                anyhow::bail!("no such consumer group: {group}");
            }
        }
        GroupCommand::ResetOffset {
            namesrv,
            group,
            topic,
            to_timestamp,
        } => {
            let timestamp_ms = timestamp_of("--to-timestamp", &to_timestamp)?;
            let r = pb::ResetOffsetRequest {
                group,
                topic,
                timestamp_ms,
                ..Default::default()
            };
            super::progress::reset(&namesrv, r).await?
        }
        GroupCommand::SkipBacklog { namesrv, group, topic } => {
            let r = pb::ResetOffsetRequest {
                group,
                topic,
                to_end: true,
                ..Default::default()
            };
            super::progress::reset(&namesrv, r).await?
        }
        GroupCommand::CloneOffsets {
            namesrv,
            from,
            to,
            topic,
        } => super::progress::clone_offsets(&namesrv, &from, &to, &topic).await?,
    }
    Ok(())
}
