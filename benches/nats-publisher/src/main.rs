//! Publishes to a JetStream stream at a fixed concurrency and prints one
//! JSON report with the fields `raftmq bench produce --json` prints.
//!
//!   nats-publisher <servers> <concurrency> <seconds> <size> [replicas]
//!
//! `servers` is a comma-separated list of `nats://host:port`. The stream
//! `BENCH` (subject `bench`, file storage, `replicas` copies, default 3)
//! is created fresh first. Each sender publishes one message and waits for
//! its acknowledgement (stored on a quorum) before the next.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use bytes::Bytes;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str, default: Option<T>) -> T {
    match args.get(i).map(|a| a.parse::<T>()) {
        Some(Ok(v)) => v,
        None if default.is_some() => default.unwrap(),
        _ => {
            eprintln!("usage: nats-publisher <servers> <concurrency> <seconds> <size> [replicas] ({what}?)");
            std::process::exit(2)
        }
    }
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let servers: String = arg(&args, 0, "servers", None);
    let concurrency: usize = arg(&args, 1, "concurrency", None);
    let secs: u64 = arg(&args, 2, "seconds", None);
    let size: usize = arg(&args, 3, "size", None);
    let replicas: usize = arg(&args, 4, "replicas", Some(3));
    if concurrency == 0 || concurrency > 4096 || secs == 0 || secs > 3600 {
        return Err("concurrency must be 1..=4096 and seconds 1..=3600".into());
    }
    let client = async_nats::connect(servers.split(',').collect::<Vec<_>>()).await?;
    let js = jetstream::new(client);
    // The cluster may still be electing its JetStream meta leader.
    let config = stream::Config {
        name: "BENCH".into(),
        subjects: vec!["bench".into()],
        storage: stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    };
    let mut tries = 0;
    loop {
        let _ = js.delete_stream("BENCH").await;
        match js.create_stream(config.clone()).await {
            Ok(_) => break,
            Err(e) if tries < 300 => {
                tries += 1;
                if tries % 50 == 0 {
                    eprintln!("creating the stream: {e}; retrying");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    // Let the stream's own Raft group elect its leader before the clock starts.
    for _ in 0..100 {
        if js.publish("bench", Bytes::from_static(b"warm-up")).await?.await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = Bytes::from(vec![b'x'; size]);
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (js, body, errors) = (js.clone(), body.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let ok = match js.publish("bench", body.clone()).await {
                    Ok(ack) => ack.await.is_ok(),
                    Err(_) => false,
                };
                if ok {
                    lat.push(t.elapsed().as_micros() as u64);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    lat.sort_unstable();
    let report = serde_json::json!({
        "mode": "nats-publish",
        "ok": lat.len(),
        "errors": errors.load(Ordering::Relaxed),
        "secs": elapsed,
        "msgs_per_s": lat.len() as f64 / elapsed,
        "p50_ms": percentile(&lat, 0.5),
        "p90_ms": percentile(&lat, 0.9),
        "p99_ms": percentile(&lat, 0.99),
        "max_ms": lat.last().map_or(0.0, |m| *m as f64 / 1000.0),
    });
    println!("{report}");
    Ok(())
}
