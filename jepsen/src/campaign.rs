//! `raftmq-jepsen campaign`: many runs, one seed after another, and a table
//! of them all.
//!
//! Each run is an ordinary test (its artefacts under `STORE/NAME/<ts>/`);
//! the campaign reads each run's `results.json` and writes, under
//! `STORE/NAME/campaign-<ts>/`:
//!
//! | file | contents |
//! |---|---|
//! | `campaign.json` | one [`Row`] per run, then the totals |
//! | `index.html` | the same as a table, each seed linking to its run's timeline |
//! | `unavailability.png` | per fault kind, the longest stretch without an ok send in any of its periods (bar) and the median over its periods (dot) |

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::checker::Results;
use crate::run::{self, TestOpts};

/// One run of a campaign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub seed: u64,
    /// The run's directory (absolute).
    pub dir: PathBuf,
    /// `valid`, `INVALID`, or `error: ...` when the run did not finish.
    pub verdict: String,
    /// Fault periods per fault kind.
    pub faults: BTreeMap<String, u64>,
    pub sends_ok: u64,
    /// Sends whose outcome the client could not know.
    pub sends_unknown: u64,
    /// Anomalies of the no-lost-writes check (acknowledged sends missing,
    /// or values read that were never sent).
    pub lost: u64,
    /// Anomalies of the duplicates check.
    pub duplicates: u64,
    /// The longest stretch without an ok send in any fault period (ms).
    pub longest_gap_ms: f64,
    /// Per fault kind, the longest stretch of each of its periods (ms).
    pub gaps_ms: BTreeMap<String, Vec<f64>>,
    /// The slowest first answer of a restarted node after its restart (ms).
    #[serde(default)]
    pub restart_answer_ms: Option<f64>,
}

impl Row {
    fn from_results(seed: u64, dir: PathBuf, r: &Results) -> Row {
        let anomalies = |check: &str| {
            r.checks
                .iter()
                .filter(|c| c.name == check)
                .map(|c| c.counts.values().sum::<u64>().max(c.anomalies.len() as u64))
                .sum()
        };
        let mut faults = BTreeMap::new();
        let mut gaps_ms: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for f in &r.stats.faults {
            *faults.entry(f.fault.clone()).or_insert(0) += 1;
            gaps_ms.entry(f.fault.clone()).or_default().push(f.longest_gap_ms);
        }
        Row {
            seed,
            dir,
            verdict: if r.valid { "valid" } else { "INVALID" }.to_string(),
            faults,
            sends_ok: r.stats.sends_ok,
            sends_unknown: r.stats.sends_info,
            lost: anomalies("no-lost-writes"),
            duplicates: anomalies("duplicates"),
            longest_gap_ms: r.stats.faults.iter().map(|f| f.longest_gap_ms).fold(0.0, f64::max),
            gaps_ms,
            restart_answer_ms: r
                .stats
                .faults
                .iter()
                .filter_map(|f| f.restarted_answer_ms)
                .reduce(f64::max),
        }
    }

    fn failed(seed: u64, dir: PathBuf, why: String) -> Row {
        Row {
            seed,
            dir,
            verdict: format!("error: {why}"),
            faults: BTreeMap::new(),
            sends_ok: 0,
            sends_unknown: 0,
            lost: 0,
            duplicates: 0,
            longest_gap_ms: 0.0,
            gaps_ms: BTreeMap::new(),
            restart_answer_ms: None,
        }
    }
}

#[derive(Debug, Serialize)]
struct Campaign<'a> {
    runs: &'a [Row],
    valid: usize,
    invalid: usize,
    errors: usize,
}

/// Runs `runs` tests with seeds `opts.seed`, `opts.seed + 1`, ...; true
/// when every run was valid.
pub async fn campaign(opts: TestOpts, runs: u64) -> anyhow::Result<bool> {
    let test_dir = opts.store.join(&opts.name);
    let out = test_dir.join(format!("campaign-{}", run::timestamp()));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut rows = Vec::new();
    for seed in opts.seed..opts.seed.saturating_add(runs) {
        eprintln!("== campaign run {} of {runs}: seed {seed}", rows.len() + 1);
        let outcome = run::run(TestOpts { seed, ..opts.clone() }).await;
        let dir = std::fs::canonicalize(test_dir.join("latest")).unwrap_or_else(|_| test_dir.clone());
        let row = match outcome {
            Ok(_) => match read_results(&dir) {
                Ok(r) => Row::from_results(seed, dir, &r),
                Err(e) => Row::failed(seed, dir, format!("{e:#}")),
            },
            Err(e) => Row::failed(seed, dir, format!("{e:#}")),
        };
        eprintln!("== seed {seed}: {}", row.verdict);
        rows.push(row);
        // Written after every run: a long campaign cut short keeps its table.
        write(&out, &rows)?;
    }
    let valid = rows.iter().filter(|r| r.verdict == "valid").count();
    eprintln!(
        "campaign: {valid} of {} runs valid; table in {}",
        rows.len(),
        out.join("index.html").display()
    );
    Ok(valid == rows.len())
}

fn read_results(dir: &Path) -> anyhow::Result<Results> {
    let path = dir.join("results.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Writes campaign.json, index.html and unavailability.png into `out`.
pub fn write(out: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let count = |f: &dyn Fn(&Row) -> bool| rows.iter().filter(|r| f(r)).count();
    let summary = Campaign {
        runs: rows,
        valid: count(&|r| r.verdict == "valid"),
        invalid: count(&|r| r.verdict == "INVALID"),
        errors: count(&|r| r.verdict.starts_with("error")),
    };
    std::fs::write(out.join("campaign.json"), serde_json::to_vec_pretty(&summary)?)?;
    std::fs::write(out.join("index.html"), html(rows, &summary))?;
    let mut by_kind: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in rows {
        for (kind, gaps) in &r.gaps_ms {
            by_kind.entry(kind.clone()).or_default().extend(gaps);
        }
    }
    crate::plots::write_unavailability_png(&out.join("unavailability.png"), &by_kind)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn html(rows: &[Row], c: &Campaign<'_>) -> String {
    let mut h = String::from(
        "<!doctype html><meta charset=utf-8><title>raftmq-jepsen campaign</title>\n\
         <style>body{font-family:sans-serif}table{border-collapse:collapse}\
         td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
         td.l{text-align:left}.bad{background:#fdd}</style>\n",
    );
    let _ = writeln!(
        h,
        "<h1>Campaign: {} runs, {} valid, {} invalid, {} did not finish</h1>",
        rows.len(),
        c.valid,
        c.invalid,
        c.errors
    );
    h.push_str(
        "<table><tr><th>seed</th><th>faults drawn</th><th>acknowledged sends</th><th>unknown</th>\
         <th>lost</th><th>duplicates</th><th>longest unavailability (ms)</th>\
         <th>slowest restarted node's first answer (ms)</th><th>verdict</th></tr>\n",
    );
    for r in rows {
        let faults: Vec<String> = r.faults.iter().map(|(k, n)| format!("{k} x{n}")).collect();
        let link = r.dir.join("timeline.html");
        let _ = writeln!(
            h,
            "<tr class=\"{}\"><td><a href=\"file://{}\">{}</a></td><td class=l>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{:.0}</td><td>{}</td><td class=l>{}</td></tr>",
            if r.verdict == "valid" { "" } else { "bad" },
            escape(&link.display().to_string()),
            r.seed,
            escape(&faults.join(", ")),
            r.sends_ok,
            r.sends_unknown,
            r.lost,
            r.duplicates,
            r.longest_gap_ms,
            r.restart_answer_ms.map_or("-".to_string(), |ms| format!("{ms:.0}")),
            escape(&r.verdict),
        );
    }
    h.push_str("</table>\n<p><img src=\"unavailability.png\" alt=\"unavailability per fault kind\">\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seed: u64, verdict: &str, gaps: &[(&str, f64)]) -> Row {
        let mut r = Row::failed(seed, PathBuf::from(format!("/runs/{seed}")), String::new());
        r.verdict = verdict.to_string();
        for &(k, g) in gaps {
            *r.faults.entry(k.to_string()).or_insert(0) += 1;
            r.gaps_ms.entry(k.to_string()).or_default().push(g);
            r.longest_gap_ms = r.longest_gap_ms.max(g);
        }
        r
    }

    #[test]
    fn the_table_and_json_name_every_run() {
        let dir = tempfile::tempdir().unwrap();
        let rows = vec![
            row(1, "valid", &[("kill", 900.0), ("corrupt", 1200.0)]),
            row(2, "INVALID", &[("kill", 400.0)]),
            row(3, "error: <no leader>", &[]),
        ];
        write(dir.path(), &rows).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("campaign.json")).unwrap()).unwrap();
        assert_eq!(
            (
                json["valid"].as_u64(),
                json["invalid"].as_u64(),
                json["errors"].as_u64()
            ),
            (Some(1), Some(1), Some(1))
        );
        assert_eq!(json["runs"][0]["faults"]["corrupt"], 1);
        let html = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
        assert!(html.contains("3 runs, 1 valid, 1 invalid, 1 did not finish"), "{html}");
        assert!(html.contains("corrupt x1, kill x1"), "{html}");
        assert!(html.contains("error: &lt;no leader&gt;"), "escaped: {html}");
        assert!(html.contains("file:///runs/2/timeline.html"), "{html}");
        assert!(std::fs::metadata(dir.path().join("unavailability.png")).unwrap().len() > 1000);
    }
}
