//! deploy/monitoring with the real thing: `promtool` checks the shipped
//! rules and scrape config and runs the rules' unit tests (each alert fires
//! on synthetic series of its failure), then a real Prometheus scrapes a `raftmq dev`
//! cluster (and its NameServer) while it carries every kind of traffic the
//! rules and the dashboard chart: normal, FIFO, timed and transactional
//! sends, consumers with a backlog, dead letters, client heartbeats. Every
//! PromQL expression of the Grafana dashboard and every alert rule's signal
//! (its expression without the final comparison) must then return data
//! through Prometheus's HTTP API; the whole rule must evaluate.
//!
//! Prometheus is Debian's `prometheus` package, unpacked under
//! `target/tmp/prometheus` by `.ci/run` (or by this test where missing).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::dev::{base_port, start_dev};
use common::scenario::install_once;
use common::{raftmq_cli, scrape, sum_of};
use raftmq::client::{Client, Outgoing};
use raftmq::proto::rocketmq::v2;
use raftmq::proto::rocketmq::v2::messaging_service_client::MessagingServiceClient;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `usr/bin` of the unpacked package, unpacked here if `.ci/run` did not.
fn prometheus_bin() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prometheus");
    install_once(&dir, "prometheus (Debian package)", || {
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("sh")
            .arg("-c")
            .arg("apt-get download -qq prometheus && dpkg -x prometheus_*.deb . && rm -f prometheus_*.deb")
            .current_dir(&dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "could not unpack Debian's prometheus package into {dir:?}");
    });
    dir.join("usr/bin")
}

/// Kills what the test started, however it ends.
/// Prometheus, stopped when the test ends (dev stops by its own guard).
struct Stop(Vec<Child>);

impl Drop for Stop {
    fn drop(&mut self) {
        for c in &mut self.0 {
            common::interrupt(c, Duration::from_secs(30));
        }
    }
}

/// One GET to Prometheus: the status code and the body.
fn get(addr: &str, path: &str) -> (u16, String) {
    common::http_get_as(addr, path, "HTTP/1.0")
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query: the result vector, or Prometheus's error.
fn query(prom: &str, expr: &str) -> Result<Vec<serde_json::Value>, String> {
    let (code, body) = get(prom, &format!("/api/v1/query?query={}", url_encode(expr)));
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{code} {e}: {body}"))?;
    if v["status"] != "success" {
        return Err(format!("{code}: {body}"));
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

/// An alert's expression without its final top-level comparison (the
/// signal the threshold applies to).
fn signal(expr: &str) -> &str {
    let b = expr.as_bytes();
    let (mut depth, mut quoted, mut cut) = (0i32, false, None);
    for (i, c) in b.iter().enumerate() {
        match c {
            b'"' => quoted = !quoted,
            _ if quoted => {}
            b'(' | b'{' | b'[' => depth += 1,
            b')' | b'}' | b']' => depth -= 1,
            b'<' | b'>' | b'=' | b'!' if depth == 0 => {
                // `==`, `!=`, `<=`, `>=`, `<`, `>`: the operator's start.
                let prev = i.checked_sub(1).map(|p| b[p]);
                if !matches!(prev, Some(b'<' | b'>' | b'=' | b'!')) {
                    cut = Some(i);
                }
            }
            _ => {}
        }
    }
    cut.map_or(expr, |i| expr[..i].trim())
}

/// Every `expr` of the dashboard's panels, with Grafana's variables given
/// what Grafana would give them ("All" clusters, a rate interval that
/// spans several scrapes).
fn dashboard_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo("deploy/monitoring/grafana-dashboard.json")).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let e = t["expr"].as_str().unwrap();
            let e = e.replace("$cluster", ".+").replace("$__rate_interval", "1m");
            out.push((p["title"].as_str().unwrap().to_string(), e));
        }
    }
    out
}

#[test]
fn promtool_accepts_the_shipped_rules_and_config_and_the_alerts_fire() {
    let bin = prometheus_bin();
    for args in [
        vec!["check", "rules", "deploy/monitoring/alerts.yml"],
        vec!["check", "config", "deploy/monitoring/prometheus.yml"],
        // The alerts fire on synthetic series of their failures.
        vec!["test", "rules", "deploy/monitoring/alerts_test.yml"],
    ] {
        let out = Command::new(bin.join("promtool"))
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A v2 heartbeat, as the official clients send one (so the node counts a
/// connection of that kind).
async fn heartbeat(addr: &str, id: &str, client_type: v2::ClientType, group: Option<&str>) {
    let mut c = MessagingServiceClient::connect(format!("http://{addr}")).await.unwrap();
    let mut r = tonic::Request::new(v2::HeartbeatRequest {
        group: group.map(|g| v2::Resource {
            resource_namespace: String::new(),
            name: g.into(),
        }),
        client_type: client_type as i32,
    });
    r.metadata_mut().insert("x-mq-client-id", id.parse().unwrap());
    r.metadata_mut().insert("x-mq-language", "JAVA".parse().unwrap());
    r.metadata_mut().insert("x-mq-client-version", "5.0.7".parse().unwrap());
    let s = c.heartbeat(r).await.unwrap().into_inner().status.unwrap();
    assert_eq!(s.code, v2::Code::Ok as i32, "{s:?}");
}

/// Traffic of every kind the dashboard and the rules chart.
async fn load(access: &str, namesrv: &str, metrics: &[&str]) {
    let (ok, _, err) = raftmq_cli(&[
        "group",
        "create",
        "--namesrv",
        namesrv,
        "--group",
        "Dead",
        "--max-attempts",
        "1",
    ]);
    assert!(ok, "{err}");
    for (topic, kind) in [("Fifo", "FIFO"), ("Timed", "DELAY"), ("Tx", "TRANSACTION")] {
        let args = [
            "topic",
            "create",
            "--namesrv",
            namesrv,
            "--topic",
            topic,
            "--message-type",
            kind,
        ];
        let (ok, _, err) = raftmq_cli(&args);
        assert!(ok, "{err}");
    }
    let client = Client::connect(access).unwrap();
    for i in 0..100 {
        let m = Outgoing::new("TestTopic", format!("m{i}"))
            .tag("T")
            .key(format!("k{i}"));
        client.send(m).await.unwrap();
    }
    for i in 0..10 {
        let m = Outgoing::new("Fifo", format!("f{i}")).message_group("g1");
        client.send(m).await.unwrap();
    }
    let soon = raftmq::clock::now_ms() + 2_000;
    for i in 0..5 {
        client
            .send(Outgoing::new("Timed", format!("t{i}")).deliver_at(soon))
            .await
            .unwrap();
    }
    // One committed, one rolled back, one left pending.
    let mut halves = Vec::new();
    for i in 0..3 {
        let m = Outgoing::new("Tx", format!("x{i}")).transactional();
        halves.push(client.send(m).await.unwrap());
    }
    client.end_transaction("Tx", &halves[0], true).await.unwrap();
    client.end_transaction("Tx", &halves[1], false).await.unwrap();

    // A consumer that keeps a backlog, and one whose messages all die.
    let wait = Duration::from_secs(2);
    let got = client
        .receive("Slow", "TestTopic", "*", 30, Duration::from_secs(60), wait)
        .await
        .unwrap();
    assert!(!got.is_empty());
    client.ack("Slow", "TestTopic", &got).await.unwrap();
    let first = client
        .receive("Dead", "TestTopic", "*", 4, Duration::from_secs(10), wait)
        .await
        .unwrap();
    assert!(!first.is_empty());
    // Unacknowledged past its only attempt: the next receive moves it to
    // %DLQ%Dead (the shortest invisible time is 10 s).
    tokio::time::sleep(Duration::from_secs(11)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        client
            .receive("Dead", "TestTopic", "*", 4, Duration::from_secs(60), wait)
            .await
            .unwrap();
        let dead: f64 = metrics
            .iter()
            .map(|a| sum_of(&scrape(a), "rocketmq_send_to_dlq_messages_total", &[]))
            .sum();
        if dead > 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "nothing was dead-lettered");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_a_dev_cluster_and_every_expression_has_data() {
    let bin = prometheus_bin();
    let dir = tempfile::tempdir().unwrap();
    let (_dev, info) = start_dev(dir.path(), base_port(), &[]);
    let mut stop = Stop(vec![]);
    let nodes = info["nodes"].as_array().unwrap();
    let brokers: Vec<String> = nodes
        .iter()
        .map(|n| format!("\"{}\"", n["metrics_addr"].as_str().unwrap()))
        .collect();
    let access: Vec<&str> = nodes.iter().map(|n| n["client_addr"].as_str().unwrap()).collect();
    let namesrv = info["namesrv_addr"].as_str().unwrap();

    // The shipped rules, with the shipped job names; scraped every second.
    let prom_port = common::free_port();
    let prom = format!("127.0.0.1:{prom_port}");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {rules:?}\n\
             scrape_configs:\n  - job_name: raftmq-broker\n    static_configs:\n      - targets: [{brokers}]\n\
             \x20 - job_name: raftmq-namesrv\n    static_configs:\n      - targets: [\"{namesrv_metrics}\"]\n",
            rules = repo("deploy/monitoring/alerts.yml"),
            brokers = brokers.join(", "),
            namesrv_metrics = info["namesrv_metrics_addr"].as_str().unwrap(),
        ),
    )
    .unwrap();
    let prometheus = Command::new(bin.join("prometheus"))
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
        .arg(format!("--web.listen-address={prom}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("prometheus.stderr")).unwrap())
        .spawn()
        .unwrap();
    stop.0.push(prometheus);
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(&prom).is_err() || get(&prom, "/-/ready").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "Prometheus never got ready: {}",
            std::fs::read_to_string(dir.path().join("prometheus.stderr")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    for (i, addr) in access.iter().enumerate() {
        heartbeat(addr, &format!("producer-{i}"), v2::ClientType::Producer, None).await;
        heartbeat(
            addr,
            &format!("consumer-{i}"),
            v2::ClientType::SimpleConsumer,
            Some("Slow"),
        )
        .await;
    }
    let metrics: Vec<&str> = nodes.iter().map(|n| n["metrics_addr"].as_str().unwrap()).collect();
    load(&access.join(";"), namesrv, &metrics).await;
    // A few scrapes and rule evaluations after the last of the traffic.
    tokio::time::sleep(Duration::from_secs(4)).await;

    let (code, body) = get(&prom, "/api/v1/rules");
    assert_eq!(code, 200, "{body}");
    let rules: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut exprs = Vec::new();
    for g in rules["data"]["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            let e = r["query"].as_str().unwrap().to_string();
            assert!(query(&prom, &e).is_ok(), "rule {} does not evaluate: {e}", r["name"]);
            assert_eq!(r["health"], "ok", "rule {}: {}", r["name"], r["lastError"]);
            exprs.push((format!("rule {}", r["name"]), signal(&e).to_string()));
        }
    }
    assert_eq!(exprs.len(), 12, "Prometheus loaded every shipped rule");
    exprs.extend(dashboard_exprs());
    let mut empty = Vec::new();
    for (what, e) in &exprs {
        match query(&prom, e) {
            Ok(v) if !v.is_empty() => {}
            Ok(_) => empty.push(format!("{what}: {e}")),
            Err(why) => panic!("{what}: {e}: {why}"),
        }
    }
    assert!(empty.is_empty(), "expressions without data:\n{}", empty.join("\n"));
    drop(stop);
}

#[test]
fn the_signal_of_an_alert_is_its_expression_before_the_comparison() {
    assert_eq!(signal("up{job=\"a\"} == 0"), "up{job=\"a\"}");
    assert_eq!(signal("sum by (a) (x{r=\"l\"}) < 1"), "sum by (a) (x{r=\"l\"})");
    assert_eq!(
        signal("a - ignoring (w) b{w=\"warn\"} > 0"),
        "a - ignoring (w) b{w=\"warn\"}"
    );
    assert_eq!(signal("max(x) >= 2 * 3"), "max(x)");
    assert_eq!(signal("rate(x[5m])"), "rate(x[5m])");
}
