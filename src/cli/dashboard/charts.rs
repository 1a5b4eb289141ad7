//! `/charts`: messages in and out per second and the total lag over the
//! samples the [`super::sampler`] keeps, drawn as SVG on the server
//! (plotters), so the page needs no script library.

use std::time::Instant;

use axum::extract::{Query, State as AxumState};
use maud::{Markup, PreEscaped, html};
use plotters::prelude::*;

use super::caller::Caller;
use super::page::{self, Flash, Nav};
use super::sampler::Sample;
use super::state::State;

/// A line chart of `points` ((seconds before now, value)) as SVG.
fn svg(title: &str, window_s: f64, points: &[(f64, f64)], color: RGBColor) -> Result<String, String> {
    crate::cli::bench::plot::font().map_err(|e| e.to_string())?;
    let mut out = String::new();
    {
        let err = |e: &dyn std::fmt::Display| e.to_string();
        let root = SVGBackend::with_string(&mut out, (960, 230)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let top = points.iter().map(|p| p.1).fold(0.0, f64::max);
        let y_max = if top > 0.0 { top * 1.15 } else { 1.0 };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(26)
            .y_label_area_size(60)
            .build_cartesian_2d(-window_s..0.0, 0.0..y_max)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("seconds ago")
            .x_label_formatter(&|x| format!("{:.0}", (-x).max(0.0)))
            .y_label_formatter(&|y| {
                if *y >= 10_000.0 {
                    format!("{:.0}k", y / 1000.0)
                } else {
                    format!("{y:.0}")
                }
            })
            .x_labels(7)
            .y_labels(5)
            .light_line_style(RGBColor(244, 246, 249))
            .draw()
            .map_err(|e| err(&e))?;
        chart
            .draw_series(
                AreaSeries::new(points.iter().copied(), 0.0, color.mix(0.12)).border_style(color.stroke_width(2)),
            )
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(out)
}

pub async fn page(AxumState(state): AxumState<State>, caller: Caller, Query(flash): Query<Flash>) -> Markup {
    if state.own.is_some() && caller.who.is_none() {
        let body = html! { h1 { "Charts" } p.error { "The charts are read with the dashboard's own keys: log in to see them." } };
        return page::shell("Charts", Nav::Charts, &caller, &flash, body);
    }
    let samples = state.charts.samples();
    let now = Instant::now();
    let window_s = samples
        .first()
        .map_or(60.0, |s| now.duration_since(s.at).as_secs_f64().max(60.0));
    let series = |f: fn(&Sample) -> f64| -> Vec<(f64, f64)> {
        samples
            .iter()
            .map(|s| (-now.duration_since(s.at).as_secs_f64(), f(s)))
            .collect()
    };
    let charts = [
        ("Messages in per second", series(|s| s.in_per_s), RGBColor(47, 111, 237)),
        (
            "Messages out per second",
            series(|s| s.out_per_s),
            RGBColor(31, 138, 76),
        ),
        (
            "Lag (messages not yet consumed, all groups)",
            series(|s| s.lag as f64),
            RGBColor(197, 48, 48),
        ),
    ];
    let last = samples.last();
    let body = html! {
        h1 { "Charts " small { "sampled every few seconds by the dashboard; the last " (samples.len()) " samples" } }
        div #charts-live data-live {
            @if let Some(p) = state.charts.problem() { (page::error_box(&format!("the last sample is incomplete: {p}"))) }
            div.cards {
                div.card { div.k { "in / s" } div.v #rate-in { (format!("{:.1}", last.map_or(0.0, |s| s.in_per_s))) } }
                div.card { div.k { "out / s" } div.v #rate-out { (format!("{:.1}", last.map_or(0.0, |s| s.out_per_s))) } }
                div.card { div.k { "lag" } div.v #lag-now { (last.map_or(0, |s| s.lag)) } }
            }
            @for (title, points, color) in &charts {
                div.chart {
                    @match svg(title, window_s, points, *color) {
                        Ok(s) => (PreEscaped(s)),
                        Err(e) => (page::error_box(&e)),
                    }
                }
            }
        }
    };
    page::shell("Charts", Nav::Charts, &caller, &flash, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_draw_as_svg() {
        let s = svg("t", 60.0, &[(-30.0, 1.0), (-1.0, 3.0)], RGBColor(0, 0, 0)).unwrap();
        assert!(s.starts_with("<svg"), "{s}");
        assert!(
            ["polyline", "polygon", "path"].iter().any(|e| s.contains(e)),
            "no line drawn: {s}"
        );
    }
}
