//! timeline.html: the history drawn over time, and the fault periods the
//! plots and the runner shade.
//!
//! The page is self-contained (no scripts, no external CSS, nothing fetched):
//! one row per client process, each operation a bar from its invocation to
//! its completion, colored by outcome (ok green, fail red, info orange, no
//! completion grey) with a hover title giving what it did and what came
//! back; each fault period (a nemesis start until its stop) is a shaded,
//! labeled band across all rows. Bars are absolutely positioned divs, so a
//! large history stays cheap to render; past [`MAX_BARS`] the page keeps
//! every operation that did not succeed and an even sample of the ok ones,
//! and says so.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use crate::history::{Call, NemesisAction, Op, OpType, Process, pairs};

/// The most operation bars a timeline draws.
pub const MAX_BARS: usize = 20_000;

/// A period during which a fault was in effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultPeriod {
    /// The nemesis's name for the fault (`partition`, `kill`, ...).
    pub fault: String,
    /// What the start said (which nodes, ...).
    pub detail: String,
    pub start_ns: u64,
    /// `None`: never stopped, so it lasted until the end of the test.
    pub stop_ns: Option<u64>,
}

/// Pairs nemesis starts with stops by fault name, in order of start.
///
/// A period is drawn wide rather than narrow: it starts at the first start
/// operation (the invocation, if logged, since the fault may act before
/// the nemesis reports it) and ends when a stop completes (healing is
/// certain only then). A start that fails ends its period there; a stop
/// that fails leaves the fault in effect; repeated starts of a fault already
/// in effect extend nothing.
pub fn fault_periods(ops: &[Op]) -> Vec<FaultPeriod> {
    let mut done = Vec::new();
    let mut open: HashMap<&str, FaultPeriod> = HashMap::new();
    for op in ops {
        let Call::Nemesis { action, fault, detail } = &op.call else {
            continue;
        };
        match (action, op.kind) {
            (NemesisAction::Start, OpType::Fail) | (NemesisAction::Stop, OpType::Ok | OpType::Info) => {
                if let Some(mut p) = open.remove(fault.as_str()) {
                    p.stop_ns = Some(op.time.max(p.start_ns));
                    done.push(p);
                }
            }
            (NemesisAction::Start, _) => {
                let p = open.entry(fault.as_str()).or_insert_with(|| FaultPeriod {
                    fault: fault.clone(),
                    detail: String::new(),
                    start_ns: op.time,
                    stop_ns: None,
                });
                if p.detail.is_empty() {
                    p.detail = detail.clone();
                }
            }
            (NemesisAction::Stop, OpType::Invoke | OpType::Fail) => {}
        }
    }
    done.extend(open.into_values());
    done.sort_by(|a, b| (a.start_ns, &a.fault).cmp(&(b.start_ns, &b.fault)));
    done
}

/// One operation drawn: its invocation and, if it came, its completion.
struct Bar<'a> {
    inv: &'a Op,
    comp: Option<&'a Op>,
}

impl Bar<'_> {
    fn class(&self) -> &'static str {
        match self.comp.map(|c| c.kind) {
            Some(OpType::Ok) => "ok",
            Some(OpType::Fail) => "fail",
            Some(OpType::Info) => "info",
            Some(OpType::Invoke) | None => "none",
        }
    }
}

// Layout, in pixels.
const LANE_H: f64 = 14.0;
const BAR_H: f64 = 11.0;
const LABEL_ROW_H: f64 = 16.0;
const AXIS_H: f64 = 18.0;
const MIN_BAR_W: f64 = 2.0;

/// Band colors, one per fault name in order of first appearance.
const BAND_COLORS: [(u8, u8, u8); 6] = [
    (70, 130, 220),
    (160, 90, 200),
    (230, 150, 40),
    (40, 170, 170),
    (200, 80, 120),
    (120, 120, 120),
];

/// Writes `ops` as a timeline to `path` (see the module documentation).
pub fn write_timeline(path: &Path, ops: &[Op], title: &str) -> std::io::Result<()> {
    std::fs::write(path, timeline_html(ops, title))
}

fn timeline_html(ops: &[Op], title: &str) -> String {
    let is_client = |op: &Op| !matches!(op.call, Call::Nemesis { .. });
    let mut bars: Vec<Bar> = Vec::new();
    let mut completed = HashSet::new();
    for (i, c) in pairs(ops) {
        if is_client(&ops[i]) {
            completed.insert(i);
            bars.push(Bar {
                inv: &ops[i],
                comp: Some(&ops[c]),
            });
        }
    }
    for (i, op) in ops.iter().enumerate() {
        if op.is_invoke() && is_client(op) && !completed.contains(&i) {
            bars.push(Bar { inv: op, comp: None });
        }
    }
    bars.sort_by_key(|b| (b.inv.time, b.inv.index));
    let total = bars.len();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for b in &bars {
        *counts.entry(b.class()).or_default() += 1;
    }
    let (bars, cap_note) = cap_bars(bars);

    let lanes: BTreeSet<u64> = ops
        .iter()
        .filter(|op| is_client(op))
        .filter_map(|op| match op.process {
            Process::Client(p) => Some(p),
            Process::Nemesis(_) => None,
        })
        .collect();
    let lane_of: HashMap<u64, usize> = lanes.iter().enumerate().map(|(i, p)| (*p, i)).collect();
    let faults = fault_periods(ops);
    let mut fault_names: Vec<&str> = Vec::new();
    for f in &faults {
        if !fault_names.contains(&f.fault.as_str()) {
            fault_names.push(&f.fault);
        }
    }

    let t_end = ops.iter().map(|op| op.time).max().unwrap_or(0).max(1);
    let secs = t_end as f64 / 1e9;
    let width = (secs * 50.0).clamp(1000.0, 24_000.0);
    let px = |t: u64| t as f64 / t_end as f64 * width;
    let lanes_top = fault_names.len() as f64 * LABEL_ROW_H + AXIS_H;
    let height = lanes_top + lanes.len().max(1) as f64 * LANE_H;

    let mut h = String::with_capacity(4096 + bars.len() * 200);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>\n{CSS}</style></head>\n<body>\n<h1>{t}</h1>\n",
        t = esc(title)
    );
    let _ = writeln!(
        h,
        "<p>{total} operations by {} client processes over {secs:.1} s: {} ok, {} failed, {} unknown (info), {} without completion.</p>",
        lanes.len(),
        counts.get("ok").unwrap_or(&0),
        counts.get("fail").unwrap_or(&0),
        counts.get("info").unwrap_or(&0),
        counts.get("none").unwrap_or(&0),
    );
    h.push_str(
        "<p class=\"legend\"><span class=\"sw ok\"></span>ok <span class=\"sw fail\"></span>fail \
         <span class=\"sw info\"></span>info (unknown) <span class=\"sw none\"></span>no completion \
         &mdash; hover over a bar for details; shaded bands are faults.</p>\n",
    );
    if let Some(note) = cap_note {
        let _ = writeln!(h, "<p class=\"note\">{}</p>", esc(&note));
    }
    if !faults.is_empty() {
        h.push_str("<details><summary>Faults</summary><ul>\n");
        for f in &faults {
            let _ = writeln!(h, "<li>{}</li>", esc(&fault_text(f)));
        }
        h.push_str("</ul></details>\n");
    }

    // Lane labels stay put while the timeline scrolls sideways.
    let _ = write!(
        h,
        "<div class=\"wrap\"><div class=\"labels\" style=\"height:{height:.0}px\">"
    );
    for (i, p) in lanes.iter().enumerate() {
        let _ = write!(
            h,
            "<div class=\"ll\" style=\"top:{:.0}px\">process {p}</div>",
            lanes_top + i as f64 * LANE_H
        );
    }
    let _ = write!(
        h,
        "</div>\n<div class=\"scroll\"><div class=\"tl\" style=\"width:{:.0}px;height:{height:.0}px\">\n",
        width + 20.0
    );

    // Time axis: a tick at least 80 px apart, at a round number of seconds.
    let step = [
        0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    ]
    .into_iter()
    .find(|s| s / secs * width >= 80.0)
    .unwrap_or(secs.max(1.0));
    let mut n = 0u32;
    while f64::from(n) * step <= secs && n < 10_000 {
        let x = f64::from(n) * step / secs * width;
        let _ = write!(
            h,
            "<div class=\"tick\" style=\"left:{x:.1}px;height:{height:.0}px\"></div><div class=\"tt\" style=\"left:{:.1}px;top:{:.0}px\">{}s</div>",
            x + 2.0,
            lanes_top - AXIS_H,
            trim_float(f64::from(n) * step)
        );
        n += 1;
    }

    for f in &faults {
        let k = fault_names.iter().position(|n| *n == f.fault).unwrap_or(0);
        let (r, g, b) = BAND_COLORS[k % BAND_COLORS.len()];
        let x0 = px(f.start_ns);
        let x1 = px(f.stop_ns.unwrap_or(t_end));
        let text = esc(&fault_text(f));
        let _ = write!(
            h,
            "<div class=\"band\" style=\"left:{x0:.1}px;width:{:.1}px;top:{:.0}px;height:{:.0}px;background:rgba({r},{g},{b},0.18);border-color:rgb({r},{g},{b})\" title=\"{text}\"></div>",
            (x1 - x0).max(MIN_BAR_W),
            k as f64 * LABEL_ROW_H,
            height - k as f64 * LABEL_ROW_H,
        );
        let label = if f.detail.is_empty() {
            f.fault.clone()
        } else {
            format!("{}: {}", f.fault, f.detail)
        };
        let _ = writeln!(
            h,
            "<div class=\"bl\" style=\"left:{:.1}px;top:{:.0}px;color:rgb({r},{g},{b})\" title=\"{text}\">{}</div>",
            x0 + 2.0,
            k as f64 * LABEL_ROW_H,
            esc(&label)
        );
    }

    for b in &bars {
        let Process::Client(p) = b.inv.process else {
            continue;
        };
        let Some(lane) = lane_of.get(&p) else {
            continue;
        };
        let x0 = px(b.inv.time);
        let x1 = px(b.comp.map_or(t_end, |c| c.time.max(b.inv.time)));
        let _ = writeln!(
            h,
            "<div class=\"b {}\" style=\"left:{x0:.1}px;top:{:.0}px;width:{:.1}px\" title=\"{}\"></div>",
            b.class(),
            lanes_top + *lane as f64 * LANE_H + (LANE_H - BAR_H) / 2.0,
            (x1 - x0).max(MIN_BAR_W),
            esc(&describe(b))
        );
    }
    h.push_str("</div></div></div>\n</body></html>\n");
    h
}

const CSS: &str = "body{font-family:sans-serif;font-size:13px;margin:12px}
h1{font-size:18px}
.wrap{display:flex;align-items:flex-start}
.labels{position:relative;flex:0 0 90px}
.ll{position:absolute;left:0;height:14px;line-height:14px;font-size:11px;white-space:nowrap}
.scroll{overflow-x:auto;flex:1 1 auto;border-left:1px solid #888}
.tl{position:relative}
.tl div{position:absolute}
.tick{top:0;width:0;border-left:1px solid #eee}
.tt{font-size:10px;color:#666;white-space:nowrap}
.band{border-left:1px solid;box-sizing:border-box}
.bl{font-size:11px;white-space:nowrap;font-weight:bold}
.b{height:11px;border-radius:2px;opacity:0.85}
.b:hover{opacity:1;outline:1px solid #000}
.ok{background:#2ca02c}.fail{background:#d62728}.info{background:#ff9900}.none{background:#999}
.sw{display:inline-block;width:14px;height:10px;margin:0 3px 0 10px}
.note{color:#a00}
";

/// Keeps at most [`MAX_BARS`]: every operation that didn't succeed first,
/// then an even sample of the ok ones; with a note when any were left out.
fn cap_bars(bars: Vec<Bar>) -> (Vec<Bar>, Option<String>) {
    let total = bars.len();
    if total <= MAX_BARS {
        return (bars, None);
    }
    let (ok, mut kept): (Vec<Bar>, Vec<Bar>) = bars.into_iter().partition(|b| b.class() == "ok");
    let note = if kept.len() >= MAX_BARS {
        kept.truncate(MAX_BARS);
        format!(
            "Showing the first {MAX_BARS} of {total} operations that did not succeed; the rest, and all {} ok ones, are omitted.",
            ok.len()
        )
    } else {
        let room = MAX_BARS - kept.len();
        let stride = ok.len().div_ceil(room).max(1);
        let n_ok = ok.len();
        kept.extend(ok.into_iter().step_by(stride));
        format!(
            "Showing {} of {total} operations: every one that did not succeed, and one in {} of the {n_ok} ok ones; the rest are omitted.",
            kept.len(),
            stride
        )
    };
    kept.sort_by_key(|b| (b.inv.time, b.inv.index));
    (kept, Some(note))
}

fn fault_text(f: &FaultPeriod) -> String {
    let stop = f
        .stop_ns
        .map_or("the end".to_string(), |t| format!("{:.3} s", t as f64 / 1e9));
    let detail = if f.detail.is_empty() {
        String::new()
    } else {
        format!(" ({})", f.detail)
    };
    format!("{}{detail}: {:.3} s to {stop}", f.fault, f.start_ns as f64 / 1e9)
}

/// The hover text of a bar: what was asked, what came back, where, why not.
fn describe(b: &Bar) -> String {
    let inv = b.inv;
    let mut s = String::new();
    let _ = write!(s, "{} {}", inv.f(), inv.key().unwrap_or(""));
    let outcome = b.comp.map_or("no completion", |c| match c.kind {
        OpType::Ok => "ok",
        OpType::Fail => "fail",
        OpType::Info => "info (unknown)",
        OpType::Invoke => "invoke",
    });
    let _ = write!(s, ": {outcome}");
    if let Some(c) = b.comp {
        let _ = write!(s, " after {:.1} ms", c.time.saturating_sub(inv.time) as f64 / 1e6);
    }
    let _ = write!(s, "\ninvoked at {:.3} s, op #{}", inv.time as f64 / 1e9, inv.index);
    if let Some(c) = b.comp {
        let _ = write!(s, ", completion #{}", c.index);
    }
    let _ = write!(s, "\n{}", describe_process(inv.process));
    // Results come from the completion; requests from the invocation.
    let done = b.comp.unwrap_or(inv);
    match (&inv.call, &done.call) {
        (Call::Send { value, .. }, Call::Send { offset, .. }) => {
            let _ = write!(s, "\nvalue {value}");
            if let Some(o) = offset {
                let _ = write!(s, " at offset {o}");
            }
        }
        (Call::Poll { group, from, .. }, Call::Poll { msgs, .. }) => {
            let _ = write!(s, "\ngroup {group}, from offset {from}");
            if done.kind == OpType::Ok {
                push_msgs(&mut s, msgs);
            }
        }
        (Call::Assign { group, .. }, Call::Assign { offset, .. }) => {
            let _ = write!(s, "\ngroup {group}");
            match (done.kind, offset) {
                (_, Some(o)) => {
                    let _ = write!(s, ", starts at committed offset {o}");
                }
                (OpType::Ok, None) => s.push_str(", nothing committed: starts at 0"),
                _ => {}
            }
        }
        (Call::Commit { group, offset, .. }, _) => {
            let _ = write!(s, "\ngroup {group}, offset {offset}");
        }
        (Call::TimedSend { value, due, .. }, _) => {
            let _ = write!(s, "\nvalue {value}, due at {:.3} s", *due as f64 / 1e9);
        }
        (Call::TxnSend { value, .. }, Call::TxnSend { transaction_id, .. }) => {
            let _ = write!(s, "\nvalue {value}");
            if let Some(t) = transaction_id {
                let _ = write!(s, ", transaction {t}");
            }
        }
        (
            Call::TxnEnd {
                value,
                resolution,
                transaction_id,
                ..
            }
            | Call::TxnCheck {
                value,
                resolution,
                transaction_id,
                ..
            },
            _,
        ) => {
            let _ = write!(s, "\nvalue {value}: {resolution:?} transaction {transaction_id}");
        }
        (Call::Drain { node, .. }, Call::Drain { msgs, .. }) => {
            let _ = write!(s, "\nwhole queue from node {node}");
            if done.kind == OpType::Ok {
                push_msgs(&mut s, msgs);
            }
        }
        _ => {}
    }
    if let Some(n) = done.node.or(inv.node) {
        let _ = write!(s, "\nnode {n}");
    }
    if let Some(e) = done.error.as_ref().or(inv.error.as_ref()) {
        let _ = write!(s, "\nerror: {e}");
    }
    s
}

fn describe_process(p: Process) -> String {
    match p {
        Process::Client(n) => format!("process {n}"),
        Process::Nemesis(_) => "nemesis".to_string(),
    }
}

/// `n messages: offset:value ...`, the first few of them.
fn push_msgs(s: &mut String, msgs: &[(u64, u64)]) {
    const SHOWN: usize = 8;
    let _ = write!(s, "\n{} messages", msgs.len());
    if let (Some(first), Some(last)) = (msgs.first(), msgs.last()) {
        let _ = write!(s, ", offsets {}..{}:", first.0, last.0);
        for (o, v) in msgs.iter().take(SHOWN) {
            let _ = write!(s, " {o}:{v}");
        }
        if msgs.len() > SHOWN {
            s.push_str(" ...");
        }
    }
}

/// `1.5` rather than `1.500000`, `2` rather than `2.0`.
fn trim_float(x: f64) -> String {
    let s = format!("{x:.1}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

/// Escapes text for HTML content and double- or single-quoted attributes.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::NEMESIS;

    fn op(index: u64, time: u64, process: Process, kind: OpType, call: Call) -> Op {
        Op {
            index,
            time,
            process,
            kind,
            call,
            node: Some(1),
            error: None,
        }
    }

    fn nemesis(index: u64, time: u64, action: NemesisAction, kind: OpType, fault: &str) -> Op {
        op(
            index,
            time,
            NEMESIS,
            kind,
            Call::Nemesis {
                action,
                fault: fault.into(),
                detail: "<n1> | n2".into(),
            },
        )
    }

    #[test]
    fn fault_periods_pair_starts_with_stops() {
        use NemesisAction::{Start, Stop};
        let ops = vec![
            nemesis(0, 10, Start, OpType::Invoke, "partition"),
            nemesis(1, 12, Start, OpType::Ok, "partition"),
            nemesis(2, 15, Start, OpType::Ok, "kill"),
            nemesis(3, 20, Stop, OpType::Invoke, "partition"),
            nemesis(4, 25, Stop, OpType::Ok, "partition"),
            nemesis(5, 30, Start, OpType::Invoke, "pause"),
            nemesis(6, 31, Start, OpType::Fail, "pause"),
            nemesis(7, 40, Stop, OpType::Fail, "kill"),
        ];
        let got = fault_periods(&ops);
        let brief: Vec<(&str, u64, Option<u64>)> =
            got.iter().map(|p| (p.fault.as_str(), p.start_ns, p.stop_ns)).collect();
        assert_eq!(
            brief,
            [("partition", 10, Some(25)), ("kill", 15, None), ("pause", 30, Some(31))]
        );
        assert_eq!(got[0].detail, "<n1> | n2");
        assert!(fault_periods(&[]).is_empty());
    }

    #[test]
    fn timeline_has_bars_bands_and_escapes() {
        let send = |offset| Call::Send {
            key: "k<0>".into(),
            value: 17,
            offset,
        };
        let mut ops = vec![
            op(0, 0, Process::Client(1), OpType::Invoke, send(None)),
            nemesis(1, 1_000_000_000, NemesisAction::Start, OpType::Ok, "partition"),
            op(2, 1_500_000_000, Process::Client(1), OpType::Ok, send(Some(5))),
            op(3, 1_600_000_000, Process::Client(2), OpType::Invoke, send(None)),
            op(4, 1_700_000_000, Process::Client(2), OpType::Info, send(None)),
            op(5, 1_800_000_000, Process::Client(3), OpType::Invoke, send(None)),
            nemesis(6, 2_000_000_000, NemesisAction::Stop, OpType::Ok, "partition"),
        ];
        ops[4].error = Some("timed out & <gone>".into());
        let dir = std::env::temp_dir().join(format!("raftmq-jepsen-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("timeline.html");
        write_timeline(&path, &ops, "test <1>").unwrap();
        let html = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(html.contains("<title>test &lt;1&gt;</title>"), "{html}");
        assert!(html.contains("class=\"band\""), "{html}");
        assert!(html.contains("partition: &lt;n1&gt; | n2"), "{html}");
        assert!(html.contains("class=\"b ok\""), "{html}");
        assert!(html.contains("class=\"b info\""), "{html}");
        assert!(html.contains("class=\"b none\""), "{html}");
        assert!(html.contains("send k&lt;0&gt;: ok"), "{html}");
        assert!(html.contains("error: timed out &amp; &lt;gone&gt;"), "{html}");
        assert!(!html.contains("<gone>") && !html.contains("k<0>") && !html.contains("<n1>"));
        assert!(!html.contains("http") && !html.contains("<script"));
        // An empty history still makes a page.
        assert!(timeline_html(&[], "empty").contains("0 operations"));
    }

    #[test]
    fn large_timelines_are_capped() {
        let mut ops = Vec::new();
        for i in 0..(MAX_BARS as u64 + 5000) {
            let call = Call::Commit {
                key: "k".into(),
                group: "g".into(),
                offset: i,
            };
            ops.push(op(2 * i, 10 * i, Process::Client(i % 7), OpType::Invoke, call.clone()));
            let kind = if i % 1000 == 0 { OpType::Fail } else { OpType::Ok };
            ops.push(op(2 * i + 1, 10 * i + 5, Process::Client(i % 7), kind, call));
        }
        let html = timeline_html(&ops, "big");
        let bars = html.matches("class=\"b ").count();
        assert!(bars <= MAX_BARS && bars > MAX_BARS / 2, "{bars}");
        assert_eq!(html.matches("class=\"b fail\"").count(), 25);
        assert!(html.contains("the rest are omitted"));
    }
}
