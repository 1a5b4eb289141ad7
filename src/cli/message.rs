//! `raftmq message get|find|range|at`: look messages up by message id or by
//! key (through the key index), by store time (through the ConsumeQueues) or
//! by queue offset
//! in every broker group that has the topic; any node answers from its
//! applied state.

use clap::Subcommand;

use crate::cli::connect::group_endpoints;
use crate::cli::display::local_time;
use crate::proto::pb;

#[derive(Debug, Subcommand)]
pub enum MessageCommand {
    /// The message with this id.
    Get {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// The message id a send returned.
        #[arg(long)]
        id: String,
    },
    /// Messages with this key, newest first.
    Find {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// The message key to look up.
        #[arg(long)]
        key: String,
        /// At most this many.
        #[arg(long, default_value_t = 32)]
        max: u32,
    },
    /// Messages stored in a time range, per queue in queue order.
    Range {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// One queue (default: every queue).
        #[arg(long)]
        queue: Option<u32>,
        /// From this time on: ms since the epoch, or an age ("10m").
        #[arg(long)]
        begin: String,
        /// Before this time (default: now).
        #[arg(long)]
        end: Option<String>,
        /// At most this many per broker group.
        #[arg(long, default_value_t = 32)]
        max: u32,
    },
    /// The message at an offset of a queue (mqadmin queryMsgByOffset).
    At {
        /// NameServer addresses, separated by ',' or ';' (the first that answers is used).
        #[arg(long, default_value = crate::namesrv::config::DEFAULT_LISTEN)]
        namesrv: String,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// The broker group whose queue it is (needed where several have the topic).
        #[arg(long)]
        broker: Option<String>,
        /// The queue id.
        #[arg(long)]
        queue: u32,
        /// The queue offset.
        #[arg(long)]
        offset: u64,
    },
}

/// `message at`: one queue offset, read from a node of the broker group.
async fn at(namesrv: &str, topic: &str, broker: Option<&str>, queue: u32, offset: u64) -> anyhow::Result<()> {
    raftmq_store::queue_table::validate_topic(topic).map_err(|e| anyhow::anyhow!("--topic: {e}"))?;
    let mut found = Vec::new();
    for (b, addr) in group_endpoints(namesrv, broker).await? {
        let r = crate::cli::connect::broker(&addr)?
            .read(pb::ReadRequest {
                topic: topic.to_string(),
                queue_id: queue,
                offset,
                max_count: 1,
            })
            .await;
        match r {
            Ok(r) => found.push((b, r.into_inner())),
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => anyhow::bail!("broker group {b}: {}", s.message()),
        }
    }
    match found.as_slice() {
        [] => anyhow::bail!("no such topic: {topic}"),
        [(b, r)] => match r.messages.first().filter(|m| m.queue_offset == offset) {
            Some(m) => show(b, m, Some(queue)),
            None => anyhow::bail!(
                "no message at offset {offset} of queue {queue} in broker group {b} (the queue ends at {}; older ones may be gone to retention)",
                r.max_offset
            ),
        },
        several => anyhow::bail!(
            "broker groups {} have topic {topic}: name one with --broker",
            several.iter().map(|(b, _)| b.as_str()).collect::<Vec<_>>().join(", ")
        ),
    }
    Ok(())
}

fn show(broker: &str, m: &pb::Message, queue: Option<u32>) {
    let body = String::from_utf8_lossy(&m.body);
    let preview: String = body.chars().take(80).collect();
    let at = queue.map_or(String::new(), |q| format!("queue {q} offset {} ", m.queue_offset));
    println!(
        "{broker}: {at}id {} tag {} keys [{}] born {} stored {} props {:?}\n  {preview}{}",
        m.message_id,
        if m.tag.is_empty() { "-" } else { &m.tag },
        m.keys.join(" "),
        local_time(m.born_timestamp_ms),
        local_time(m.store_timestamp_ms),
        m.properties
            .iter()
            .filter(|(k, _)| !k.starts_with(crate::proto::v2_message::RESERVED_PREFIX))
            .collect::<std::collections::BTreeMap<_, _>>(),
        if body.chars().count() > 80 { "..." } else { "" }
    );
}

pub async fn run(cmd: MessageCommand) -> anyhow::Result<()> {
    let (namesrv, topic, by, max) = match cmd {
        MessageCommand::At {
            namesrv,
            topic,
            broker,
            queue,
            offset,
        } => return at(&namesrv, &topic, broker.as_deref(), queue, offset).await,
        MessageCommand::Get { namesrv, topic, id } => {
            (namesrv, topic, pb::query_messages_request::By::MessageId(id), 1)
        }
        MessageCommand::Find {
            namesrv,
            topic,
            key,
            max,
        } => (namesrv, topic, pb::query_messages_request::By::Key(key), max),
        MessageCommand::Range {
            namesrv,
            topic,
            queue,
            begin,
            end,
            max,
        } => {
            let range = pb::TimeRange {
                queue_id: queue,
                begin_ms: crate::cli::group::timestamp_of("--begin", &begin)?,
                end_ms: match end {
                    Some(e) => crate::cli::group::timestamp_of("--end", &e)?,
                    None => crate::clock::now_ms().saturating_add(1),
                },
            };
            (namesrv, topic, pb::query_messages_request::By::TimeRange(range), max)
        }
    };
    raftmq_store::queue_table::validate_topic(&topic)?;
    let mut found = 0;
    // Broker groups that have the topic, and those where --max cut the answer short.
    let mut have_topic = 0;
    let mut cut = Vec::new();
    let by_range = matches!(by, pb::query_messages_request::By::TimeRange(_));
    for (broker, addr) in group_endpoints(&namesrv, None).await? {
        let r = crate::cli::connect::broker(&addr)?
            .query_messages(pb::QueryMessagesRequest {
                topic: topic.clone(),
                by: Some(by.clone()),
                max,
            })
            .await;
        match r {
            Ok(r) => {
                let r = r.into_inner();
                have_topic += 1;
                if by_range && max > 0 && r.messages.len() >= max as usize {
                    cut.push(broker.clone());
                }
                for (i, m) in r.messages.iter().enumerate() {
                    show(&broker, m, r.queue_ids.get(i).copied());
                    found += 1;
                }
            }
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => anyhow::bail!("broker group {broker}: {}", s.message()),
        }
    }
    if have_topic == 0 {
        anyhow::bail!("no such topic: {topic}");
    }
    if found == 0 {
        anyhow::bail!("no such message in topic {topic}");
    }
    for broker in cut {
        println!(
            "(broker group {broker}: stopped at --max {max}; more may match: raise --max or narrow --begin/--end)"
        );
    }
    Ok(())
}
