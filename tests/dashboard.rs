//! The dashboard that `raftmq dev` serves, used in a real browser: headless
//! Chromium driven by selenium (`tests/dashboard/browse.py`) opens every
//! page, creates a topic through its form, sends a message and finds it by
//! key, resends a dead letter, creates a consumer group, and sees a killed
//! leader replaced on the cluster page without a reload. The screenshots
//! land in `target/dashboard-screenshots/` (two are in the README).
//!
//! Chromium and its driver are Debian's `chromium` and `chromium-driver`
//! (`.ci/run` installs them); selenium is installed from PyPI into a
//! virtualenv under cargo's target tmp directory on first use.
//!
//! Also here, without a browser: the same-origin guard on changes, and
//! logging in against `raftmq dev --secure` (ACL on).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::dev::{base_port, start_dev};
use common::raftmq_cli;
use common::scenario::python_venv;
use raftmq::client::{Client, Outgoing};

const SELENIUM: &str = "selenium==4.45.0";

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// One message in `%DLQ%<group>`: delivered once to a group allowed one
/// delivery, never acknowledged, then due again.
async fn make_dead_letter(namesrv: &str, access: &str, topic: &str, group: &str) {
    let (ok, _, err) = raftmq_cli(&[
        "topic",
        "create",
        "--namesrv",
        namesrv,
        "--topic",
        topic,
        "--queues",
        "1",
    ]);
    assert!(ok, "topic create: {err}");
    let (ok, _, err) = raftmq_cli(&[
        "group",
        "create",
        "--namesrv",
        namesrv,
        "--group",
        group,
        "--max-attempts",
        "1",
    ]);
    assert!(ok, "group create: {err}");
    let client = Client::connect(access).unwrap();
    let mut m = Outgoing::new(topic, "a message nobody could handle");
    m.keys = vec!["dead-1".into()];
    client.send(m).await.unwrap();
    let wait = Duration::from_secs(2);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = client
            .receive(group, topic, "*", 4, Duration::from_secs(10), wait)
            .await
            .unwrap();
        if !got.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the message was never delivered");
    }
    // Its only delivery times out after 10 s (the shortest invisible
    // time); a receive after that moves it to the dead-letter topic.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let dlq = format!("%DLQ%{group}");
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        client
            .receive(group, topic, "*", 4, Duration::from_secs(60), wait)
            .await
            .unwrap();
        let (_, found, _) = raftmq_cli(&[
            "message",
            "range",
            "--namesrv",
            namesrv,
            "--topic",
            &dlq,
            "--begin",
            "1h",
        ]);
        if found.contains("dead-1") {
            return;
        }
        assert!(Instant::now() < deadline, "the message never reached {dlq}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_walks_every_page_in_a_real_browser() {
    assert!(
        on_path("chromium") && on_path("chromedriver"),
        "Chromium and its driver are needed: apt-get install chromium chromium-driver (.ci/run does)"
    );
    let python = python_venv("dashboard-venv", SELENIUM);
    let dir = tempfile::tempdir().unwrap();
    let (_dev, info) = start_dev(dir.path(), base_port(), &[]);
    let namesrv = info["namesrv_addr"].as_str().unwrap();
    let access: Vec<&str> = info["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["client_addr"].as_str().unwrap())
        .collect();
    make_dead_letter(namesrv, &access.join(";"), "DeadTopic", "Dead").await;

    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-screenshots");
    let url = format!("http://{}", info["dashboard_addr"].as_str().unwrap());
    let out = Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard/browse.py"))
        .args(["--url", &url, "--shots"])
        .arg(&shots)
        .arg("--dev-json")
        .arg(dir.path().join("dev.json"))
        .args(["--dead-topic", "DeadTopic", "--dead-group", "Dead"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("dashboard walk: ok"),
        "the browser walk failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    for page in [
        "topics",
        "topic",
        "message",
        "dead-letters",
        "groups",
        "group",
        "charts",
        "cluster",
        "cluster-failover",
    ] {
        let png = shots.join(format!("{page}.png"));
        let len = std::fs::metadata(&png).map_or(0, |m| m.len());
        assert!(len > 10_000, "{} is missing or blank ({len} bytes)", png.display());
    }
}

/// A raw HTTP/1.1 request to the dashboard; (status, headers and body).
fn http(addr: &str, request: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out)
}

fn post(addr: &str, path: &str, extra_headers: &str, form: &str) -> (u16, String) {
    http(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra_headers}\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        ),
    )
}

fn get(addr: &str, path: &str, cookie: &str) -> (u16, String) {
    http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nCookie: {cookie}\r\n\r\n"),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn with_acl_on_pages_call_as_the_user_logged_in_and_other_sites_cannot_post() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, info) = start_dev(dir.path(), base_port() + 500, &["--secure"]);
    let addr = info["dashboard_addr"].as_str().unwrap().to_string();
    let (ak, sk) = (
        info["admin_access_key"].as_str().unwrap(),
        info["admin_secret_key"].as_str().unwrap(),
    );

    // Not logged in: the cluster refuses, and the page says what to do.
    // (The page asks a broker once the NameServer lists a topic, which its
    // broker's heartbeat may bring a moment after `dev.json` is written.)
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (code, page) = get(&addr, "/topics", "");
        assert_eq!(code, 200);
        if page.contains("log in with an access key") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Without a login, a change is refused by the cluster, and said so.
    let form = "name=Evil&queues=1&message_type=NORMAL&perm=6";
    let (code, body) = post(&addr, "/topics", "", form);
    assert_eq!(code, 303);
    assert!(body.contains("error="), "{body}");

    // Other sites' pages are refused before anything happens: a form
    // posted from another origin, or cross-site, and any request under a
    // host name the dashboard is not served as (DNS rebinding).
    let (code, body) = post(&addr, "/topics", "Origin: http://evil.example\r\n", form);
    assert_eq!(code, 403, "{body}");
    let (code, body) = post(&addr, "/topics", "Sec-Fetch-Site: cross-site\r\n", form);
    assert_eq!(code, 403, "{body}");
    let port = addr.rsplit(':').next().unwrap();
    let (code, body) = http(
        &addr,
        &format!("GET /cluster HTTP/1.1\r\nHost: evil.example:{port}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(code, 403, "{body}");
    let (code, body) = get(&addr, "/cluster", "");
    assert_eq!(code, 200);
    for h in ["x-frame-options: DENY", "content-security-policy: default-src 'none'"] {
        assert!(body.contains(h), "no {h}: {body}");
    }

    // A wrong secret does not log in; the right one does.
    let (code, body) = post(&addr, "/login", "", &format!("access_key={ak}&secret_key=wrong"));
    assert_eq!(code, 303);
    assert!(body.contains("error=wrong+access+key"), "{body}");
    let (code, body) = post(&addr, "/login", "", &format!("access_key={ak}&secret_key={sk}"));
    assert_eq!(code, 303, "{body}");
    let cookie = body
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no session cookie: {body}"))
        .to_string();
    assert!(body.contains("HttpOnly; SameSite=Strict"), "{body}");

    // Logged in: the pages show the cluster, changes go through.
    let (_, page) = get(&addr, "/cluster", &cookie);
    assert!(page.contains("leader-id"), "{page}");
    let (code, body) = post(
        &addr,
        "/topics",
        &format!("Cookie: {cookie}\r\nOrigin: http://{addr}\r\n"),
        "name=SecureTopic&queues=2&message_type=NORMAL&perm=6",
    );
    assert_eq!(code, 303);
    assert!(body.contains("ok=topic+SecureTopic+created"), "{body}");
    let (_, page) = get(&addr, "/topics", &cookie);
    assert!(page.contains("data-topic=\"SecureTopic\""), "{page}");
    assert!(!page.contains("data-topic=\"Evil\""), "{page}");

    // A Normal user allowed only to publish to SecureTopic is offered only
    // that: no topic creation, a send form on SecureTopic's page, and no
    // update or delete there (the dashboard read her policy at login).
    for args in [
        &["user", "create", "-u", "alice", "-p", "alice-secret"][..],
        &[
            "acl",
            "create",
            "-s",
            "User:alice",
            "-r",
            "Topic:SecureTopic",
            "-a",
            "Pub,Get",
            "-d",
            "Allow",
        ],
    ] {
        let namesrv = info["namesrv_addr"].as_str().unwrap();
        let args = [args, &["--namesrv", namesrv][..]].concat();
        let (ok, _, err) = common::dev::admin_cli(&info, &args);
        assert!(ok, "{args:?}: {err}");
    }
    let (code, body) = post(&addr, "/login", "", "access_key=alice&secret_key=alice-secret");
    assert_eq!(code, 303, "{body}");
    let alice = body
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no session cookie for alice: {body}"))
        .to_string();
    let (_, page) = get(&addr, "/topics", &alice);
    assert!(page.contains("data-topic=\"SecureTopic\""), "{page}");
    assert!(
        !page.contains("id=\"create-topic\""),
        "alice may not create topics: {page}"
    );
    let (_, page) = get(&addr, "/topic?name=SecureTopic", &alice);
    assert!(page.contains("id=\"send-form\""), "alice may publish: {page}");
    assert!(
        !page.contains("/topic/delete") && !page.contains("/topic/update"),
        "{page}"
    );
    let (_, page) = get(&addr, "/topic?name=SecureTopic", &cookie);
    assert!(
        page.contains("/topic/delete"),
        "the Super user is offered deletion: {page}"
    );

    // Logged out, the cookie is worth nothing.
    let (code, body) = post(&addr, "/logout", &format!("Cookie: {cookie}\r\n"), "");
    assert_eq!(code, 303, "{body}");
    let (_, page) = get(&addr, "/topics", &cookie);
    assert!(page.contains("log in with an access key"), "{page}");
}
