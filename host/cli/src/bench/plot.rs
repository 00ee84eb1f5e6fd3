//! `--plot out.png`: step time and coordinate-halo time against atom count, one line per
//! variant, log axes. Text uses DejaVu Sans embedded in the binary, so no system font is needed.

use super::report::BenchReport;
use crate::error::{HaloError, Result};
use plotters::prelude::*;
use std::path::Path;

const FONT: &str = "sans-serif";

fn register_font() -> Result<()> {
    // Registering twice replaces the same bytes: harmless.
    plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| HaloError::InvalidInput("the embedded plot font could not be read".into()))
}

/// (variant, [(atoms, µs)]) for one quantity, variants in report order; checked rows only (a
/// row that is not checked has no times to plot, whatever it holds).
fn series(report: &BenchReport, pick: impl Fn(&super::report::VariantResult) -> Option<f64>) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut out: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in report.results.iter().filter(|r| r.is_result()) {
        let Some(v) = pick(r).filter(|v| v.is_finite() && *v > 0.0) else { continue };
        match out.iter_mut().find(|(name, _)| *name == r.variant) {
            Some((_, pts)) => pts.push((r.atoms as f64, v)),
            None => out.push((r.variant.clone(), vec![(r.atoms as f64, v)])),
        }
    }
    for (_, pts) in &mut out {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

fn err<E: std::fmt::Display>(e: E) -> HaloError {
    HaloError::InvalidInput(format!("drawing the plot: {e}"))
}

/// Log range covering `values` with some margin (a decade when all are equal).
fn log_range(values: impl Iterator<Item = f64>) -> Option<std::ops::Range<f64>> {
    let (lo, hi) = values.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() || hi <= 0.0 {
        return None;
    }
    Some(lo / 1.6..hi * 1.6)
}

fn panel<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>, title: &str, data: &[(String, Vec<(f64, f64)>)]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let xs = log_range(data.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)));
    let ys = log_range(data.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)));
    let (Some(xr), Some(yr)) = (xs, ys) else {
        area.titled(&format!("{title}: no data"), (FONT, 20)).map_err(err)?;
        return Ok(());
    };
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(xr.log_scale(), yr.log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("atoms")
        .y_desc("µs per step")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .x_label_formatter(&|v| if *v >= 1e6 { format!("{:.1}M", v / 1e6) } else { format!("{:.0}k", v / 1e3) })
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in data.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let style = ShapeStyle::from(&color).stroke_width(2);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), style))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, style.filled()))).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Writes the PNG: full exchange per step (left) and coordinate halo per step (right).
pub fn write_png(report: &BenchReport, path: &Path) -> Result<()> {
    register_font()?;
    let step = series(report, |r| r.step_us.map(|s| s.median));
    let coords = series(report, |r| r.coords_us.map(|s| s.median));
    {
        let root = BitMapBackend::new(path, (1600, 700)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root
            .titled(&format!("halo exchange, {} ranks ({}), median of {} repeats", report.ranks, report.mode, report.repeats), (FONT, 24))
            .map_err(err)?;
        let (left, right) = root.split_horizontally(800);
        panel(&left, "full exchange (coordinates + forces)", &step)?;
        panel(&right, "coordinate halo", &coords)?;
        root.present().map_err(|e| HaloError::InvalidInput(format!("writing {}: {e}", path.display())))?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The step-time series the plot draws.
    pub(crate) fn series_of(r: &BenchReport) -> Vec<(String, Vec<(f64, f64)>)> {
        series(r, |v| v.step_us.map(|s| s.median))
    }

    #[test]
    fn writes_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bench.png");
        write_png(&crate::bench::report::tests::sample_report(), &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() > 10_000, "{} bytes", bytes.len());
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    }

    #[test]
    fn series_group_by_variant_sorted_by_atoms() {
        let s = series(&crate::bench::report::tests::sample_report(), |r| r.step_us.map(|s| s.median));
        let names: Vec<&str> = s.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["staged", "fused", "fused+graph"]);
        assert_eq!(s[1].1, vec![(6000.0, 8.0), (45000.0, 16.0)]);
    }
}
