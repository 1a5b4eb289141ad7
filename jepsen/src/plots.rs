//! latency.png and rate.png: how the cluster served clients while faults
//! came and went.
//!
//! - latency.png: each completed client operation as a point at its
//!   invocation time (seconds since the test started) and its latency (ms,
//!   log scale): ok sends, ok polls and other ok operations in their own
//!   colors, failed ones as red crosses, unknown (info) ones as orange
//!   triangles.
//! - rate.png: completions per second over time: ok sends, ok polls, other
//!   ok operations (when there were any), failed and unknown ones.
//!
//! - unavailability.png (a campaign's): per fault kind, the longest
//!   stretch without an ok send over all its periods (bar) and the median
//!   of its periods' longest stretches (dot).
//!
//! latency.png and rate.png shade each fault period with its name. Text is drawn with the
//! DejaVu font the `dejavu` crate carries (as `raftmq bench --plot` does),
//! so no system font is needed. An empty history draws empty axes.

use std::path::Path;

use plotters::prelude::*;

use crate::history::{Call, Op, OpType, pairs};
use crate::report::FaultPeriod;

const SIZE: (u32, u32) = (1400, 700);
const FONT: &str = "sans-serif";

/// Fault band colors, one per fault name in order of first appearance.
const BAND_COLORS: [RGBColor; 6] = [
    RGBColor(70, 130, 220),
    RGBColor(160, 90, 200),
    RGBColor(230, 150, 40),
    RGBColor(40, 170, 170),
    RGBColor(200, 80, 120),
    RGBColor(120, 120, 120),
];
const SEND: RGBColor = RGBColor(31, 119, 180);
const POLL: RGBColor = RGBColor(44, 160, 44);
const OTHER: RGBColor = RGBColor(110, 110, 110);
const FAIL: RGBColor = RGBColor(214, 39, 40);
const INFO: RGBColor = RGBColor(255, 140, 0);

/// Registers the embedded font once.
fn font() -> anyhow::Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if !ok {
        anyhow::bail!("the embedded plot font could not be loaded");
    }
    Ok(())
}

/// What a completed client operation is drawn as.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    OkSend,
    OkPoll,
    OkOther,
    Fail,
    Info,
}

/// Completed client operations: (class, invocation s, completion s,
/// latency ms).
fn completions(ops: &[Op]) -> Vec<(Class, f64, f64, f64)> {
    pairs(ops)
        .into_iter()
        .filter(|&(i, _)| !matches!(ops[i].call, Call::Nemesis { .. }))
        .map(|(i, c)| {
            let (inv, comp) = (&ops[i], &ops[c]);
            let class = match (comp.kind, &inv.call) {
                (OpType::Ok, Call::Send { .. }) => Class::OkSend,
                (OpType::Ok, Call::Poll { .. }) => Class::OkPoll,
                (OpType::Ok, _) => Class::OkOther,
                (OpType::Fail, _) => Class::Fail,
                (OpType::Info | OpType::Invoke, _) => Class::Info,
            };
            let latency = comp.time.saturating_sub(inv.time) as f64 / 1e6;
            (class, secs(inv.time), secs(comp.time), latency)
        })
        .collect()
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The end of the time axis: the last operation, or 1 s for an empty
/// history.
fn time_axis_end(ops: &[Op]) -> f64 {
    let end = ops.iter().map(|op| secs(op.time)).fold(0.0, f64::max);
    if end > 0.0 { end * 1.02 } else { 1.0 }
}

fn plot_err(path: &Path, e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("plot {}: {e}", path.display())
}

/// Draws latency.png (see the module documentation).
pub fn write_latency_png(path: &Path, ops: &[Op], faults: &[FaultPeriod]) -> anyhow::Result<()> {
    font()?;
    let err = |e: &dyn std::fmt::Display| plot_err(path, e);
    let points = completions(ops);
    let t_max = time_axis_end(ops);
    // Whole decades around the data; a zero latency is drawn at 1 µs.
    const FLOOR_MS: f64 = 0.001;
    let lat = |l: f64| l.max(FLOOR_MS);
    let (lo, hi) = points
        .iter()
        .map(|p| lat(p.3))
        .fold(None, |acc: Option<(f64, f64)>, l| match acc {
            None => Some((l, l)),
            Some((a, b)) => Some((a.min(l), b.max(l))),
        })
        .unwrap_or((0.1, 1000.0));
    let y_lo = 10f64.powf(lo.log10().floor());
    let mut y_hi = 10f64.powf(hi.log10().ceil());
    if y_hi <= y_lo * 1.5 {
        y_hi = y_lo * 10.0;
    }

    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("latency of {} completed client operations", points.len()),
            (FONT, 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(0.0..t_max, (y_lo..y_hi).log_scale())
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds since test start (at invocation)")
        .y_desc("latency (ms, log scale)")
        .x_label_formatter(&|v| format_num(*v))
        .y_label_formatter(&|v| format_num(*v))
        .label_style((FONT, 14))
        .draw()
        .map_err(|e| err(&e))?;
    draw_faults(&mut chart, faults, t_max, y_lo, y_hi).map_err(|e| err(&e))?;

    let series: [(Class, &str, RGBColor); 5] = [
        (Class::OkOther, "ok assign/commit/drain", OTHER),
        (Class::OkSend, "ok send", SEND),
        (Class::OkPoll, "ok poll", POLL),
        (Class::Info, "info (unknown)", INFO),
        (Class::Fail, "fail", FAIL),
    ];
    for (class, label, color) in series {
        // The rarely used operations only when there were some.
        if class == Class::OkOther && !points.iter().any(|p| p.0 == class) {
            continue;
        }
        let pts = points
            .iter()
            .filter(move |p| p.0 == class)
            .map(move |p| (p.1, lat(p.3).min(y_hi)));
        let anno = match class {
            Class::Fail => chart
                .draw_series(pts.map(|p| Cross::new(p, 3, color.stroke_width(1))))
                .map_err(|e| err(&e))?,
            Class::Info => chart
                .draw_series(pts.map(|p| TriangleMarker::new(p, 4, color.filled())))
                .map_err(|e| err(&e))?,
            _ => chart
                .draw_series(pts.map(|p| Circle::new(p, 2, color.mix(0.45).filled())))
                .map_err(|e| err(&e))?,
        };
        anno.label(label).legend(move |(x, y)| match class {
            Class::Fail => Cross::new((x + 8, y), 4, color.stroke_width(2)).into_dyn(),
            Class::Info => TriangleMarker::new((x + 8, y), 5, color.filled()).into_dyn(),
            _ => Circle::new((x + 8, y), 4, color.filled()).into_dyn(),
        });
    }
    draw_legend(&mut chart).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Draws rate.png (see the module documentation).
pub fn write_rate_png(path: &Path, ops: &[Op], faults: &[FaultPeriod]) -> anyhow::Result<()> {
    font()?;
    let err = |e: &dyn std::fmt::Display| plot_err(path, e);
    let points = completions(ops);
    let t_max = time_axis_end(ops);
    // At most 300 buckets of a round width: one second for a test of a few
    // minutes, wider for a longer one, narrower for a short one.
    let bucket = [
        0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0,
    ]
    .into_iter()
    .find(|b| t_max / b <= 300.0)
    .unwrap_or_else(|| (t_max / 300.0).ceil());
    let n = ((t_max / bucket).ceil() as usize).clamp(1, 100_000);
    // The axis covers the last bucket's midpoint, where its point is drawn.
    let t_max = t_max.max(n as f64 * bucket);
    let classes = [Class::OkSend, Class::OkPoll, Class::OkOther, Class::Fail, Class::Info];
    let mut counts = vec![vec![0u64; n]; classes.len()];
    for &(class, _, done, _) in &points {
        let k = classes.iter().position(|c| *c == class).unwrap_or(0);
        let b = ((done / bucket) as usize).min(n - 1);
        counts[k][b] += 1;
    }
    let rate = |c: u64| c as f64 / bucket;
    let y_max = counts.iter().flatten().map(|c| rate(*c)).fold(0.0, f64::max).max(1.0) * 1.1;
    let unit = if bucket == 1.0 {
        "per second".to_string()
    } else {
        format!("per second (in {} s buckets)", format_num(bucket))
    };

    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("client operations completed per second", (FONT, 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds since test start (at completion)")
        .y_desc(format!("operations {unit}"))
        .x_label_formatter(&|v| format_num(*v))
        .y_label_formatter(&|v| format_num(*v))
        .label_style((FONT, 14))
        .draw()
        .map_err(|e| err(&e))?;
    draw_faults(&mut chart, faults, t_max, 0.0, y_max).map_err(|e| err(&e))?;

    let labels = ["ok send", "ok poll", "ok assign/commit/drain", "fail", "info (unknown)"];
    let colors = [SEND, POLL, OTHER, FAIL, INFO];
    for (k, row) in counts.iter().enumerate() {
        // The rarely used operations only when there were some.
        if classes[k] == Class::OkOther && row.iter().all(|c| *c == 0) {
            continue;
        }
        let color = colors[k];
        let line = row
            .iter()
            .enumerate()
            .map(|(b, c)| ((b as f64 + 0.5) * bucket, rate(*c)));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(labels[k])
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    draw_legend(&mut chart).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// unavailability.png: `gaps` holds, per fault kind, the longest stretch
/// without an ok send (ms) of each of its periods.
pub fn write_unavailability_png(
    path: &Path,
    gaps: &std::collections::BTreeMap<String, Vec<f64>>,
) -> anyhow::Result<()> {
    font()?;
    let err = |e: &dyn std::fmt::Display| plot_err(path, e);
    let kinds: Vec<(&String, f64, f64)> = gaps
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            (k, v[v.len() - 1], v[v.len() / 2])
        })
        .collect();
    let n = kinds.len().max(1) as f64;
    let y_max = kinds.iter().map(|k| k.1).fold(0.0, f64::max).max(100.0) * 1.15;
    let root = BitMapBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("longest stretch without an ok send, per fault kind", (FONT, 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(75)
        .build_cartesian_2d(0.0..n, 0.0..y_max)
        .map_err(|e| err(&e))?;
    let names: Vec<String> = kinds.iter().map(|k| k.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(kinds.len().max(1) * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            let centred = (x - x.floor() - 0.5).abs() < 0.01;
            if centred {
                names.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("milliseconds")
        .y_label_formatter(&|v| format_num(*v))
        .label_style((FONT, 14))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, &(_, max, median)) in kinds.iter().enumerate() {
        let color = BAND_COLORS[i % BAND_COLORS.len()];
        let x = i as f64;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x + 0.2, 0.0), (x + 0.8, max)],
                color.filled(),
            )))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(std::iter::once(Circle::new((x + 0.5, median), 6, BLACK.filled())))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

type Chart<'a, 'b, Y> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>;
type DrawResult = Result<(), DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>>;

/// Shades each fault period across the whole height, with its name at the
/// top (one text row per fault name, so overlapping periods stay legible)
/// and one legend entry per fault name.
fn draw_faults<'a, 'b: 'a, Y>(
    chart: &mut Chart<'a, 'b, Y>,
    faults: &[FaultPeriod],
    t_max: f64,
    y_lo: f64,
    y_hi: f64,
) -> DrawResult
where
    Y: Ranged<ValueType = f64>,
{
    let mut names: Vec<&str> = Vec::new();
    for f in faults {
        if !names.contains(&f.fault.as_str()) {
            names.push(&f.fault);
        }
    }
    for (k, name) in names.iter().enumerate() {
        let color = BAND_COLORS[k % BAND_COLORS.len()];
        let periods = faults.iter().filter(|f| f.fault == *name).map(|f| {
            let x0 = secs(f.start_ns).min(t_max);
            let x1 = f.stop_ns.map_or(t_max, |t| secs(t).min(t_max)).max(x0);
            Rectangle::new([(x0, y_lo), (x1, y_hi)], color.mix(0.15).filled())
        });
        chart
            .draw_series(periods)?
            .label(format!("fault: {name}"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 18, y + 5)], color.mix(0.4).filled()));
        let text_style = TextStyle::from((FONT, 13).into_font()).color(&color);
        let row = 4 + 15 * k as i32;
        let labels = faults.iter().filter(|f| f.fault == *name).map(|f| {
            let x0 = secs(f.start_ns).min(t_max);
            let text = if f.detail.is_empty() {
                f.fault.clone()
            } else {
                format!("{}: {}", f.fault, f.detail)
            };
            EmptyElement::at((x0, y_hi)) + Text::new(shorten(&text, 60), (3, row), text_style.clone())
        });
        chart.draw_series(labels)?;
    }
    Ok(())
}

fn draw_legend<'a, 'b: 'a, Y>(chart: &mut Chart<'a, 'b, Y>) -> DrawResult
where
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()
}

/// `text` cut to `max` characters, with an ellipsis if cut.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// An axis label without trailing zeros: `0.01`, `2.5`, `1000`.
fn format_num(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{NEMESIS, NemesisAction, Process};
    use crate::report::fault_periods;

    fn small_history() -> Vec<Op> {
        let mut ops = Vec::new();
        let mut push = |time: u64, process: Process, kind: OpType, call: Call| {
            let index = ops.len() as u64;
            ops.push(Op {
                index,
                time,
                process,
                kind,
                call,
                node: Some(1),
                error: None,
            });
        };
        let nemesis = |action| Call::Nemesis {
            action,
            fault: "partition".into(),
            detail: "n1 | n2 n3".into(),
        };
        for i in 0..400u64 {
            let t = i * 25_000_000;
            // Ten processes, so that each finishes before its next turn.
            let p = Process::Client(i % 10);
            if i == 80 {
                push(t, NEMESIS, OpType::Ok, nemesis(NemesisAction::Start));
            }
            if i == 200 {
                push(t, NEMESIS, OpType::Ok, nemesis(NemesisAction::Stop));
            }
            let during = (80..200).contains(&i);
            let latency = if during {
                200_000_000
            } else {
                2_000_000 + i * 10_000 + i % 2 * 3_000_000
            };
            let kind = match (during, i % 3) {
                (true, 0) => OpType::Fail,
                (true, 1) => OpType::Info,
                _ => OpType::Ok,
            };
            let call = if i % 2 == 0 {
                Call::Send {
                    key: "k0".into(),
                    value: i,
                    offset: None,
                }
            } else {
                Call::Poll {
                    key: "k0".into(),
                    group: "g".into(),
                    from: 0,
                    msgs: vec![],
                }
            };
            push(t, p, OpType::Invoke, call.clone());
            push(t + latency, p, kind, call);
        }
        ops.sort_by_key(|op| op.time);
        for (i, op) in ops.iter_mut().enumerate() {
            op.index = i as u64;
        }
        ops
    }

    fn is_png(path: &Path) -> bool {
        std::fs::read(path).is_ok_and(|b| b.starts_with(b"\x89PNG\r\n\x1a\n"))
    }

    #[test]
    fn plots_write_pngs() {
        let dir = std::env::temp_dir().join(format!("raftmq-jepsen-plots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ops = small_history();
        let faults = fault_periods(&ops);
        assert_eq!(faults.len(), 1);
        write_latency_png(&dir.join("latency.png"), &ops, &faults).unwrap();
        write_rate_png(&dir.join("rate.png"), &ops, &faults).unwrap();
        write_latency_png(&dir.join("latency-empty.png"), &[], &[]).unwrap();
        write_rate_png(&dir.join("rate-empty.png"), &[], &[]).unwrap();
        for name in ["latency.png", "rate.png", "latency-empty.png", "rate-empty.png"] {
            assert!(is_png(&dir.join(name)), "{name}");
        }
        // Degenerate times: everything at once, or at the end of the clock;
        // a fault that never stops.
        let odd: Vec<Op> = small_history()
            .into_iter()
            .map(|mut op| {
                op.time = if op.index % 2 == 0 { u64::MAX } else { 0 };
                op
            })
            .collect();
        let faults = fault_periods(&odd);
        write_latency_png(&dir.join("odd-latency.png"), &odd, &faults).unwrap();
        write_rate_png(&dir.join("odd-rate.png"), &odd, &faults).unwrap();
        let same: Vec<Op> = small_history()
            .into_iter()
            .map(|mut op| {
                op.time = 7;
                op
            })
            .collect();
        write_latency_png(&dir.join("same-latency.png"), &same, &faults).unwrap();
        write_rate_png(&dir.join("same-rate.png"), &same, &faults).unwrap();
        if std::env::var_os("RAFTMQ_JEPSEN_KEEP_PLOTS").is_none() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn axis_labels_are_short() {
        assert_eq!(format_num(0.01), "0.01");
        assert_eq!(format_num(1000.0), "1000");
        assert_eq!(format_num(2.5), "2.5");
        assert_eq!(shorten("abcdef", 4), "abc…");
    }
}
