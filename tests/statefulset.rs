//! The StatefulSet's config (`deploy/kubernetes/group/broker.toml`, the one
//! file every pod of every group mounts) run as three local processes that
//! differ only in their host name (`RAFTMQ_HOSTNAME=broker-a-<ordinal>`).
//! A hosts file (`RAFTMQ_HOSTS`) puts each pod's DNS name on a loopback
//! address of its own, as the headless Service would, and the NameServer's
//! Service name on another. Only `data_dir` is rewritten: in Kubernetes
//! each pod has its own volume at that path, here each gets a directory.
//!
//! Checked: the three form group `broker-a` with node ids 1..3 from their
//! ordinals and register under their DNS names; the group serves through
//! any node; ordinal 0, restarted with its disk lost, does not bootstrap a
//! second history but rejoins the group and catches up.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use raftmq::proto::pb;
use raftmq::proto::pb::broker_client::BrokerClient;

/// Pod `ordinal`'s loopback address: what its DNS name resolves to.
fn pod_ip(ordinal: u64) -> String {
    format!("127.0.0.{}", ordinal + 2)
}

const NAMESRV_IP: &str = "127.0.0.5";

struct Pods {
    dir: PathBuf,
    config: PathBuf,
    hosts: PathBuf,
    children: Vec<Option<Child>>,
}

impl Pods {
    fn spawn(&mut self, ordinal: u64) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("broker-a-{ordinal}.log")))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_raftmq"))
            .args(["broker", "--config"])
            .arg(&self.config)
            .env("RAFTMQ_HOSTNAME", format!("broker-a-{ordinal}"))
            .env("RAFTMQ_HOSTS", &self.hosts)
            .env("RUST_LOG", "warn,raftmq=info")
            // Each "pod" in its own working directory: the relative
            // data_dir below is its own volume.
            .current_dir(self.pod_dir(ordinal))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children[ordinal as usize] = Some(child);
    }

    fn pod_dir(&self, ordinal: u64) -> PathBuf {
        let d = self.dir.join(format!("pod{ordinal}"));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn stop(&mut self, ordinal: u64) {
        if let Some(mut c) = self.children[ordinal as usize].take() {
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            assert!(c.wait().unwrap().success(), "broker-a-{ordinal} did not stop cleanly");
        }
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn status(ordinal: u64) -> Option<pb::StatusResponse> {
    let ep =
        raftmq::client::channel::endpoint(&format!("{}:8081", pod_ip(ordinal)), Duration::from_millis(500)).ok()?;
    let channel = ep.timeout(Duration::from_secs(2)).connect().await.ok()?;
    BrokerClient::new(channel)
        .status(pb::StatusRequest { with_digest: false })
        .await
        .ok()
        .map(|r| r.into_inner())
}

/// Waits until all three answer and agree on a leader and a term.
async fn formed() -> Vec<pb::StatusResponse> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut all = Vec::new();
        for o in 0..3 {
            all.extend(status(o).await);
        }
        if all.len() == 3
            && all[0].leader_id.is_some()
            && all
                .iter()
                .all(|s| s.leader_id == all[0].leader_id && s.term == all[0].term)
        {
            return all;
        }
        assert!(Instant::now() < deadline, "the group never formed: {all:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn cli(hosts: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_raftmq"))
        .args(args)
        .env("RAFTMQ_HOSTS", hosts)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn one_config_three_host_names_one_group() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let shipped =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/group/broker.toml"))
            .unwrap();
    let data_line = "data_dir = \"/var/lib/raftmq/data\"";
    assert!(shipped.contains(data_line), "the shipped config's data_dir changed");
    let config = dir.join("broker.toml");
    // The host's disk use must not decide a test (CI's disks run over the
    // shipped 90 % watermark).
    let text = shipped.replace(data_line, "data_dir = \"data\"")
        + "\n[store.retention]\ndisk_warn_ratio = 1.0\ndisk_force_ratio = 1.0\ndisk_refuse_ratio = 1.0\n";
    std::fs::write(&config, text).unwrap();
    let hosts = dir.join("hosts");
    let mut text = format!("{NAMESRV_IP} raftmq-namesrv\n");
    for o in 0..3 {
        text.push_str(&format!("{} broker-a-{o}.broker-a\n", pod_ip(o)));
    }
    std::fs::write(&hosts, text).unwrap();

    let ns_config = dir.join("namesrv.toml");
    std::fs::write(&ns_config, format!("listen = \"{NAMESRV_IP}:9876\"\n")).unwrap();
    let namesrv = Command::new(env!("CARGO_BIN_EXE_raftmq"))
        .args(["namesrv", "--config"])
        .arg(&ns_config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("namesrv.log")).unwrap())
        .spawn()
        .unwrap();

    let mut pods = Pods {
        dir: dir.clone(),
        config,
        hosts: hosts.clone(),
        // The NameServer rides along as a fourth child: stopped on any exit.
        children: vec![None, None, None, Some(namesrv)],
    };
    for o in 0..3 {
        pods.spawn(o);
    }
    let all = formed().await;
    let mut ids: Vec<u64> = all.iter().map(|s| s.node_id).collect();
    ids.sort();
    assert_eq!(ids, [1, 2, 3], "node ids are ordinal + 1");
    assert!(all.iter().all(|s| s.group == "broker-a"), "{all:?}");
    assert!(
        all[0]
            .members
            .iter()
            .any(|m| m.client_addr == "broker-a-2.broker-a:8081"),
        "members carry their DNS names: {:?}",
        all[0].members
    );

    // Registered with the NameServer under the Service's name, and serving
    // through a follower (which forwards to the leader by its DNS name).
    let namesrv_addr = "raftmq-namesrv:9876";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out, _) = cli(&hosts, &["cluster", "status", "--json", "--namesrv", namesrv_addr]);
        if ok && out.matches(".broker-a:8081\"").count() == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the NameServer never listed the three pods: {out}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (ok, _, err) = cli(
        &hosts,
        &[
            "topic",
            "create",
            "--topic",
            "K8s",
            "--queues",
            "2",
            "--namesrv",
            namesrv_addr,
        ],
    );
    assert!(ok, "topic create: {err}");
    let leader = all[0].leader_id.unwrap();
    let follower = (0..3).find(|o| o + 1 != leader).unwrap();
    let endpoint = format!("broker-a-{follower}.broker-a:8081");
    let (ok, out, err) = cli(
        &hosts,
        &["produce", "--endpoint", &endpoint, "--topic", "K8s", "--count", "5"],
    );
    assert!(ok, "produce through a follower: {err}");
    assert_eq!(out.lines().filter(|l| l.starts_with("sent ")).count(), 5, "{out}");

    // Ordinal 0 loses its disk: on restart it finds the group alive and
    // waits to be sent the log rather than bootstrapping a new group.
    let before = formed().await;
    let term = before[0].term;
    pods.stop(0);
    std::fs::remove_dir_all(pods.pod_dir(0).join("data")).unwrap();
    pods.spawn(0);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = formed().await;
        let zero = now.iter().find(|s| s.node_id == 1).unwrap();
        let most = now.iter().map(|s| s.commit_index).max().unwrap();
        if zero.applied_index >= most && zero.applied_index > 0 {
            assert!(zero.term >= term, "{zero:?}");
            break;
        }
        assert!(Instant::now() < deadline, "ordinal 0 never caught up: {now:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = std::fs::read_to_string(dir.join("broker-a-0.log")).unwrap();
    assert!(log.contains("the group exists already: not bootstrapping"), "{log}");
    let (ok, out, err) = cli(
        &hosts,
        &[
            "produce",
            "--endpoint",
            "broker-a-0.broker-a:8081",
            "--topic",
            "K8s",
            "--count",
            "2",
        ],
    );
    assert!(ok, "produce after the rejoin: {err}");
    assert_eq!(out.lines().filter(|l| l.starts_with("sent ")).count(), 2, "{out}");
}
