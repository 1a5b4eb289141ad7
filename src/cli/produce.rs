//! `raftmq produce` and `raftmq consume`: send and receive through the
//! RocketMQ 5 protocol with [`crate::client`], against any node.

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::client::{Client, ClientError, Outgoing, Received};

#[derive(Debug, clap::Args)]
pub struct ProduceArgs {
    /// Access points: host:port, several separated by ';'.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub endpoint: String,
    /// The topic.
    #[arg(long)]
    pub topic: String,
    /// How many messages to send.
    #[arg(long, default_value_t = 1)]
    pub count: u64,
    /// Body size in bytes (a readable pattern that starts with the message's number).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// The body text itself (instead of --size).
    #[arg(long)]
    pub body: Option<String>,
    /// The message tag (a filter expression matches it).
    #[arg(long)]
    pub tag: Option<String>,
    /// A key for the message index (`raftmq message find`).
    #[arg(long)]
    pub key: Option<String>,
    /// FIFO message group: messages of one group keep their order (the
    /// topic must accept FIFO).
    #[arg(long)]
    pub message_group: Option<String>,
    /// Deliver after this long, with its unit: 10s, 5m, 1h, 3d (a timed
    /// message; up to the broker's timer.max_delay_ms, 40 days by default).
    #[arg(long, value_parser = parse_delay)]
    pub delay: Option<Duration>,
    /// Print one line per message even for large counts.
    #[arg(long)]
    pub verbose: bool,
}

#[derive(Debug, clap::Args)]
pub struct RecallArgs {
    /// Access points: host:port, several separated by ';'.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub endpoint: String,
    /// The topic.
    #[arg(long)]
    pub topic: String,
    /// The recall handle a timed send returned.
    #[arg(long)]
    pub handle: String,
}

pub async fn recall(a: RecallArgs) -> anyhow::Result<()> {
    let client = Client::connect_with(&a.endpoint, &crate::cli::connect::dialer())?
        .with_credentials(crate::cli::connect::credentials());
    let id = client
        .recall(&a.topic, &a.handle)
        .await
        .map_err(|e| anyhow::anyhow!("recall: {e}"))?;
    println!("recalled {id} from {}", a.topic);
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct ConsumeArgs {
    /// Access points: host:port, several separated by ';'.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub endpoint: String,
    /// The topic.
    #[arg(long)]
    pub topic: String,
    /// Consumer group (created on first use unless the broker forbids it).
    #[arg(long)]
    pub group: String,
    /// Tag expression: `*` or `TagA || TagB`.
    #[arg(long, default_value = "*")]
    pub filter: String,
    /// Stop after this many messages (default: run until Ctrl-C).
    #[arg(long)]
    pub count: Option<u64>,
    /// With --count: give up (exit status 1) after this long, e.g. 30s.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub timeout: Duration,
    /// How long a received message stays invisible to the group if it is not
    /// acknowledged.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub invisible: Duration,
}

/// Parses `500ms`, `10s`, `5m`, `2h` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (try 500ms, 10s, 5m, 2h or 3d)"))?;
    let ms = match unit {
        "ms" => n,
        "s" => n.saturating_mul(1000),
        "m" => n.saturating_mul(60_000),
        "h" => n.saturating_mul(3_600_000),
        "d" => n.saturating_mul(86_400_000),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m, h or d)")),
    };
    Ok(Duration::from_millis(ms))
}

/// A delay: a duration that names its unit (a bare number could mean
/// seconds, milliseconds or one of RocketMQ's delay levels).
pub fn parse_delay(s: &str) -> Result<Duration, String> {
    if !s.is_empty() && s.trim().chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("{s:?} has no unit: write {s}s, {s}m, {s}h or {s}d"));
    }
    parse_duration(s)
}

/// A body of `size` bytes that starts with the message's number, then
/// the alphabet over and over. Built a slice at a time: `raftmq bench`
/// makes one per message on the brokers' cores (byte by byte it was 5 % of
/// the machine in the batch row).
pub fn pattern_body(i: u64, size: usize) -> Vec<u8> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    let head = format!("message {i} ");
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(&head.as_bytes()[..head.len().min(size)]);
    while body.len() < size {
        body.extend_from_slice(&ALPHABET[..(size - body.len()).min(ALPHABET.len())]);
    }
    body
}

/// Retries what is worth retrying (no leader yet, a node down) for up to
/// `patience`.
pub async fn with_retries<T, F, Fut>(patience: Duration, mut op: F) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let deadline = Instant::now() + patience;
    loop {
        match op().await {
            Err(e) if e.retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            r => return r,
        }
    }
}

pub async fn produce(a: ProduceArgs) -> anyhow::Result<()> {
    let client = Client::connect_with(&a.endpoint, &crate::cli::connect::dialer())?
        .with_credentials(crate::cli::connect::credentials());
    let started = Instant::now();
    let quiet = a.count > 20 && !a.verbose;
    for i in 0..a.count {
        let body = match &a.body {
            Some(b) => b.clone().into_bytes(),
            None => pattern_body(i, a.size),
        };
        let mut m = Outgoing::new(a.topic.clone(), body);
        m.tag = a.tag.clone();
        m.keys = a.key.iter().cloned().collect();
        m.message_group = a.message_group.clone();
        m.delivery_timestamp_ms = a.delay.map(|d| crate::clock::now_ms() + d.as_millis() as u64);
        let r = with_retries(Duration::from_secs(10), || client.send(m.clone()))
            .await
            .map_err(|e| anyhow::anyhow!("message {i}: {e}"))?;
        match (quiet, r.recall_handle.is_empty()) {
            (true, _) => {}
            (false, true) => println!("sent {} to {} at offset {}", r.message_id, a.topic, r.offset),
            (false, false) => println!(
                "sent {} to {} (timed, due {}; recall handle {})",
                r.message_id,
                a.topic,
                m.delivery_timestamp_ms
                    .map_or_else(String::new, crate::cli::display::local_time),
                r.recall_handle
            ),
        }
    }
    if quiet {
        let secs = started.elapsed().as_secs_f64();
        println!(
            "sent {} messages to {} in {secs:.1} s ({:.0} msgs/s)",
            a.count,
            a.topic,
            a.count as f64 / secs.max(1e-9)
        );
    }
    Ok(())
}

fn show(m: &Received) -> String {
    let body = String::from_utf8_lossy(&m.body);
    let preview: String = body.chars().take(60).collect();
    format!(
        "queue {} offset {} id {} tag {} keys [{}] attempt {}: {preview}{}",
        m.queue_id,
        m.offset,
        m.message_id,
        m.tag.as_deref().unwrap_or("-"),
        m.keys.join(" "),
        m.delivery_attempt,
        if body.chars().count() > 60 { "..." } else { "" }
    )
}

pub async fn consume(a: ConsumeArgs) -> anyhow::Result<()> {
    let client = Client::connect_with(&a.endpoint, &crate::cli::connect::dialer())?
        .with_credentials(crate::cli::connect::credentials());
    let deadline = Instant::now() + a.timeout;
    let mut got = 0u64;
    // Made once: see `raftmq dev` (a `ctrl_c()` per turn can miss a SIGINT).
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    loop {
        if a.count.is_some_and(|n| got >= n) {
            return Ok(());
        }
        if a.count.is_some() && Instant::now() >= deadline {
            bail!(
                "received {got} of {} messages within {:?}",
                a.count.unwrap_or(0),
                a.timeout
            );
        }
        let max = a.count.map_or(32, |n| (n - got).min(32) as i32);
        let batch = tokio::select! {
            r = with_retries(Duration::from_secs(10), || {
                client.receive(&a.group, &a.topic, &a.filter, max, a.invisible, Duration::from_secs(5))
            }) => r?,
            _ = interrupt.recv() => return Ok(()),
        };
        for m in &batch {
            println!("{}", show(m));
        }
        with_retries(Duration::from_secs(10), || client.ack(&a.group, &a.topic, &batch)).await?;
        got += batch.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("5 days").is_err());
        assert_eq!(parse_duration("3d"), Ok(Duration::from_secs(3 * 86_400)));
        assert_eq!(parse_delay("3d"), Ok(Duration::from_secs(3 * 86_400)));
        assert!(parse_delay("30").unwrap_err().contains("no unit"));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("99999999999999999999999s").is_err());
    }

    #[test]
    fn bodies() {
        let b = pattern_body(12, 20);
        assert_eq!(b.len(), 20);
        assert!(b.starts_with(b"message 12 abc"));
        assert_eq!(pattern_body(1, 3), b"mes");
        // Past the first alphabet, on and on.
        let b = pattern_body(7, 1024);
        assert_eq!(b.len(), 1024);
        assert_eq!(&b[..12], b"message 7 ab");
        for (k, &c) in b[10..].iter().enumerate() {
            assert_eq!(c, b'a' + (k % 26) as u8);
        }
        assert!(pattern_body(5, 0).is_empty());
    }
}
