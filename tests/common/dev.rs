//! `raftmq dev` started the way a newcomer starts it, for the tests that
//! drive a whole dev cluster (tests/dev.rs, tests/monitoring.rs).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A base port for `raftmq dev`: every port it lays out (base + 8081 up to
/// base + 9976, 1000 more for the two-group test) stays below the kernel's
/// ephemeral range (32768..), where any outgoing connection may hold one.
pub fn base_port() -> u16 {
    1_000 + (std::process::id() % 20_000) as u16
}

/// A running `raftmq dev`, stopped when dropped: a failed assertion must
/// not leave a cluster behind (its nodes die with it, by PR_SET_PDEATHSIG).
pub struct Dev(std::process::Child);

impl std::ops::Deref for Dev {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Dev {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        super::interrupt(&mut self.0, Duration::from_secs(30));
    }
}

/// The flags that make a CLI command trust a `raftmq dev --secure`
/// cluster's CA and sign as its Super user, from its `dev.json`.
pub fn admin_flags(info: &serde_json::Value) -> Vec<String> {
    let field = |k: &str| {
        info[k]
            .as_str()
            .unwrap_or_else(|| panic!("dev.json names no {k}"))
            .to_string()
    };
    vec![
        "--ca-cert".into(),
        field("ca_cert"),
        "--access-key".into(),
        field("admin_access_key"),
        "--secret-key".into(),
        field("admin_secret_key"),
    ]
}

/// Starts `raftmq dev` on `dir` (its stderr in `dir/dev.stderr`) and waits
/// (90 s at most) for its `dev.json`, which it returns.
///
/// Every node gets `--node-config` with retention's disk watermarks at
/// 100 %: the host's disk use must not decide a test (a CI machine once
/// stood at 91.8 % and the nodes rightly refused writes; retention has its
/// own tests).
pub fn start_dev(dir: &std::path::Path, base: u16, extra: &[&str]) -> (Dev, serde_json::Value) {
    let dev_err = dir.join("dev.stderr");
    let node_config = dir.join("test-node-config.toml");
    std::fs::write(
        &node_config,
        "[store.retention]\ndisk_warn_ratio = 1.0\ndisk_force_ratio = 1.0\ndisk_refuse_ratio = 1.0\n",
    )
    .unwrap();
    let mut dev = Dev(Command::new(env!("CARGO_BIN_EXE_raftmq"))
        .arg("dev")
        .args(extra)
        .arg("--node-config")
        .arg(&node_config)
        .arg("--dir")
        .arg(dir)
        .args(["--base-port", &base.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&dev_err).unwrap())
        .spawn()
        .unwrap());
    let info_path = dir.join("dev.json");
    let deadline = Instant::now() + Duration::from_secs(90);
    while !info_path.exists() {
        assert!(
            dev.try_wait().unwrap().is_none(),
            "raftmq dev exited early: {}",
            std::fs::read_to_string(&dev_err).unwrap_or_default()
        );
        assert!(Instant::now() < deadline, "dev.json never appeared");
        std::thread::sleep(Duration::from_millis(100));
    }
    let info = serde_json::from_slice(&std::fs::read(&info_path).unwrap()).unwrap();
    (dev, info)
}

/// A CLI command against a `raftmq dev --secure` cluster as its Super
/// user ([`admin_flags`]); returns (success, stdout, stderr).
pub fn admin_cli(info: &serde_json::Value, args: &[&str]) -> (bool, String, String) {
    let flags = admin_flags(info);
    let mut all = args.to_vec();
    all.extend(flags.iter().map(String::as_str));
    super::raftmq_cli(&all)
}
