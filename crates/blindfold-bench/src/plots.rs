//! SVG charts the benchmarks draw their plots with (line, linear and grouped bar plots); each
//! benchmark's module decides what goes into them.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 23, 23),
];

pub(crate) type Series = (String, Vec<(f64, f64)>);

/// A log-log line plot of `series` saved as SVG at `path` (nothing if there are no points).
pub(crate) fn line_plot(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<()> {
    let pts = series.iter().flat_map(|s| s.1.iter().copied());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Ok(());
    }
    let (x0, x1, y0, y1) = (x0 * 0.8, x1 * 1.25, (y0 * 0.8).max(1e-6), y1 * 1.25);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
        .map_err(|e| anyhow!("{e}"))?;
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(|e| anyhow!("{e}"))?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| anyhow!("{e}"))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// A line plot with a linear x axis from zero saved as SVG at `path` (for axes that include 0,
/// such as a round trip of 0 ms), its y axis linear from zero or logarithmic (`log_y`); series
/// named in `dashed` are drawn dashed without markers (reference lines such as an ideal).
/// Nothing is drawn if there are no points.
pub(crate) fn linear_plot(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    dashed: &[&str],
    log_y: bool,
) -> Result<()> {
    let pts = series.iter().flat_map(|s| s.1.iter().copied());
    let (mut x1, mut y0, mut y1, mut any) = (0f64, f64::MAX, 0f64, false);
    for (x, y) in pts {
        x1 = x1.max(x);
        y1 = y1.max(y);
        if y > 0.0 {
            y0 = y0.min(y);
        }
        any = true;
    }
    if !any {
        return Ok(());
    }
    let x1 = if x1 > 0.0 { x1 * 1.05 } else { 1.0 };
    // Room above the highest point for the legend (a log axis needs a factor, not a share).
    let y1 = if y1 <= 0.0 {
        1.0
    } else if log_y {
        y1 * 4.0
    } else {
        y1 * 1.15
    };
    let y0 = if y0 < y1 { y0 * 0.7 } else { y1 / 10.0 };
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    // The same drawing over either y axis (plotters' two axis kinds are different types).
    macro_rules! draw {
        ($y:expr) => {{
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 20))
                .margin(15)
                .x_label_area_size(45)
                .y_label_area_size(80)
                .build_cartesian_2d(0f64..x1, $y)
                .map_err(|e| anyhow!("{e}"))?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .draw()
                .map_err(|e| anyhow!("{e}"))?;
            for (i, (name, points)) in series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let legend = move |(x, y): (i32, i32)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                };
                let points = points.iter().copied().filter(|p| !log_y || p.1 > 0.0);
                if dashed.contains(&name.as_str()) {
                    chart
                        .draw_series(DashedLineSeries::new(points, 8, 5, color.stroke_width(2)))
                        .map_err(|e| anyhow!("{e}"))?
                        .label(name.as_str())
                        .legend(legend);
                    continue;
                }
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                    .map_err(|e| anyhow!("{e}"))?
                    .label(name.as_str())
                    .legend(legend);
                chart
                    .draw_series(points.map(|p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| anyhow!("{e}"))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| anyhow!("{e}"))?;
        }};
    }
    if log_y {
        draw!((y0..y1).log_scale());
    } else {
        draw!(0f64..y1);
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// A grouped bar plot on a logarithmic axis saved as SVG at `path`: one group per entry of
/// `groups` along the x axis, one bar per series in each group (a missing value leaves a gap).
/// Nothing is drawn if no value is positive.
pub(crate) fn bar_plot(
    path: &Path,
    title: &str,
    y_desc: &str,
    groups: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> Result<()> {
    const PALETTE: [RGBColor; 14] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(23, 190, 207),
        RGBColor(188, 189, 34),
        RGBColor(140, 86, 75),
        RGBColor(214, 39, 40),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(0, 0, 128),
        RGBColor(128, 0, 0),
        RGBColor(0, 100, 0),
        RGBColor(23, 23, 23),
    ];
    let values = series.iter().flat_map(|s| s.1.iter().flatten().copied()).filter(|v| *v > 0.0);
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    if lo > hi || groups.is_empty() {
        return Ok(());
    }
    let (y0, y1) = (lo / 2.0, hi * 3.0);
    let n = groups.len();
    let root = SVGBackend::new(path, (1100, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..n as f64, (y0..y1).log_scale())
        .map_err(|e| anyhow!("{e}"))?;
    let label = |x: &f64| -> String {
        let i = x.floor();
        if (x - i - 0.5).abs() < 1e-6 && (i as usize) < n {
            groups[i as usize].clone()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(2 * n + 1)
        .x_label_formatter(&label)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    let width = 0.8 / series.len().max(1) as f64;
    for (k, (name, vals)) in series.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        let bars = vals.iter().enumerate().filter_map(|(g, v)| {
            let v = (*v).filter(|v| *v > 0.0)?;
            let x0 = g as f64 + 0.1 + k as f64 * width;
            Some(Rectangle::new([(x0, y0), (x0 + width * 0.9, v)], color.filled()))
        });
        chart
            .draw_series(bars)
            .map_err(|e| anyhow!("{e}"))?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
