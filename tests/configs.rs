//! Every example config parses and validates, and every key the programs
//! accept is documented in `deploy/CONFIG.md`.

use std::path::Path;

use raftmq::broker::config::BrokerConfig;
use raftmq::namesrv::NamesrvConfig;

fn examples(dir: &str, prefix: &str) -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "toml") && p.file_name().unwrap().to_string_lossy().starts_with(prefix)
        })
        .collect();
    out.sort();
    out
}

/// Every key of a serialized config, nested tables included.
fn keys(v: &serde_json::Value, out: &mut Vec<String>) {
    if let serde_json::Value::Object(m) = v {
        for (k, v) in m {
            // Map entries (peers.<id>) are not keys; their fields are.
            if k.parse::<u64>().is_err() {
                out.push(k.clone());
            }
            keys(v, out);
        }
    }
}

#[test]
fn every_example_config_is_valid_and_every_key_documented() {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/CONFIG.md")).unwrap();
    let mut brokers = examples("deploy/local", "node");
    let mut namesrvs = examples("deploy/local", "namesrv");
    assert_eq!(
        (brokers.len(), namesrvs.len()),
        (3, 2),
        "deploy/local has 3 nodes and 2 NameServers"
    );
    // The container deployment's (deploy/compose/compose.yaml mounts them).
    brokers.extend(examples("deploy/compose", "node"));
    namesrvs.extend(examples("deploy/compose", "namesrv"));
    assert_eq!(
        (brokers.len(), namesrvs.len()),
        (6, 3),
        "deploy/compose has 3 nodes and a NameServer"
    );
    let mut all = Vec::new();
    // The StatefulSet's shared config, as a pod named broker-a-1 reads it.
    // SAFETY (set_var): this test binary reads the variable in this test only.
    unsafe { std::env::set_var("RAFTMQ_HOSTNAME", "broker-a-1") };
    brokers.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/group/broker.toml"));
    for p in &brokers {
        let cfg = BrokerConfig::load(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        keys(&serde_json::to_value(&cfg).unwrap(), &mut all);
    }
    for p in &namesrvs {
        let cfg = NamesrvConfig::load(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        keys(&serde_json::to_value(&cfg).unwrap(), &mut all);
    }
    all.sort();
    all.dedup();
    let missing: Vec<_> = all.iter().filter(|k| !doc.contains(&format!("`{k}`"))).collect();
    assert!(missing.is_empty(), "keys missing from deploy/CONFIG.md: {missing:?}");
}

#[test]
fn unknown_keys_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/local/node1.toml")).unwrap();
    std::fs::write(&p, format!("max_body_size = 5\n{text}")).unwrap();
    let err = BrokerConfig::load(&p).unwrap_err().to_string();
    assert!(err.contains("max_body_size"), "{err}");
}
