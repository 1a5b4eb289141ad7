//! `raftmq topic status`: each queue of a topic in every broker group that
//! has it, as a node of that group holds it: the oldest offset kept, the
//! offset the next message gets, and when the last message was stored
//! (mqadmin topicStatus).

use crate::cli::connect::group_endpoints;
use crate::cli::display::local_time;
use crate::proto::pb;

pub async fn run(namesrv: &str, topic: &str, json: bool) -> anyhow::Result<()> {
    raftmq_store::queue_table::validate_topic(topic).map_err(|e| anyhow::anyhow!("--topic: {e}"))?;
    let mut rows = Vec::new();
    for (broker, addr) in group_endpoints(namesrv, None).await? {
        match crate::cli::connect::broker(&addr)?
            .topic_status(pb::GetTopicRequest {
                name: topic.to_string(),
            })
            .await
        {
            Ok(r) => rows.extend(r.into_inner().queues.into_iter().map(|q| (broker.clone(), q))),
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => anyhow::bail!("broker group {broker}: {}", s.message()),
        }
    }
    if rows.is_empty() {
        anyhow::bail!("no such topic: {topic}");
    }
    if json {
        let queues: Vec<_> = rows
            .iter()
            .map(|(b, q)| {
                serde_json::json!({
                    "broker": b, "queue": q.queue, "min_offset": q.min_offset,
                    "max_offset": q.max_offset, "last_store_ms": q.last_store_ms,
                })
            })
            .collect();
        let v = serde_json::json!({ "topic": topic, "queues": queues });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:<12} {:>5} {:>14} {:>14}  last stored",
        "broker", "queue", "min offset", "max offset"
    );
    for (b, q) in &rows {
        let last = match q.last_store_ms {
            0 => "-".to_string(),
            ms => local_time(ms),
        };
        println!(
            "{:<12} {:>5} {:>14} {:>14}  {last}",
            b, q.queue, q.min_offset, q.max_offset
        );
    }
    let total: u64 = rows
        .iter()
        .map(|(_, q)| q.max_offset.saturating_sub(q.min_offset))
        .sum();
    println!("{total} messages kept in {} queues", rows.len());
    Ok(())
}
