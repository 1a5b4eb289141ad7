//! The plots of `raftmq bench --plot FILE.png`: latency over time (every
//! sample, and the p99 of each second) above a latency histogram. Text is
//! drawn with the DejaVu font the `dejavu` crate carries, so no system font
//! is needed.

use std::path::Path;

use plotters::prelude::*;

/// Registers the embedded font once.
pub(crate) fn font() -> anyhow::Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if !ok {
        anyhow::bail!("the embedded plot font could not be loaded");
    }
    Ok(())
}

/// Draws `samples` ((seconds since start, latency µs)) into a PNG at `path`.
pub fn draw(path: &Path, title: &str, samples: &[(f64, u64)]) -> anyhow::Result<()> {
    font()?;
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plot {}: {e}", path.display());
    let root = BitMapBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (top, bottom) = root.split_vertically(480);
    let ms: Vec<(f64, f64)> = samples.iter().map(|(t, us)| (*t, *us as f64 / 1000.0)).collect();
    let t_max = ms.iter().map(|(t, _)| *t).fold(1.0, f64::max);
    let mut sorted: Vec<f64> = ms.iter().map(|(_, l)| *l).collect();
    sorted.sort_by(f64::total_cmp);
    // The axis ends at the p99.9 (a few outliers would flatten the rest).
    let y_max = sorted
        .get(((sorted.len().max(1) - 1) as f64 * 0.999) as usize)
        .copied()
        .unwrap_or(1.0)
        .max(0.1)
        * 1.1;

    let mut chart = ChartBuilder::on(&top)
        .caption(format!("{title}: latency over time"), ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds since start")
        .y_desc("latency (ms)")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(
            ms.iter()
                .map(|(t, l)| Circle::new((*t, l.min(y_max)), 1, BLUE.mix(0.25).filled())),
        )
        .map_err(|e| err(&e))?
        .label("each message")
        .legend(|(x, y)| Circle::new((x + 10, y), 3, BLUE.filled()));
    // p99 per second.
    let seconds = t_max.ceil() as usize;
    let mut per_sec: Vec<Vec<f64>> = vec![Vec::new(); seconds.max(1)];
    for (t, l) in &ms {
        per_sec[(*t as usize).min(seconds.max(1) - 1)].push(*l);
    }
    let p99: Vec<(f64, f64)> = per_sec
        .iter_mut()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(i, v)| {
            v.sort_by(f64::total_cmp);
            (i as f64 + 0.5, v[((v.len() - 1) as f64 * 0.99) as usize].min(y_max))
        })
        .collect();
    chart
        .draw_series(LineSeries::new(p99, RED.stroke_width(2)))
        .map_err(|e| err(&e))?
        .label("p99 per second")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;

    // Histogram: 50 buckets up to the axis end.
    const BUCKETS: usize = 50;
    let width = y_max / BUCKETS as f64;
    let mut counts = [0u32; BUCKETS];
    for l in &sorted {
        counts[((l / width) as usize).min(BUCKETS - 1)] += 1;
    }
    let c_max = counts.iter().copied().max().unwrap_or(1).max(1);
    let mut hist = ChartBuilder::on(&bottom)
        .caption(
            format!("{title}: latency histogram ({} messages)", sorted.len()),
            ("sans-serif", 24),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..y_max, 0u32..c_max + c_max / 10 + 1)
        .map_err(|e| err(&e))?;
    hist.configure_mesh()
        .x_desc("latency (ms)")
        .y_desc("messages")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    hist.draw_series(counts.iter().enumerate().map(|(i, c)| {
        let x0 = i as f64 * width;
        Rectangle::new([(x0, 0), (x0 + width * 0.9, *c)], BLUE.mix(0.6).filled())
    }))
    .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
