//! `raftmq node ...`: talk to one broker node over raftmq's own
//! `raftmq.v1.Broker` service (any node of the group will do; followers
//! forward writes to the leader).

use std::time::{Duration, Instant};

use clap::Subcommand;

use crate::proto::pb;
use crate::proto::pb::broker_client::BrokerClient;

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Show this node's view of the group: role, term, leader, indexes, members.
    Status {
        /// The node to ask.
        #[arg(long, default_value = "127.0.0.1:8081")]
        endpoint: String,
    },
    /// Create or update a topic in this node's group.
    PutTopic {
        /// The node (any node of the group).
        #[arg(long, default_value = "127.0.0.1:8081")]
        endpoint: String,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Read and write queue count.
        #[arg(long, default_value_t = 8)]
        queues: u32,
        /// 2 = write, 4 = read, 6 = both.
        #[arg(long, default_value_t = 6)]
        perm: u32,
    },
    /// Send messages to one queue, one at a time, and print their offsets.
    Send {
        /// The node (any node of the group; followers forward to the leader).
        #[arg(long, default_value = "127.0.0.1:8081")]
        endpoint: String,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// The queue id.
        #[arg(long, default_value_t = 0)]
        queue: u32,
        /// How many messages.
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Body size in bytes (the body is filled with a readable pattern).
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// The messages' tag (none if empty).
        #[arg(long, default_value = "")]
        tag: String,
    },
    /// Read messages of one queue from the given offset.
    Read {
        /// The node (any node: it answers from what it has applied).
        #[arg(long, default_value = "127.0.0.1:8081")]
        endpoint: String,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// The queue id.
        #[arg(long, default_value_t = 0)]
        queue: u32,
        /// The first queue offset to read.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// At most this many messages.
        #[arg(long, default_value_t = 10)]
        count: u32,
    },
}

async fn connect(endpoint: &str) -> anyhow::Result<BrokerClient<crate::cli::connect::Signed>> {
    let ep = crate::client::channel::endpoint(endpoint, Duration::from_secs(3)).map_err(anyhow::Error::msg)?;
    let channel = crate::client::channel::connect(ep, endpoint, &crate::cli::connect::dialer())
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot reach a broker at {endpoint} ({}); is it running?",
                crate::client::channel::root_cause(&e)
            )
        })?;
    Ok(crate::cli::connect::broker_on(channel))
}

fn status_error(s: tonic::Status) -> anyhow::Error {
    match s.code() {
        tonic::Code::Unimplemented => {
            anyhow::anyhow!("the endpoint answers, but not as a raftmq broker's client port (is it a NameServer?)")
        }
        _ => anyhow::anyhow!("{}", s.message()),
    }
}

pub async fn run(cmd: NodeCommand) -> anyhow::Result<()> {
    match cmd {
        NodeCommand::Status { endpoint } => {
            let s = connect(&endpoint)
                .await?
                .status(pb::StatusRequest { with_digest: false })
                .await
                .map_err(status_error)?
                .into_inner();
            println!(
                "group {}  node {}  role {}  term {}",
                s.group, s.node_id, s.role, s.term
            );
            println!(
                "leader {}  last log {}  committed {}  applied {}",
                s.leader_id.map_or("none".to_string(), |l| l.to_string()),
                s.last_log_index,
                s.commit_index,
                s.applied_index
            );
            // What decides whether this node takes sends.
            println!(
                "disk {}  sends {}",
                match (s.disk_used_ratio > 0.0, s.disk_full) {
                    (true, true) => format!("{:.1}% used, full: refusing sends", s.disk_used_ratio * 100.0),
                    (true, false) => format!("{:.1}% used", s.disk_used_ratio * 100.0),
                    (false, true) => "full: refusing sends".to_string(),
                    (false, false) => "use unknown".to_string(),
                },
                if s.writable {
                    "taken"
                } else {
                    "refused (write permission wiped)"
                }
            );
            for m in s.members {
                println!(
                    "  node {}  {}  raft {}  client {}",
                    m.node_id,
                    if m.voter { "voter  " } else { "learner" },
                    m.raft_addr,
                    m.client_addr
                );
            }
        }
        NodeCommand::PutTopic {
            endpoint,
            topic,
            queues,
            perm,
        } => {
            connect(&endpoint)
                .await?
                .put_topic(pb::PutTopicRequest {
                    name: topic.clone(),
                    read_queues: queues,
                    write_queues: queues,
                    perm,
                    message_type: String::new(),
                })
                .await
                .map_err(status_error)?;
            println!("topic {topic}: {queues} queues, perm {perm}");
        }
        NodeCommand::Send {
            endpoint,
            topic,
            queue,
            count,
            size,
            tag,
        } => {
            let mut client = connect(&endpoint).await?;
            let start = Instant::now();
            for i in 0..count {
                let text = format!("message {i} ");
                let body: Vec<u8> = text.bytes().cycle().take(size).collect();
                let req = pb::SendRequest {
                    topic: topic.clone(),
                    queue_id: queue,
                    messages: vec![pb::Message {
                        message_id: format!("{:016x}-{i}", start.elapsed().as_nanos()),
                        tag: tag.clone(),
                        body: body.into(),
                        born_timestamp_ms: std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as u64),
                        ..Default::default()
                    }],
                };
                // Like RocketMQ's producers: a send that failed for a
                // passing reason (no leader yet, outcome unknown) is sent
                // again, so it is delivered at least once.
                let deadline = Instant::now() + Duration::from_secs(10);
                let r = loop {
                    match client.send(req.clone()).await {
                        Ok(r) => break r.into_inner(),
                        Err(s)
                            if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Aborted)
                                && Instant::now() < deadline =>
                        {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(s) => return Err(status_error(s)),
                    }
                };
                if count <= 20 {
                    match r.duplicates.first() {
                        // A retry whose first try was stored after all.
                        Some(d) => println!("stored before at {topic}/{} offset {}", d.queue_id, d.queue_offset),
                        None => println!("sent to {topic}/{queue} at offset {}", r.first_queue_offset),
                    }
                }
            }
            let secs = start.elapsed().as_secs_f64();
            println!(
                "{count} messages in {secs:.2} s ({:.0} msgs/s, one at a time)",
                count as f64 / secs
            );
        }
        NodeCommand::Read {
            endpoint,
            topic,
            queue,
            from,
            count,
        } => {
            let r = connect(&endpoint)
                .await?
                .read(pb::ReadRequest {
                    topic: topic.clone(),
                    queue_id: queue,
                    offset: from,
                    max_count: count,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            for m in &r.messages {
                let body = String::from_utf8_lossy(&m.body);
                let shown: String = body.chars().take(60).collect();
                println!(
                    "{topic}/{queue} @{}  id {}  tag {:?}  stored {}  {shown}",
                    m.queue_offset,
                    m.message_id,
                    m.tag,
                    crate::cli::display::local_time(m.store_timestamp_ms)
                );
            }
            println!(
                "{} messages; next offset {}, queue end {}",
                r.messages.len(),
                r.next_offset,
                r.max_offset
            );
        }
    }
    Ok(())
}
