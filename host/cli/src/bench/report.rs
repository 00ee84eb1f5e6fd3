//! The benchmark's results: a table for people, JSON and CSV for tools.

use super::floor::{FloorCheck, FloorReport};
use super::stats::Summary;
use crate::machine::MachineInfo;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One variant at one size. `Default` is a row with no sizes, times, floor or check.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VariantResult {
    /// Atoms in the whole system.
    pub atoms: usize,
    /// Variant name (`fused`, `fused+graph`, ...).
    pub variant: String,
    /// The method (`staged`, `direct-copy`, `nccl`, `fused`, ...).
    pub transport: String,
    /// Whether the step was captured as a CUDA graph and replayed.
    pub graph: bool,
    /// Pulses per step.
    pub pulses: usize,
    /// Coordinates the busiest rank sends per step.
    pub halo_atoms: usize,
    /// Coordinate halo per step (µs, GPU timeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coords_us: Option<Summary>,
    /// Force halo per step (µs, GPU timeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forces_us: Option<Summary>,
    /// Full exchange per step, both halos (µs, GPU timeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_us: Option<Summary>,
    /// Host CPU time per step of the launching thread (µs, median).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cpu_us: Option<f64>,
    /// Host synchronisations per step and rank (each wait of the host for a rank's stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_syncs_per_step: Option<f64>,
    /// ns/day at 2 fs of a step made of this exchange alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_per_day_exchange_only: Option<f64>,
    /// Floor of the coordinate halo (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_coords_us: Option<f64>,
    /// Floor of the force halo (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_forces_us: Option<f64>,
    /// Floor of the full exchange (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_step_us: Option<f64>,
    /// Whether the floor held for every repeat (`bound`) or a repeat beat it (`model`: the
    /// floor's model was wrong for this variant, and no ratio is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<FloorCheck>,
    /// Coordinate halo (median) / its floor, when the floor is a bound (never below 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coords_per_floor: Option<f64>,
    /// Full exchange (median) / its floor, when the floor is a bound (never below 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_per_floor: Option<f64>,
    /// Whether every check of the row passed (a step before the timed loops, the coordinates the
    /// timed steps left, a step after them, each against the CPU reference). Only then does the
    /// row carry times; a row that is not checked is a failure or a skip, never a result.
    #[serde(default)]
    pub checked: bool,
    /// The checks' outcome: `ok: ...`, or what failed and when; `None` when skipped.
    pub check: Option<String>,
    /// Why the variant did not run here, when it did not.
    pub skipped: Option<String>,
}

impl VariantResult {
    /// A row for a variant that could not run, with the reason.
    pub fn skipped(atoms: usize, variant: super::Variant, reason: String) -> Self {
        Self {
            atoms,
            variant: variant.name(),
            transport: variant.method.name().into(),
            graph: variant.graph,
            skipped: Some(reason),
            ..Self::default()
        }
    }

    /// A row whose check failed (`why`: what and when): its sizes and the reason, no times.
    pub fn failed(atoms: usize, variant: super::Variant, sizes: &super::HaloSizes, why: String) -> Self {
        Self {
            pulses: sizes.pulses,
            halo_atoms: sizes.atoms_x,
            check: Some(format!("FAILED: {why}")),
            skipped: None,
            ..Self::skipped(atoms, variant, String::new())
        }
    }

    /// Whether the row ran but is not a checked result (a check failed, or none passed): such a
    /// row's times are never written, and it fails the command.
    pub fn check_failed(&self) -> bool {
        self.skipped.is_none() && !self.is_result()
    }

    /// Whether the row is a result: it ran, and every check passed.
    pub fn is_result(&self) -> bool {
        self.skipped.is_none() && self.checked && self.check.as_deref().is_some_and(|c| c.starts_with("ok"))
    }

    /// The row as it may be published: a row that is not checked loses every time and floor
    /// figure, whatever it held.
    pub fn published(&self) -> Self {
        if !self.check_failed() {
            return self.clone();
        }
        Self {
            atoms: self.atoms,
            variant: self.variant.clone(),
            transport: self.transport.clone(),
            graph: self.graph,
            pulses: self.pulses,
            halo_atoms: self.halo_atoms,
            check: Some(self.check.clone().filter(|c| !c.starts_with("ok")).unwrap_or_else(|| "FAILED: not checked".into())),
            skipped: self.skipped.clone(),
            ..Self::default()
        }
    }
}

/// The version of the `halo bench --json` document: 2 since rows carry `checked` and a row that is
/// not checked carries no times (documents without the field are version 1).
pub const SCHEMA_VERSION: u32 = 2;

fn schema_v1() -> u32 {
    1
}

/// Every row that ran but is not a checked result, as `variant at N atoms: why`: the command
/// fails when there is any.
pub fn failures(r: &BenchReport) -> Vec<String> {
    r.results
        .iter()
        .filter(|v| v.check_failed())
        .map(|v| format!("{} at {} atoms: {}", v.variant, v.atoms, v.check.as_deref().unwrap_or("FAILED: not checked")))
        .collect()
}

/// A whole `halo bench` run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// The document's version ([`SCHEMA_VERSION`] when written by this program).
    #[serde(default = "schema_v1")]
    pub schema_version: u32,
    /// `one process` or `N processes (NVSHMEM)`.
    pub mode: String,
    /// Rank grid, e.g. `2x1x1`.
    pub ranks: String,
    /// The GPUs used, by name.
    pub gpus: Vec<String>,
    /// Where the halos came from (`md` or `synthetic`).
    pub halos: String,
    /// Timed steps per repeat.
    pub steps: usize,
    /// Timed repeats (after warm-up).
    pub repeats: usize,
    /// Untimed warm-up repeats.
    pub warmup: usize,
    /// The command line.
    pub command: String,
    /// The machine and software (GPUs, driver, topology, NCCL, NVSHMEM, date).
    pub machine: MachineInfo,
    /// The hardware floor measured in this run.
    pub floor: FloorReport,
    /// Every variant at every size.
    pub results: Vec<VariantResult>,
    /// What the router chose, per system size (every rank's plan); empty when no router
    /// decided (`--paths auto` or `force-put`).
    #[serde(default)]
    pub routes: Vec<SizeRoutes>,
}

/// The router's choices for one system size: every rank's [`halo::route::RoutedSummary`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SizeRoutes {
    /// The system size (atoms).
    pub atoms: usize,
    /// Rank `r`'s summary at `ranks[r]`.
    pub ranks: Vec<halo::route::RoutedSummary>,
}

fn opt_cell(s: &Option<Summary>, prec: usize) -> String {
    s.as_ref().map_or_else(|| "-".into(), |s| s.cell(prec))
}

fn opt_num(v: Option<f64>, prec: usize) -> String {
    v.filter(|v| v.is_finite()).map_or_else(|| "-".into(), |v| format!("{v:.prec$}"))
}

/// The floor as a short block of lines.
pub fn floor_text(f: &FloorReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "hardware floor ({}), median [min-max]:", f.between);
    match &f.one_way_latency_us {
        Some(l) => {
            let _ = writeln!(s, "  one-way signal latency   {} us", l.cell(2));
        }
        None => {
            let _ = writeln!(s, "  one-way signal latency   - (the PEs cannot map each other: not measured, floors omit it)");
        }
    }
    match &f.peer_bw_gbs {
        Some(b) => {
            let _ = writeln!(s, "  peer bandwidth           {} GB/s", b.cell(1));
        }
        None => {
            let _ = writeln!(s, "  peer bandwidth           - (all ranks on one GPU)");
        }
    }
    let _ = writeln!(s, "  device copy bandwidth    {} GB/s (read + write)", f.device_bw_gbs.cell(1));
    let _ = writeln!(s, "  kernel launch            {} us GPU, {} us host per call", f.launch_us.cell(2), f.launch_host_us.cell(2));
    let _ = writeln!(s, "  overlapping launch       {} us GPU (programmatic dependent launch, as `fused` launches)", f.overlapping_launch_us.cell(2));
    let _ = writeln!(s, "  graph launch             {} us GPU", f.graph_launch_us.cell(2));
    let _ = writeln!(s, "  host sync round trip     {} us", f.host_sync_us.cell(2));
    s
}

/// The whole report as an aligned text table with the floor above it.
pub fn table(r: &BenchReport) -> String {
    let mut s = r.machine.text();
    let _ = writeln!(s, "halo bench: {} ranks, {}, GPUs: {}, halos: {}", r.ranks, r.mode, r.gpus.join(", "), r.halos);
    let _ = writeln!(s, "{} steps x {} repeats after {} warm-up; times per step, GPU timeline, median [min-max]", r.steps, r.repeats, r.warmup);
    s.push_str(&floor_text(&r.floor));
    for size in &r.routes {
        for summary in &size.ranks {
            let _ = writeln!(s, "route at {} atoms: {summary}", size.atoms);
        }
    }
    let _ = writeln!(s, "ns/day*: a 2 fs step made of this exchange alone (no force computation yet): an upper bound.");
    let _ = writeln!(
        s,
        "syncs/step: host waits for a rank's stream per step and rank; check: a step before and after the timed loops and the timed steps' coordinates vs the CPU reference."
    );
    let header = [
        "atoms",
        "variant",
        "halo atoms",
        "coords us",
        "forces us",
        "step us",
        "floor us",
        "coords/floor",
        "step/floor",
        "ns/day*",
        "host CPU us",
        "syncs/step",
        "check",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for v in &r.results {
        if let Some(why) = &v.skipped {
            rows.push(vec![v.atoms.to_string(), v.variant.clone(), format!("skipped: {why}")]);
            continue;
        }
        if v.check_failed() {
            // No times for a row that is not checked: they are not results.
            rows.push(vec![v.atoms.to_string(), v.variant.clone(), "FAILED (no times: see below)".into()]);
            continue;
        }
        let floor = match v.floor {
            Some(FloorCheck::Model) => format!("{} model!", opt_num(v.floor_step_us, 1)),
            _ => opt_num(v.floor_step_us, 1),
        };
        let check = "ok".to_string();
        rows.push(vec![
            v.atoms.to_string(),
            v.variant.clone(),
            v.halo_atoms.to_string(),
            opt_cell(&v.coords_us, 1),
            opt_cell(&v.forces_us, 1),
            opt_cell(&v.step_us, 1),
            floor,
            opt_num(v.coords_per_floor, 2),
            opt_num(v.step_per_floor, 2),
            opt_num(v.ns_per_day_exchange_only, 0),
            opt_num(v.host_cpu_us, 1),
            opt_num(v.host_syncs_per_step, 1),
            check,
        ]);
    }
    let cols = header.len();
    let widths: Vec<usize> = (0..cols).map(|c| rows.iter().filter(|r| r.len() == cols).map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    for row in &rows {
        let line: Vec<String> = if row.len() == cols {
            row.iter()
                .enumerate()
                .map(|(c, cell)| if c < 2 { format!("{cell:<w$}", w = widths[c]) } else { format!("{cell:>w$}", w = widths[c]) })
                .collect()
        } else {
            // Skipped and failed rows: atoms and variant aligned, then the reason.
            row.iter().enumerate().map(|(c, cell)| if c < 2 { format!("{cell:<w$}", w = widths[c]) } else { cell.clone() }).collect()
        };
        let _ = writeln!(s, "{}", line.join("  ").trim_end());
    }
    if r.results.iter().any(|v| v.floor == Some(FloorCheck::Model)) {
        let _ = writeln!(s, "model!: a repeat of this variant was faster than its floor, so that floor is a model, not a bound (no ratio shown).");
    }
    for f in failures(r) {
        let _ = writeln!(s, "CHECK FAILED: {f}");
    }
    s
}

/// The report as it may be published: every row [`VariantResult::published`], this version.
pub fn published(r: &BenchReport) -> BenchReport {
    BenchReport { schema_version: SCHEMA_VERSION, results: r.results.iter().map(VariantResult::published).collect(), ..r.clone() }
}

/// The report as pretty JSON ([`published`]: a row that is not checked has `"checked": false`,
/// the reason in `check`, and no time fields).
pub fn json(r: &BenchReport) -> serde_json::Result<String> {
    serde_json::to_string_pretty(&published(r))
}

/// The results as CSV, one row per checked (or skipped) variant and size (floor values repeated on
/// every row so each row stands alone); rows that are not checked are left out. Times in µs.
pub fn csv(r: &BenchReport) -> String {
    let mut s = String::from(
        "atoms,variant,pulses,halo_atoms,coords_us_median,coords_us_min,coords_us_max,forces_us_median,forces_us_min,forces_us_max,\
         step_us_median,step_us_min,step_us_max,floor_coords_us,floor_step_us,ns_per_day_exchange_only,host_cpu_us,host_syncs_per_step,\
         latency_us,peer_bw_gbs,device_bw_gbs,launch_us,graph_launch_us,skipped,transport,graph,floor_forces_us,floor,coords_per_floor,\
         step_per_floor,check\n",
    );
    let num = |v: Option<f64>| v.filter(|v| v.is_finite()).map_or_else(String::new, |v| format!("{v}"));
    let three = |v: &Option<Summary>| match v {
        Some(s) => format!("{},{},{}", s.median, s.min, s.max),
        None => ",,".into(),
    };
    let f = &r.floor;
    for v in r.results.iter().filter(|v| !v.check_failed()) {
        // Quoted, and without commas, so every line splits into the same columns.
        let skipped = v.skipped.as_deref().unwrap_or("").replace(['"', '\n'], " ").replace(',', ";");
        let check = v.check.as_deref().unwrap_or("").replace(['"', '\n'], " ").replace(',', ";");
        let floor = match v.floor {
            Some(FloorCheck::Bound) => "bound",
            Some(FloorCheck::Model) => "model",
            None => "",
        };
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},\"{}\",{},{},{},{},{},{},\"{}\"",
            v.atoms,
            v.variant,
            v.pulses,
            v.halo_atoms,
            three(&v.coords_us),
            three(&v.forces_us),
            three(&v.step_us),
            num(v.floor_coords_us),
            num(v.floor_step_us),
            num(v.ns_per_day_exchange_only),
            num(v.host_cpu_us),
            num(v.host_syncs_per_step),
            num(f.one_way_latency_us.map(|l| l.median)),
            num(f.peer_bw_gbs.map(|b| b.median)),
            f.device_bw_gbs.median,
            f.launch_us.median,
            f.graph_launch_us.median,
            skipped,
            v.transport,
            v.graph,
            num(v.floor_forces_us),
            floor,
            num(v.coords_per_floor),
            num(v.step_per_floor),
            check
        );
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn sum(m: f64) -> Summary {
        Summary { median: m, min: m * 0.9, max: m * 1.2, n: 5 }
    }

    pub(crate) fn sample_report() -> BenchReport {
        let floor = FloorReport {
            between: "GPU 0 and GPU 1".into(),
            one_way_latency_us: Some(sum(0.8)),
            peer_bw_gbs: Some(sum(380.0)),
            device_bw_gbs: sum(3900.0),
            launch_us: sum(2.1),
            launch_host_us: sum(1.5),
            graph_launch_us: sum(2.5),
            overlapping_launch_us: sum(1.5),
            host_sync_us: sum(6.0),
        };
        let mut results = Vec::new();
        for (atoms, scale) in [(6000usize, 1.0), (45000, 2.0)] {
            for (name, t) in [("staged", 40.0), ("fused", 8.0), ("fused+graph", 6.0)] {
                let step = t * scale;
                results.push(VariantResult {
                    atoms,
                    variant: name.into(),
                    transport: name.trim_end_matches("+graph").into(),
                    graph: name.ends_with("+graph"),
                    pulses: 1,
                    halo_atoms: (atoms as f64 * 0.25) as usize,
                    coords_us: Some(sum(step / 2.0)),
                    forces_us: Some(sum(step / 2.0)),
                    step_us: Some(sum(step)),
                    host_cpu_us: Some(3.0),
                    host_syncs_per_step: Some(if name == "staged" { 4.0 } else { 0.0 }),
                    ns_per_day_exchange_only: Some(super::super::stats::ns_per_day(step * 1e-6, 2.0)),
                    floor_coords_us: Some(3.0),
                    floor_forces_us: Some(3.0),
                    floor_step_us: Some(6.0),
                    floor: Some(FloorCheck::Bound),
                    coords_per_floor: Some(step / 2.0 / 3.0),
                    step_per_floor: Some(step / 6.0),
                    checked: true,
                    check: Some("ok: coordinates bit-exact, forces max rel err 1.2e-7".into()),
                    skipped: None,
                });
            }
        }
        let skipped = crate::bench::Variant { method: crate::bench::Method::PerPulse, graph: false };
        results.push(VariantResult::skipped(6000, skipped, "needs NVSHMEM".into()));
        BenchReport {
            schema_version: SCHEMA_VERSION,
            mode: "one process".into(),
            ranks: "2x1x1".into(),
            gpus: vec!["H200".into(), "H200".into()],
            halos: "md".into(),
            steps: 200,
            repeats: 7,
            warmup: 3,
            command: "halo bench".into(),
            machine: crate::machine::tests::sample(),
            floor,
            results,
            routes: Vec::new(),
        }
    }

    #[test]
    fn table_has_every_row_and_the_floor() {
        let t = table(&sample_report());
        assert!(t.contains("one-way signal latency   0.80 [0.72-0.96] us"), "{t}");
        assert!(t.contains("380.0 [342.0-456.0] GB/s"));
        assert!(t.contains("exchange alone"));
        let fused: Vec<&str> = t.lines().filter(|l| l.starts_with("6000") && l.contains(" fused ")).collect();
        assert_eq!(fused.len(), 1, "{t}");
        // median [min-max], floor, coords/floor 4/3, step/floor 8/6, ns/day of an 8 us step = 21 600.
        assert!(fused[0].contains("8.0 [7.2-9.6]") && fused[0].contains("1.33") && fused[0].contains("21600"), "{}", fused[0]);
        assert!(fused[0].ends_with(" ok"), "{}", fused[0]);
        assert!(t.contains("skipped: needs NVSHMEM"));
        // The machine comes first.
        assert!(t.starts_with("machine: h200-1"), "{t}");
        assert!(!t.contains("model!") && !t.contains("CHECK FAILED"), "{t}");
        // Data rows are aligned: every full row has the same width.
        let widths: Vec<usize> =
            t.lines().filter(|l| l.starts_with("6000 ") || l.starts_with("45000")).filter(|l| !l.contains("skipped")).map(|l| l.len()).collect();
        assert!(widths.windows(2).all(|w| w[0] == w[1]), "{widths:?}");
    }

    /// What the router chose is in every report: one table line per rank and size, and
    /// the JSON's `routes` field (every rank's summary), which round-trips.
    #[test]
    fn routes_appear_in_the_table_and_the_json() {
        use halo::route::{IntraNodeLink, RouteConfig, RoutedPaths, Router, synthetic_facts, topology_from_facts};
        let halos = halo::exchange::synthetic::halos(
            halo::exchange::synthetic::SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 500, send_fraction: 0.3, box_len: 5.0 },
            1,
        );
        let topo = std::sync::Arc::new(topology_from_facts(&synthetic_facts(&["n0".into()], 2, 1, IntraNodeLink::Nvlink), None).unwrap());
        let ranks: Vec<_> = (0..2)
            .map(|r| RoutedPaths::plan(&mut Router::new(r, topo.clone(), RouteConfig::default()).unwrap(), &halos).unwrap().summary().unwrap())
            .collect();
        let mut r = sample_report();
        r.routes = vec![SizeRoutes { atoms: 6000, ranks }];
        let t = table(&r);
        assert_eq!(t.lines().filter(|l| l.starts_with("route at 6000 atoms: PE ")).count(), 2, "{t}");
        let text = json(&r).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["routes"][0]["ranks"][1]["pe"], 1, "{text}");
        assert_eq!(v["routes"][0]["ranks"][0]["peers"][0]["peer"], 1, "{text}");
        let back: BenchReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back.routes, r.routes);
        // Reports written before the field existed still load.
        let mut old: serde_json::Value = serde_json::from_str(&json(&sample_report()).unwrap()).unwrap();
        old.as_object_mut().unwrap().remove("routes");
        assert!(serde_json::from_value::<BenchReport>(old).unwrap().routes.is_empty());
    }

    #[test]
    fn a_floor_that_is_a_model_and_a_failed_check_are_flagged() {
        let mut r = sample_report();
        r.results[1].floor = Some(FloorCheck::Model);
        r.results[1].step_per_floor = None;
        r.results[1].coords_per_floor = None;
        r.results[2].check = Some("FAILED: rank 1: coordinate of atom 7 is NaN".into());
        let t = table(&r);
        let fused = t.lines().find(|l| l.starts_with("6000") && l.contains(" fused ")).unwrap();
        assert!(fused.contains("6.0 model!"), "{fused}");
        assert!(t.contains("model!: a repeat of this variant was faster than its floor"), "{t}");
        assert!(t.contains("CHECK FAILED: fused+graph at 6000 atoms: FAILED: rank 1"), "{t}");
        assert!(r.results[2].check_failed() && !r.results[0].check_failed());
        // No ratio below 1 is ever printed: every number in the ratio columns is at least 1.
        for line in t.lines().filter(|l| l.starts_with("6000 ") || l.starts_with("45000")) {
            let cells: Vec<&str> = line.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
            for c in cells.iter().filter_map(|c| c.parse::<f64>().ok()).filter(|v| *v < 1.0) {
                assert!(c == 0.0, "a ratio below 1 in {line}");
            }
        }
    }

    /// A row that ran but failed its check (as the runner filled it before: times beside a
    /// FAILED check) publishes no time anywhere: not in the JSON, the CSV, the plot's series or
    /// the table, and it is listed as a failure.
    #[test]
    fn a_failed_row_writes_no_times() {
        let mut r = sample_report();
        r.results[1].checked = false;
        r.results[1].check = Some("FAILED: checked step before the timed loops: rank 1: coordinate of atom 7 is NaN".into());
        assert!(r.results[1].step_us.is_some(), "the row holds times");
        let v: serde_json::Value = serde_json::from_str(&json(&r).unwrap()).unwrap();
        assert_eq!(v["schema_version"], SCHEMA_VERSION);
        let row = &v["results"][1];
        assert_eq!((row["variant"].as_str(), row["atoms"].as_u64(), row["checked"].as_bool()), (Some("fused"), Some(6000), Some(false)), "{row}");
        assert!(row["check"].as_str().unwrap().contains("coordinate of atom 7"), "{row}");
        for k in [
            "coords_us",
            "forces_us",
            "step_us",
            "host_cpu_us",
            "host_syncs_per_step",
            "ns_per_day_exchange_only",
            "floor_step_us",
            "step_per_floor",
            "coords_per_floor",
        ] {
            assert!(row.get(k).is_none_or(|x| x.is_null()), "{k} written for a failed row: {row}");
        }
        assert_eq!(v["results"][0]["checked"], true);
        assert!(v["results"][0]["step_us"]["median"].is_number());
        let c = csv(&r);
        assert!(!c.lines().any(|l| l.starts_with("6000,fused,")), "{c}");
        assert!(c.lines().any(|l| l.starts_with("45000,fused,")), "{c}");
        let series = super::super::plot::tests::series_of(&r);
        let fused = series.iter().find(|(n, _)| n == "fused").unwrap();
        assert_eq!(fused.1, vec![(45000.0, 16.0)], "{series:?}");
        let t = table(&r);
        let line = t.lines().find(|l| l.starts_with("6000") && l.contains(" fused ")).unwrap();
        assert!(line.contains("FAILED") && !line.contains("8.0"), "{line}");
        assert_eq!(
            failures(&r),
            vec!["fused at 6000 atoms: FAILED: checked step before the timed loops: rank 1: coordinate of atom 7 is NaN".to_string()]
        );
        assert!(failures(&sample_report()).is_empty());
    }

    /// A row that claims `checked` without an `ok` check, or that ran with no check at all, is not
    /// a result either.
    #[test]
    fn a_row_without_a_passed_check_is_not_a_result() {
        let mut r = sample_report();
        r.results[0].check = None;
        r.results[2].checked = false;
        assert!(r.results[0].check_failed() && r.results[2].check_failed() && !r.results[6].check_failed(), "skipped rows are not failures");
        assert_eq!(failures(&r).len(), 2);
        let p = published(&r);
        assert!(p.results[0].step_us.is_none() && !p.results[0].checked && p.results[0].check.as_deref() == Some("FAILED: not checked"));
        assert!(p.results[2].step_us.is_none() && p.results[1].step_us.is_some());
        // Version 1 documents (no `checked`, no version) load, and their rows are not results.
        let mut old: serde_json::Value = serde_json::from_str(&json(&sample_report()).unwrap()).unwrap();
        old.as_object_mut().unwrap().remove("schema_version");
        for row in old["results"].as_array_mut().unwrap() {
            row.as_object_mut().unwrap().remove("checked");
        }
        let back: BenchReport = serde_json::from_value(old).unwrap();
        assert_eq!(back.schema_version, 1);
        assert!(back.results.iter().all(|v| !v.is_result()));
    }

    #[test]
    fn json_rows_carry_the_fields_the_tables_are_built_from() {
        let v: serde_json::Value = serde_json::from_str(&json(&sample_report()).unwrap()).unwrap();
        let row = &v["results"][1];
        assert_eq!(row["transport"], "fused");
        assert_eq!(row["graph"], false);
        assert_eq!(row["atoms"], 6000);
        for k in ["coords_us", "forces_us", "step_us"] {
            assert!(row[k]["median"].is_number() && row[k]["min"].is_number() && row[k]["max"].is_number(), "{k}: {row}");
        }
        assert_eq!(v["results"][2]["graph"], true);
        assert_eq!(v["results"][2]["transport"], "fused");
        assert_eq!(row["floor"], "bound");
        assert!(row["check"].as_str().unwrap().starts_with("ok"));
        assert_eq!(v["machine"]["nvidia_driver"], "580.159.04");
        assert!(v["machine"]["topology"].as_str().unwrap().contains("NV18"));
        assert!(v["machine"]["nccl"].as_str().unwrap().starts_with("2.28.9"));
    }

    #[test]
    fn json_round_trips() {
        let r = sample_report();
        let back: BenchReport = serde_json::from_str(&json(&r).unwrap()).unwrap();
        // serde_json's default float parsing may differ in the last bit: compare with a tolerance.
        assert_eq!((back.ranks.as_str(), back.results.len(), back.steps), (r.ranks.as_str(), r.results.len(), r.steps));
        for (a, b) in back.results.iter().zip(&r.results) {
            assert_eq!((&a.variant, a.atoms, &a.skipped), (&b.variant, b.atoms, &b.skipped));
            let (sa, sb) = (a.step_us.map(|s| s.min), b.step_us.map(|s| s.min));
            assert!(sa.zip(sb).is_none_or(|(x, y)| (x - y).abs() < 1e-9) && sa.is_some() == sb.is_some());
        }
        assert!((back.floor.launch_us.min - r.floor.launch_us.min).abs() < 1e-12);
    }

    #[test]
    fn csv_has_a_header_and_one_line_per_result() {
        let r = sample_report();
        let c = csv(&r);
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 1 + r.results.len());
        let cols = lines[0].split(',').count();
        for l in &lines[1..] {
            assert_eq!(l.split(',').count(), cols, "{l}");
        }
        assert!(lines[2].starts_with("6000,fused,1,1500,4,3.6,4.8,4,3.6,4.8,8,7.2"), "{}", lines[2]);
        assert!(lines[2].contains(",fused,false,3,bound,"), "{}", lines[2]);
        assert!(lines.last().unwrap().contains("\"needs NVSHMEM\",per-pulse,false"), "{}", lines.last().unwrap());
    }
}
