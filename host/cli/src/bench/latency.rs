//! The latency summary of one or more `halo bench` reports (`latency-2gpu.json`): the
//! one-way signal latency of each run's floor, and per mode, transport and size the medians of
//! the coordinate halo, the force halo, the full step and the full step replayed as a graph.
//! A pure function of the reports, so a committed report can be summarised without a GPU.

use super::report::{BenchReport, VariantResult};
use crate::machine::MachineInfo;
use serde::Serialize;

/// The summary of one or more bench runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatencySummary {
    /// One-way signal latency (µs, median) of the first report's floor: the PE mode when the
    /// first report came from `halo launch`.
    pub signal_one_way_us: Option<f64>,
    /// Each report's mode and its one-way signal latency (µs, median).
    pub signal_one_way_us_by_mode: Vec<(String, Option<f64>)>,
    /// One row per mode, transport and size that ran (skipped and failed rows are left out).
    pub rows: Vec<LatencyRow>,
    /// The commands the reports came from.
    pub commands: Vec<String>,
    /// The first report's machine (every report records its own).
    pub machine: Option<MachineInfo>,
}

/// One transport at one size in one mode (µs, medians over the run's repeats).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatencyRow {
    /// `one process` or `N processes, one GPU each (NVSHMEM)`.
    pub mode: String,
    /// The transport (`fused`, `direct-copy`, `staged`, `nccl`, ...).
    pub transport: String,
    /// Atoms in the whole system.
    pub atoms: usize,
    /// Coordinate halo.
    pub coords_us: f64,
    /// Force halo.
    pub forces_us: f64,
    /// Both halos, launched as plain kernels.
    pub step_us: f64,
    /// Both halos replayed as one captured graph, when the run measured it.
    pub graph_step_us: Option<f64>,
}

/// Whether a row ran and passed its check.
fn usable(r: &VariantResult) -> bool {
    r.is_result() && r.step_us.is_some()
}

/// The summary of `reports` (see [`LatencySummary`]).
pub fn summarise(reports: &[BenchReport]) -> LatencySummary {
    let mut rows = Vec::new();
    for rep in reports {
        for r in rep.results.iter().filter(|r| !r.graph && usable(r)) {
            let (Some(c), Some(f), Some(s)) = (r.coords_us, r.forces_us, r.step_us) else { continue };
            let graph = rep
                .results
                .iter()
                .find(|g| g.graph && g.atoms == r.atoms && g.transport == r.transport && usable(g))
                .and_then(|g| g.step_us.map(|s| s.median));
            rows.push(LatencyRow {
                mode: rep.mode.clone(),
                transport: r.transport.clone(),
                atoms: r.atoms,
                coords_us: c.median,
                forces_us: f.median,
                step_us: s.median,
                graph_step_us: graph,
            });
        }
    }
    let signal = |rep: &BenchReport| rep.floor.one_way_latency_us.map(|s| s.median);
    LatencySummary {
        signal_one_way_us: reports.first().and_then(signal),
        signal_one_way_us_by_mode: reports.iter().map(|r| (r.mode.clone(), signal(r))).collect(),
        rows,
        commands: reports.iter().map(|r| r.command.clone()).collect(),
        machine: reports.first().map(|r| r.machine.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::tests::sample_report;

    #[test]
    fn rows_pair_each_plain_step_with_its_graph_and_leave_out_failures() {
        let mut rep = sample_report();
        let mut failed = rep.results.iter().find(|r| r.transport == "staged").cloned().expect("staged row");
        failed.atoms = 7;
        failed.check = Some("FAILED: coordinates differ".into());
        rep.results.push(failed);
        let s = summarise(&[rep.clone()]);
        assert_eq!(s.signal_one_way_us, Some(0.8));
        assert_eq!(s.signal_one_way_us_by_mode, vec![(rep.mode.clone(), Some(0.8))]);
        // staged and fused at two sizes; fused+graph folds into fused; the failed and skipped rows are out.
        assert_eq!(s.rows.len(), 4, "{:?}", s.rows);
        let fused45 = s.rows.iter().find(|r| r.transport == "fused" && r.atoms == 45000).expect("fused 45k");
        assert_eq!((fused45.coords_us, fused45.forces_us, fused45.step_us, fused45.graph_step_us), (8.0, 8.0, 16.0, Some(12.0)));
        let staged6 = s.rows.iter().find(|r| r.transport == "staged" && r.atoms == 6000).expect("staged 6k");
        assert_eq!(staged6.graph_step_us, None);
        assert!(s.rows.iter().all(|r| r.atoms != 7));
        let json = serde_json::to_value(&s).expect("json");
        for key in ["transport", "atoms", "coords_us", "forces_us", "step_us", "graph_step_us"] {
            assert!(json["rows"][0].get(key).is_some(), "{key}");
        }
        assert!(summarise(&[]).rows.is_empty());
    }
}
