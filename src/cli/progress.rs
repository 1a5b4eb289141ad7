//! Where consumer groups are, and moving them: `raftmq group progress` (one
//! group per queue, or every group at once, with consume rates: mqadmin's
//! consumerProgress), `reset-offset` (to a time: resetOffsetByTime),
//! `skip-backlog` (to the queues' ends: skipAccumulatedMessage) and
//! `clone-offsets` (another group's offsets: cloneGroupOffset). Moves run
//! on each broker group's leader through Raft.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::cli::connect::group_endpoints;
use crate::proto::pb;

/// One queue's progress in one broker group.
struct Row {
    broker: String,
    q: pb::QueueProgress,
    /// Consumed messages per second over the sampling interval.
    rate: f64,
}

/// Every broker group's progress of `group` ("": every group).
async fn sample(brokers: &[(String, String)], group: &str) -> anyhow::Result<Vec<(String, pb::QueueProgress)>> {
    let mut out = Vec::new();
    for (broker, addr) in brokers {
        let p = crate::cli::connect::broker(addr)?
            .group_progress(pb::GroupProgressRequest {
                group: group.to_string(),
            })
            .await
            .map_err(|s| anyhow::anyhow!("broker group {broker}: {}", s.message()))?
            .into_inner();
        out.extend(p.queues.into_iter().map(|q| (broker.clone(), q)));
    }
    Ok(out)
}

/// Two samples `interval` apart; the second, with the consume rate of each
/// queue in between (0 where the group moved back: a reset).
async fn rows(brokers: &[(String, String)], group: &str, interval: Duration) -> anyhow::Result<Vec<Row>> {
    let key = |b: &str, q: &pb::QueueProgress| (b.to_string(), q.group.clone(), q.topic.clone(), q.queue);
    let before: BTreeMap<_, u64> = if interval.is_zero() {
        BTreeMap::new()
    } else {
        let first = sample(brokers, group).await?;
        tokio::time::sleep(interval).await;
        first.iter().map(|(b, q)| (key(b, q), q.consumer_offset)).collect()
    };
    let secs = interval.as_secs_f64().max(f64::MIN_POSITIVE);
    Ok(sample(brokers, group)
        .await?
        .into_iter()
        .map(|(broker, q)| {
            let rate = before
                .get(&key(&broker, &q))
                .map_or(0.0, |b| q.consumer_offset.saturating_sub(*b) as f64 / secs);
            Row { broker, q, rate }
        })
        .collect())
}

/// Fails unless some broker group knows `group` (a typo is an error, not
/// an empty table).
async fn check_known(brokers: &[(String, String)], group: &str) -> anyhow::Result<()> {
    for (broker, addr) in brokers {
        match crate::cli::connect::broker(addr)?
            .get_consumer_group(pb::GetConsumerGroupRequest {
                name: group.to_string(),
            })
            .await
        {
            Ok(_) => return Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => anyhow::bail!("broker group {broker}: {}", s.message()),
        }
    }
    // Known from what it consumed, without a config of its own.
    if sample(brokers, group).await?.is_empty() {
        anyhow::bail!("no such consumer group: {group}");
    }
    Ok(())
}

fn queue_json(r: &Row) -> serde_json::Value {
    serde_json::json!({
        "broker": r.broker, "topic": r.q.topic, "queue": r.q.queue,
        "broker_offset": r.q.broker_offset, "consumer_offset": r.q.consumer_offset,
        "lag": r.q.lag, "inflight": r.q.inflight, "msgs_per_s": r.rate,
    })
}

fn queue_table(rows: &[Row]) {
    println!(
        "{:<12} {:<24} {:>5} {:>14} {:>14} {:>10} {:>9} {:>9}",
        "broker", "topic", "queue", "broker offset", "consumer off.", "lag", "inflight", "msgs/s"
    );
    for r in rows {
        let q = &r.q;
        println!(
            "{:<12} {:<24} {:>5} {:>14} {:>14} {:>10} {:>9} {:>9.1}",
            r.broker, q.topic, q.queue, q.broker_offset, q.consumer_offset, q.lag, q.inflight, r.rate
        );
    }
}

/// `group progress`: one group per queue, or (`group` None) every group's
/// totals.
pub async fn progress(namesrv: &str, group: Option<&str>, interval: Duration, json: bool) -> anyhow::Result<()> {
    let brokers = group_endpoints(namesrv, None).await?;
    if let Some(g) = group {
        crate::broker::pop::validate_group(g).map_err(|e| anyhow::anyhow!("--group: {e}"))?;
        check_known(&brokers, g).await?;
    }
    let rows = rows(&brokers, group.unwrap_or(""), interval).await?;
    let lag: u64 = rows.iter().map(|r| r.q.lag).sum();
    let rate: f64 = rows.iter().map(|r| r.rate).sum();
    if let Some(g) = group {
        if json {
            let queues: Vec<_> = rows.iter().map(queue_json).collect();
            let v = serde_json::json!({ "group": g, "lag": lag, "msgs_per_s": rate, "queues": queues });
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            queue_table(&rows);
            println!("total lag: {lag}, consuming {rate:.1} msgs/s");
        }
        return Ok(());
    }
    let mut groups: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for r in &rows {
        groups.entry(r.q.group.as_str()).or_default().push(r);
    }
    if json {
        let list: Vec<_> = groups
            .iter()
            .map(|(g, rs)| {
                serde_json::json!({
                    "group": g,
                    "lag": rs.iter().map(|r| r.q.lag).sum::<u64>(),
                    "inflight": rs.iter().map(|r| u64::from(r.q.inflight)).sum::<u64>(),
                    "msgs_per_s": rs.iter().map(|r| r.rate).sum::<f64>(),
                    "queues": rs.iter().map(|r| queue_json(r)).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "groups": list }))?
        );
        return Ok(());
    }
    println!(
        "{:<32} {:>7} {:>12} {:>9} {:>9}",
        "consumer group", "topics", "lag", "inflight", "msgs/s"
    );
    for (g, rs) in &groups {
        let topics: std::collections::BTreeSet<&str> = rs.iter().map(|r| r.q.topic.as_str()).collect();
        println!(
            "{:<32} {:>7} {:>12} {:>9} {:>9.1}",
            g,
            topics.len(),
            rs.iter().map(|r| r.q.lag).sum::<u64>(),
            rs.iter().map(|r| u64::from(r.q.inflight)).sum::<u64>(),
            rs.iter().map(|r| r.rate).sum::<f64>()
        );
    }
    println!("{} groups, total lag {lag}, consuming {rate:.1} msgs/s", groups.len());
    Ok(())
}

/// Moves `group` in `topic` on every broker group that has the topic, as
/// `request` says, and prints where it is now.
pub async fn reset(namesrv: &str, request: pb::ResetOffsetRequest) -> anyhow::Result<()> {
    crate::broker::pop::validate_group(&request.group).map_err(|e| anyhow::anyhow!("--group: {e}"))?;
    raftmq_store::queue_table::validate_topic(&request.topic).map_err(|e| anyhow::anyhow!("--topic: {e}"))?;
    let mut rows = Vec::new();
    for (broker, addr) in group_endpoints(namesrv, None).await? {
        match crate::cli::connect::broker(&addr)?.reset_offset(request.clone()).await {
            Ok(p) => rows.extend(
                p.into_inner()
                    .queues
                    .into_iter()
                    .filter(|q| q.topic == request.topic)
                    .map(|q| Row {
                        broker: broker.clone(),
                        q,
                        rate: 0.0,
                    }),
            ),
            // A broker group without the topic has nothing to move.
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => anyhow::bail!("broker group {broker}: {}", s.message()),
        }
    }
    if rows.is_empty() {
        anyhow::bail!("no such topic: {}", request.topic);
    }
    queue_table(&rows);
    Ok(())
}

/// `group clone-offsets`: `to` continues in `topic` where `from` is.
pub async fn clone_offsets(namesrv: &str, from: &str, to: &str, topic: &str) -> anyhow::Result<()> {
    crate::broker::pop::validate_group(from).map_err(|e| anyhow::anyhow!("--from: {e}"))?;
    crate::broker::pop::validate_group(to).map_err(|e| anyhow::anyhow!("--to: {e}"))?;
    let brokers = group_endpoints(namesrv, None).await?;
    let mut moved = Vec::new();
    for (broker, addr) in &brokers {
        let offsets: Vec<pb::QueueOffset> = sample(std::slice::from_ref(&(broker.clone(), addr.clone())), from)
            .await?
            .into_iter()
            .filter(|(_, q)| q.topic == topic)
            .map(|(_, q)| pb::QueueOffset {
                queue: q.queue,
                offset: q.consumer_offset,
            })
            .collect();
        if offsets.is_empty() {
            continue;
        }
        let p = crate::cli::connect::broker(addr)?
            .reset_offset(pb::ResetOffsetRequest {
                group: to.to_string(),
                topic: topic.to_string(),
                offsets,
                ..Default::default()
            })
            .await
            .map_err(|s| anyhow::anyhow!("broker group {broker}: {}", s.message()))?;
        moved.extend(
            p.into_inner()
                .queues
                .into_iter()
                .filter(|q| q.topic == topic)
                .map(|q| Row {
                    broker: broker.clone(),
                    q,
                    rate: 0.0,
                }),
        );
    }
    if moved.is_empty() {
        anyhow::bail!("consumer group {from} has no offsets in topic {topic}");
    }
    println!("{to} now continues where {from} is in {topic}:");
    queue_table(&moved);
    Ok(())
}
