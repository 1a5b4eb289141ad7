//! `raftmq bench produce|consume|e2e`: load through the RocketMQ 5 protocol
//! ([`crate::client`]) with a live progress bar, then msgs/s, MiB/s,
//! latency percentiles and error counts (or one JSON object), and optional
//! latency plots.
//!
//! * `produce`: `--concurrency` senders; latency is each send's round trip.
//! * `consume`: `--concurrency` receivers (receive + ack); latency is each
//!   message's time from its producer's clock to its receipt (the clocks of
//!   one machine for a local cluster).
//! * `e2e`: senders and receivers together; latency is send to receive.
//!
//! Every run is bounded by `--count` messages or `--duration`.

pub mod plot;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Subcommand;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::cli::produce::{parse_duration, pattern_body};
use crate::client::{Client, ClientError, Outgoing};
use crate::proto::rocketmq::v2::Code;

/// User property carrying the send time (µs since the epoch).
const SENT_US: &str = "bench_sent_us";
/// User property naming the run a bench message belongs to: an e2e run
/// measures only its own messages, not what earlier runs left behind.
const RUN_ID: &str = "bench_run";

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Send as fast as the senders can.
    Produce(ProduceBench),
    /// Receive and acknowledge as fast as the receivers can.
    Consume(ConsumeBench),
    /// Send and receive at once; latency is send to receive.
    E2e(E2eBench),
    /// The transport's ceiling: a no-op call (`raftmq.v1.Broker/Ping`
    /// with a body of --size bytes, echoed back) on the same port and
    /// connections as sends, stored nowhere.
    Ping(PingBench),
}

#[derive(Debug, Clone, clap::Args)]
pub struct PingBench {
    #[command(flatten)]
    pub common: Common,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
}

/// The flags every bench takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// Access points: host:port, several separated by ';' (or ',').
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub endpoint: String,
    /// The topic.
    #[arg(long, default_value = "TestTopic")]
    pub topic: String,
    /// Concurrent senders or receivers (e2e: of each).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Run this long (e.g. 30s); the default when --count is not given is 10s.
    #[arg(long, value_parser = parse_duration, conflicts_with = "count")]
    pub duration: Option<Duration>,
    /// Stop after this many messages (consume with --ids: this many
    /// different ones, so that redeliveries cannot end an audit early).
    #[arg(long)]
    pub count: Option<u64>,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Write latency-over-time and latency-histogram plots to this PNG.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// Write the ids of the messages acknowledged (produce) or received
    /// (consume, e2e) to this file, one a line: an audit compares them.
    #[arg(long)]
    pub ids: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ProduceBench {
    #[command(flatten)]
    pub common: Common,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Send timed messages due this long after they are sent, with its unit
    /// (the topic must accept DELAY messages).
    #[arg(long, value_parser = crate::cli::produce::parse_delay)]
    pub delay: Option<Duration>,
    /// Open loop: offer this many sends per second whatever the answers,
    /// with at most --concurrency outstanding (offers that find them all
    /// busy are counted as not offered). Without it each sender waits for
    /// its answer before the next send.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Messages per SendMessage request (one queue, one Raft entry); the
    /// latencies are then per request, the rates per message.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub batch: u64,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ConsumeBench {
    #[command(flatten)]
    pub common: Common,
    /// The consumer group.
    #[arg(long, default_value = "BenchGroup")]
    pub group: String,
}

#[derive(Debug, Clone, clap::Args)]
pub struct E2eBench {
    #[command(flatten)]
    pub common: Common,
    /// The consumer group.
    #[arg(long, default_value = "BenchGroup")]
    pub group: String,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
}

/// One bench's settings, whichever command gave them.
#[derive(Debug, Clone)]
struct BenchArgs {
    endpoint: String,
    topic: String,
    group: String,
    concurrency: usize,
    size: usize,
    duration: Option<Duration>,
    count: Option<u64>,
    json: bool,
    plot: Option<std::path::PathBuf>,
    ids: Option<std::path::PathBuf>,
    delay: Option<Duration>,
    rate: Option<u64>,
    /// Messages per send request.
    batch: u64,
    /// `bench ping`: the no-op call instead of a send.
    ping: bool,
}

impl BenchArgs {
    fn new(c: Common, group: Option<String>, size: usize, delay: Option<Duration>, rate: Option<u64>) -> BenchArgs {
        BenchArgs {
            endpoint: c.endpoint,
            topic: c.topic,
            group: group.unwrap_or_default(),
            concurrency: c.concurrency,
            size,
            duration: c.duration,
            count: c.count,
            json: c.json,
            plot: c.plot,
            ids: c.ids,
            delay,
            rate,
            batch: 1,
            ping: false,
        }
    }
}

/// The report, as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: String,
    pub ok: u64,
    /// Refused with TOO_MANY_REQUESTS: the broker was busy, nothing stored.
    pub refused: u64,
    pub errors: u64,
    /// The first error, in words (what the others likely were too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Open loop (--rate): offers that found every sender busy.
    pub not_offered: u64,
    pub secs: f64,
    pub msgs_per_s: f64,
    pub mib_per_s: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// Messages sent (acknowledged) or received in each second of the run,
    /// from the first: how soon a rate recovers.
    pub per_second: Vec<u64>,
}

/// How long a sender waits after the broker said it is busy.
const REFUSED_BACKOFF: Duration = Duration::from_millis(100);

/// How one send ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Ok,
    /// TOO_MANY_REQUESTS: nothing stored, come back later.
    Refused,
    Failed,
}

/// Latency samples: (seconds since the start, latency in µs, messages the
/// call sent or received).
type Samples = Arc<Mutex<Vec<(f64, u64, u64)>>>;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

struct Run {
    args: BenchArgs,
    client: Client,
    started: Instant,
    deadline: Option<Instant>,
    /// Messages sent (or received) and their budget.
    sent: AtomicU64,
    received: AtomicU64,
    refused: AtomicU64,
    /// Messages the broker acknowledged (a send carries `--batch` of them).
    messages_ok: AtomicU64,
    errors: AtomicU64,
    first_error: std::sync::OnceLock<String>,
    not_offered: AtomicU64,
    samples: Samples,
    /// This run's id (see [`RUN_ID`]).
    run_id: String,
    /// e2e: count only this run's messages.
    own_only: bool,
    /// With `--ids`: the acknowledged or received messages' ids, in order
    /// (a redelivered one again), and those seen.
    ids: Option<std::sync::Mutex<(Vec<String>, HashSet<String>)>>,
    /// With `--ids`: different ids seen.
    distinct: AtomicU64,
}

impl Run {
    /// Whether another send of `--batch` messages is within the budget.
    fn budget_left(&self, counter: &AtomicU64) -> bool {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        match self.args.count {
            Some(n) => counter.fetch_add(self.args.batch, Ordering::Relaxed) < n,
            None => {
                counter.fetch_add(self.args.batch, Ordering::Relaxed);
                true
            }
        }
    }

    /// One call done: its latency, and the messages it carried.
    async fn record(&self, latency_us: u64, messages: u64) {
        let at = self.started.elapsed().as_secs_f64();
        self.samples.lock().await.push((at, latency_us, messages));
    }

    async fn send_loop(self: Arc<Self>, e2e: bool) {
        let mut i = 0u64;
        while self.budget_left(&self.sent) {
            if self.send_one(i, e2e).await == Sent::Refused {
                tokio::time::sleep(REFUSED_BACKOFF).await;
            }
            i += 1;
        }
    }

    /// Open loop: offers `rate` sends a second until the budget is spent,
    /// each in its own task, at most `--concurrency` outstanding.
    async fn rate_loop(self: Arc<Self>, rate: u64) {
        let room = Arc::new(tokio::sync::Semaphore::new(self.args.concurrency));
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        let mut offered = 0u64;
        'offering: loop {
            tick.tick().await;
            let due = (self.started.elapsed().as_secs_f64() * rate as f64) as u64;
            while offered < due {
                if !self.budget_left(&self.sent) {
                    break 'offering;
                }
                match room.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let run = self.clone();
                        tokio::spawn(async move {
                            // A refused sender backs off before its slot is
                            // free again, as the official clients do.
                            if run.send_one(offered, false).await == Sent::Refused {
                                tokio::time::sleep(REFUSED_BACKOFF).await;
                            }
                            drop(permit);
                        });
                    }
                    Err(_) => {
                        self.not_offered.fetch_add(1, Ordering::Relaxed);
                    }
                }
                offered += 1;
            }
        }
        // The outstanding sends finish.
        let _ = room.acquire_many(self.args.concurrency as u32).await;
    }

    async fn send_one(&self, i: u64, e2e: bool) -> Sent {
        if self.args.ping {
            return self.ping_one(i).await;
        }
        let batch: Vec<Outgoing> = (0..self.args.batch)
            .map(|k| {
                let body = pattern_body(i.wrapping_mul(self.args.batch).wrapping_add(k), self.args.size);
                let mut m = Outgoing::new(self.args.topic.clone(), body)
                    .property(SENT_US, now_us().to_string())
                    .property(RUN_ID, self.run_id.clone());
                if let Some(d) = self.args.delay {
                    m = m.deliver_at(crate::clock::now_ms() + d.as_millis() as u64);
                }
                m
            })
            .collect();
        let t = Instant::now();
        match self.client.send_batch(batch).await {
            Ok(r) => {
                self.messages_ok.fetch_add(r.len() as u64, Ordering::Relaxed);
                self.note_ids(r.iter().map(|s| &s.message_id));
                if !e2e {
                    self.record(t.elapsed().as_micros() as u64, r.len() as u64).await;
                }
                Sent::Ok
            }
            Err(ClientError::Refused {
                code: Code::TooManyRequests,
                ..
            }) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Sent::Refused
            }
            Err(e) => {
                self.failed(&e);
                Sent::Failed
            }
        }
    }

    /// Keeps message ids for `--ids`.
    fn note_ids<'a>(&self, ids: impl Iterator<Item = &'a String>) {
        if let Some(kept) = &self.ids {
            let mut kept = kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let (order, seen) = &mut *kept;
            for id in ids {
                order.push(id.clone());
                if seen.insert(id.clone()) {
                    self.distinct.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Counts an error, keeping the first one's words.
    fn failed(&self, e: &dyn std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if self.first_error.get().is_none() {
            let _ = self.first_error.set(e.to_string());
        }
    }

    async fn ping_one(&self, i: u64) -> Sent {
        let payload = pattern_body(i, self.args.size);
        let t = Instant::now();
        match self.client.ping(payload.into()).await {
            Ok(()) => {
                self.messages_ok.fetch_add(1, Ordering::Relaxed);
                self.record(t.elapsed().as_micros() as u64, 1).await;
                Sent::Ok
            }
            Err(e) => {
                self.failed(&e);
                Sent::Failed
            }
        }
    }

    async fn receive_loop(self: Arc<Self>) {
        let a = &self.args;
        // Without a time limit, a receiver gives up after this long with
        // nothing to receive (messages fewer than --count).
        let mut last_got = Instant::now();
        loop {
            if self.deadline.is_none() && last_got.elapsed() > Duration::from_secs(10) {
                return;
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                return;
            }
            let received = match self.ids {
                Some(_) => &self.distinct,
                None => &self.received,
            };
            if a.count.is_some_and(|n| received.load(Ordering::Relaxed) >= n) {
                return;
            }
            let r = self
                .client
                .receive(
                    &a.group,
                    &a.topic,
                    "*",
                    32,
                    Duration::from_secs(30),
                    Duration::from_millis(500),
                )
                .await;
            match r {
                Ok(batch) => {
                    if !batch.is_empty() {
                        last_got = Instant::now();
                    }
                    let now = now_us();
                    let mut counted = 0u64;
                    for m in &batch {
                        let own = m.properties.iter().any(|(k, v)| k == RUN_ID && *v == self.run_id);
                        if self.own_only && !own {
                            // Left by an earlier run: drained, not measured.
                            continue;
                        }
                        counted += 1;
                        self.note_ids(std::iter::once(&m.message_id));
                        let sent = m
                            .properties
                            .iter()
                            .find(|(k, _)| k == SENT_US)
                            .and_then(|(_, v)| v.parse::<u64>().ok());
                        if let Some(s) = sent {
                            self.record(now.saturating_sub(s), 1).await;
                        }
                    }
                    self.received.fetch_add(counted, Ordering::Relaxed);
                    if let Err(e) = self.client.ack(&a.group, &a.topic, &batch).await {
                        self.failed(&e);
                    }
                }
                Err(e) => {
                    self.failed(&e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    let (mode, a) = match cmd {
        BenchCommand::Produce(b) => (
            "produce",
            BenchArgs {
                batch: b.batch,
                ..BenchArgs::new(b.common, None, b.size, b.delay, b.rate)
            },
        ),
        BenchCommand::Consume(b) => ("consume", BenchArgs::new(b.common, Some(b.group), 0, None, None)),
        BenchCommand::E2e(b) => ("e2e", BenchArgs::new(b.common, Some(b.group), b.size, None, None)),
        BenchCommand::Ping(b) => (
            "ping",
            BenchArgs {
                ping: true,
                ..BenchArgs::new(b.common, None, b.size, None, None)
            },
        ),
    };
    if a.concurrency == 0 || a.concurrency > 4096 {
        anyhow::bail!("--concurrency must be between 1 and 4096");
    }
    if a.rate == Some(0) {
        anyhow::bail!("--rate must be at least 1 send per second");
    }
    let duration = a.duration.or(a.count.is_none().then_some(Duration::from_secs(10)));
    let client = Client::connect_with(&a.endpoint, &crate::cli::connect::dialer())?
        .with_credentials(crate::cli::connect::credentials());
    // Fail early, and clearly, on a wrong topic or endpoint.
    client
        .route(&a.topic)
        .await
        .map_err(|e| anyhow::anyhow!("topic {}: {e}", a.topic))?;
    let started = Instant::now();
    let run = Arc::new(Run {
        client,
        started,
        deadline: duration.map(|d| started + d),
        sent: AtomicU64::new(0),
        received: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        messages_ok: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        first_error: std::sync::OnceLock::new(),
        not_offered: AtomicU64::new(0),
        samples: Arc::default(),
        run_id: format!("{:016x}", rand::random::<u64>()),
        own_only: mode == "e2e",
        ids: a.ids.is_some().then(Default::default),
        distinct: AtomicU64::new(0),
        args: a.clone(),
    });
    let bar = progress_bar(&a, duration);
    let mut tasks = Vec::new();
    if let Some(rate) = a.rate {
        tasks.push(tokio::spawn(run.clone().rate_loop(rate)));
    }
    for _ in 0..a.concurrency {
        if mode != "consume" && a.rate.is_none() {
            tasks.push(tokio::spawn(run.clone().send_loop(mode == "e2e")));
        }
        if mode == "consume" || mode == "e2e" {
            tasks.push(tokio::spawn(run.clone().receive_loop()));
        }
    }
    let counter = |r: &Run| {
        if mode == "produce" || mode == "ping" {
            r.messages_ok.load(Ordering::Relaxed)
        } else {
            r.received.load(Ordering::Relaxed)
        }
    };
    let all = futures::future::join_all(tasks);
    tokio::pin!(all);
    // Made once: see `raftmq dev` (a `ctrl_c()` per turn can miss a SIGINT).
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    loop {
        tokio::select! {
            _ = &mut all => break,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                let done = counter(&run);
                let secs = started.elapsed().as_secs_f64().max(1e-9);
                match (a.count, duration) {
                    (Some(_), _) => bar.set_position(done),
                    (None, Some(_)) => bar.set_position(started.elapsed().as_secs()),
                    _ => {}
                }
                bar.set_message(format!("{done} msgs, {:.0} msgs/s, {} errors", done as f64 / secs, run.errors.load(Ordering::Relaxed)));
            }
            _ = interrupt.recv() => break,
        }
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let samples = std::mem::take(&mut *run.samples.lock().await);
    let mut per_second = vec![0u64; secs.ceil() as usize];
    for (at, _, messages) in &samples {
        if let Some(n) = per_second.get_mut(*at as usize) {
            *n += messages;
        }
    }
    if let (Some(path), Some(ids)) = (&a.ids, &run.ids) {
        let ids = ids.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut text = String::with_capacity(ids.0.len() * 33);
        for id in ids.0.iter() {
            text.push_str(id);
            text.push('\n');
        }
        std::fs::write(path, text).map_err(|e| anyhow::anyhow!("--ids {}: {e}", path.display()))?;
    }
    let mut lat: Vec<u64> = samples.iter().map(|(_, l, _)| *l).collect();
    lat.sort_unstable();
    let ok = if mode == "produce" || mode == "ping" {
        run.messages_ok.load(Ordering::Relaxed)
    } else {
        run.received.load(Ordering::Relaxed)
    };
    let report = Report {
        mode: mode.into(),
        ok,
        refused: run.refused.load(Ordering::Relaxed),
        errors: run.errors.load(Ordering::Relaxed),
        first_error: run.first_error.get().cloned(),
        not_offered: run.not_offered.load(Ordering::Relaxed),
        secs,
        msgs_per_s: ok as f64 / secs,
        mib_per_s: ok as f64 * a.size as f64 / secs / (1024.0 * 1024.0),
        p50_ms: percentile(&lat, 0.5),
        p90_ms: percentile(&lat, 0.9),
        p99_ms: percentile(&lat, 0.99),
        p999_ms: percentile(&lat, 0.999),
        max_ms: lat.last().map_or(0.0, |m| *m as f64 / 1000.0),
        per_second,
    };
    if let Some(path) = &a.plot {
        let points: Vec<(f64, u64)> = samples.iter().map(|&(at, l, _)| (at, l)).collect();
        crate::cli::bench::plot::draw(path, &format!("raftmq bench {mode}"), &points)?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{mode}: {} ok, {} refused (busy), {} errors in {:.1} s: {:.0} msgs/s, {:.2} MiB/s",
            report.ok, report.refused, report.errors, report.secs, report.msgs_per_s, report.mib_per_s
        );
        if let Some(e) = &report.first_error {
            println!("first error: {e}");
        }
        if a.rate.is_some() {
            println!("offers not made (every sender busy): {}", report.not_offered);
        }
        println!(
            "latency ms: p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
            report.p50_ms, report.p90_ms, report.p99_ms, report.p999_ms, report.max_ms
        );
        if let Some(p) = &a.plot {
            println!("plots: {}", p.display());
        }
    }
    Ok(())
}

fn progress_bar(a: &BenchArgs, duration: Option<Duration>) -> indicatif::ProgressBar {
    let bar = match (a.count, duration) {
        (Some(n), _) => indicatif::ProgressBar::new(n),
        (None, Some(d)) => indicatif::ProgressBar::new(d.as_secs().max(1)),
        _ => indicatif::ProgressBar::new_spinner(),
    };
    if a.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let style = indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}
