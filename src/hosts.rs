//! A hosts file of our own (`RAFTMQ_HOSTS=<path>`), read once per process:
//! names it lists are dialled at its addresses instead of being resolved.
//!
//! It lets several "hosts" share one machine, each on its own loopback
//! address (127.0.0.2, 127.0.0.3, ..), so a config written for DNS names (a
//! StatefulSet's `broker-a-0.broker-a`) runs unchanged on a laptop or in a
//! test. A node whose own name is listed also listens on that address
//! rather than on the wildcard its config names (see
//! [`crate::broker::identity`]). Without the variable nothing changes.
//!
//! Format, as `/etc/hosts`: an address, then one or more names; `#` starts
//! a comment. Lines that do not parse are refused with their number.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::OnceLock;

/// The environment variable naming the file.
pub const ENV: &str = "RAFTMQ_HOSTS";

/// At most this many bytes are read (a hosts file is small).
const MAX_FILE_BYTES: u64 = 1 << 20;

static TABLE: OnceLock<HashMap<String, IpAddr>> = OnceLock::new();

/// Parses hosts-file text into name → address.
pub fn parse(text: &str) -> Result<HashMap<String, IpAddr>, String> {
    let mut table = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let ip: IpAddr = words
            .next()
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| format!("line {}: {line:?} does not start with an IP address", n + 1))?;
        let mut named = false;
        for name in words {
            table.insert(name.to_ascii_lowercase(), ip);
            named = true;
        }
        if !named {
            return Err(format!("line {}: {ip} names no host", n + 1));
        }
    }
    Ok(table)
}

/// Loads `RAFTMQ_HOSTS` (once; later calls return the same table). A file
/// that is set but unusable is an error the caller reports at start-up.
pub fn load() -> Result<&'static HashMap<String, IpAddr>, String> {
    if let Some(t) = TABLE.get() {
        return Ok(t);
    }
    let table = match std::env::var_os(ENV) {
        None => HashMap::new(),
        Some(path) => {
            use std::io::Read;
            let mut text = String::new();
            std::fs::File::open(&path)
                .and_then(|f| f.take(MAX_FILE_BYTES).read_to_string(&mut text))
                .map_err(|e| format!("{ENV}={}: {e}", path.to_string_lossy()))?;
            parse(&text).map_err(|e| format!("{ENV}={}: {e}", path.to_string_lossy()))?
        }
    };
    Ok(TABLE.get_or_init(|| table))
}

/// The address the table gives `host`, if any (an unusable file counts as
/// empty here; start-up has reported it).
pub fn lookup(host: &str) -> Option<IpAddr> {
    load().ok()?.get(&host.to_ascii_lowercase()).copied()
}

/// `host:port` with the host replaced by its address when the table lists
/// it; anything else unchanged.
pub fn rewrite(addr: &str) -> String {
    match addr.rsplit_once(':') {
        Some((host, port)) => match lookup(host) {
            Some(IpAddr::V4(ip)) => format!("{ip}:{port}"),
            Some(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
            None => addr.to_string(),
        },
        None => addr.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_lines() {
        let t = parse("# comment\n127.0.0.2 broker-a-0.broker-a  Broker-A-0\n\n::1 six # trailing\n").unwrap();
        assert_eq!(t["broker-a-0.broker-a"], "127.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(t["broker-a-0"], "127.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(t["six"], "::1".parse::<IpAddr>().unwrap());
        assert!(parse("not-an-ip name").unwrap_err().contains("line 1"));
        assert!(parse("10.0.0.1").unwrap_err().contains("names no host"));
    }
}
