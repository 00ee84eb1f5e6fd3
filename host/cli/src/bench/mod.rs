//! `halo bench`: every halo transport side by side on the same halos, with the hardware floor
//! measured in the same run, and `halo bench-kernels` for the pack/unpack kernels alone.
//!
//! - [`stats`]: median and range over repeats; ns/day.
//! - [`floor`]: the hardware floor (latency, bandwidths, launch overheads) and the floor each
//!   variant's bytes and signal chain imply.
//! - [`report`]: the results as a table, JSON and CSV; [`plot`]: the PNG.
//! - [`nccl`]: the NCCL baseline (NCCL loaded at run time).
//! - [`graph`]: the GPU-initiated (and NCCL) step captured as CUDA graphs.
//! - [`step`]: one step of any method on this process's ranks, and the checked step every
//!   variant passes (CPU reference) before its times count.
//! - [`pecomm`]: small collectives between PEs over the symmetric heap.
//! - [`runner`]: the measurement loops, in one process or one rank per process.
//! - [`kernels`]: pack and unpack-accumulate at 1M atoms.
//! - [`timeline`]: `halo timeline`, where the time of the fused halo goes (stamped kernels).
//! - [`md`]: `halo md-bench`, ns/day of the whole MD step per transport (search steps included).
//! - [`search_parts`]: where a search step's host time goes, from the library's search spans.
//!
//! What a run ran on is [`crate::machine::MachineInfo`], in every result file and log.
//!
//! Every time of `halo bench` is the halo exchange alone (no force computation): its ns/day figures
//! say how fast a step made of nothing but the exchange would run, an upper bound for the MD step.
//! `halo md-bench` ([`md`]) times the whole MD step.

pub mod floor;
pub mod graph;
pub mod kernels;
pub mod latency;
pub mod md;
pub mod nccl;
pub mod pecomm;
pub mod plot;
pub mod report;
pub mod runner;
pub mod search_parts;
pub mod stats;
pub mod step;
pub mod timeline;

use crate::decomp::{HaloPlan, RankGrid};
use crate::error::{HaloError, Result};
use crate::exchange::synthetic::{self, SyntheticShape};
use crate::exchange::{RankHalo, Transport};
use crate::system::{MolecularSystem, NUMBER_DENSITY};
use serde::{Deserialize, Serialize};

/// Bytes of one coordinate or force (`float3`).
pub const FLOAT3_BYTES: u64 = 12;

/// The time step ns/day figures assume (fs).
pub const TIME_STEP_FS: f64 = 2.0;

/// How a halo moves: the exchange's transports plus the NCCL baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Method {
    /// Host-orchestrated, GPU-aware transfers with a host sync per pulse (GROMACS's GPU-aware MPI path).
    Staged,
    /// Stream-ordered peer copies and cross-GPU event waits (GROMACS's direct GPU communication
    /// under thread-MPI).
    DirectCopy,
    /// Host-orchestrated NCCL send/recv per pulse, stream-ordered.
    Nccl,
    /// One NVSHMEM pack + put + signal kernel per pulse.
    PerPulse,
    /// One pack + direct-store + signal kernel per pulse.
    PerPulseDirect,
    /// One kernel for all coordinate pulses, one for all force pulses.
    Fused,
    /// `Fused` with per-warp bulk copies.
    FusedTma,
}

impl Method {
    /// Every method, in report order.
    pub const ALL: [Method; 7] =
        [Method::Staged, Method::DirectCopy, Method::Nccl, Method::PerPulse, Method::PerPulseDirect, Method::Fused, Method::FusedTma];

    /// The exchange transport behind it (`None` for NCCL).
    pub fn transport(self) -> Option<Transport> {
        match self {
            Method::Staged => Some(Transport::Staged),
            Method::DirectCopy => Some(Transport::DirectCopy),
            Method::Nccl => None,
            Method::PerPulse => Some(Transport::PerPulse),
            Method::PerPulseDirect => Some(Transport::PerPulseDirect),
            Method::Fused => Some(Transport::Fused),
            Method::FusedTma => Some(Transport::FusedTma),
        }
    }

    /// The method of an exchange transport.
    pub fn of(transport: Transport) -> Self {
        Self::ALL.into_iter().find(|m| m.transport() == Some(transport)).unwrap_or(Method::Fused)
    }

    /// Whether the GPU drives the step (no host sync, graph-capturable).
    pub fn gpu_initiated(self) -> bool {
        self.transport().is_some_and(Transport::gpu_initiated)
    }

    /// Whether a step can be captured as a CUDA graph and replayed: the GPU-initiated methods
    /// and NCCL (its calls are stream-ordered and capturable). Not `staged` (host syncs) nor
    /// `direct-copy` (host handshakes and events between processes).
    pub fn capturable(self) -> bool {
        self.gpu_initiated() || self == Method::Nccl
    }

    /// Whether it needs NVSHMEM (several processes).
    pub fn needs_nvshmem(self) -> bool {
        self.transport().is_some_and(Transport::needs_nvshmem)
    }

    /// Whether it needs every peer reachable by loads, stores or copies.
    pub fn needs_direct_peers(self) -> bool {
        self.transport().is_some_and(Transport::needs_direct_peers)
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Method::Nccl => "nccl",
            m => m.transport().map_or("nccl", Transport::name),
        }
    }

    /// Parses one name (`staged`, `direct-copy`, `nccl`, `per-pulse`, `per-pulse-direct`, `fused`, `fused-tma`).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == s.trim())
    }
}

/// Parses `--transport`: a comma-separated list of method names, or `all`.
pub fn parse_methods(s: &str) -> std::result::Result<Vec<Method>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part == "all" {
            return Ok(Method::ALL.to_vec());
        }
        let m = Method::parse(part)
            .ok_or_else(|| format!("unknown transport `{part}` (possible values: all, {})", Method::ALL.map(Method::name).join(", ")))?;
        if !out.contains(&m) {
            out.push(m);
        }
    }
    if out.is_empty() {
        return Err("no transport given".into());
    }
    Ok(out)
}

/// One row of the benchmark: a method, with or without the step captured as a CUDA graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Variant {
    /// How the halo moves.
    pub method: Method,
    /// The GPU-initiated step captured as CUDA graphs and replayed.
    pub graph: bool,
}

impl Variant {
    /// `fused`, `fused+graph`, ...
    pub fn name(&self) -> String {
        if self.graph { format!("{}+graph", self.method.name()) } else { self.method.name().to_string() }
    }

    /// The variants to run for `methods`: each, plus its graph form for capturable methods
    /// when `graph` is set.
    pub fn list(methods: &[Method], graph: bool) -> Vec<Variant> {
        let mut out = Vec::new();
        for &m in methods {
            out.push(Variant { method: m, graph: false });
            if graph && m.capturable() {
                out.push(Variant { method: m, graph: true });
            }
        }
        out
    }
}

/// Where the halos come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize)]
pub enum HaloSource {
    /// The real decomposition: a synthetic MD system at 100 atoms/nm³, its halo plan.
    Md,
    /// Random halos sized like an MD decomposition ([`md_send_fraction`]).
    Synthetic,
}

/// Edge (nm) of the cubic box holding `atoms` at `density` atoms/nm³.
pub fn box_edge(atoms: usize, density: f64) -> f64 {
    (atoms as f64 / density).cbrt()
}

/// The fraction of a rank's atoms one pulse along a dimension split `ranks_along` ways sends in
/// an MD decomposition: a rank's cell is `box / ranks_along` wide, and the atoms within `cutoff`
/// of its lower face go to the lower neighbour, so `cutoff / (box / ranks_along)` of them
/// (capped at 1: a cutoff beyond the cell needs more pulses, which this sizing does not model).
///
/// For N atoms at 100 atoms/nm³ split 2x1x1 with a 1 nm cutoff each rank sends
/// `N/2 * cutoff / (box/2)` atoms: about 1 530 of 6 000, 61 000 of 1.5 M.
pub fn md_send_fraction(atoms: usize, density: f64, cutoff: f64, ranks_along: usize) -> f64 {
    let cell = box_edge(atoms, density) / ranks_along.max(1) as f64;
    (cutoff / cell).min(1.0)
}

/// Atoms one rank sends per pulse for `atoms` split over `grid` (dimension `dim`'s pulse, home
/// atoms only, which is what the 2x1x1 case has): `atoms / ranks * md_send_fraction`.
pub fn md_send_atoms(atoms: usize, density: f64, cutoff: f64, grid: [usize; 3], dim: usize) -> usize {
    let ranks: usize = grid.iter().product();
    ((atoms / ranks.max(1)) as f64 * md_send_fraction(atoms, density, cutoff, grid[dim])).round() as usize
}

/// The synthetic halo shape that mimics an MD decomposition of `atoms` on `grid`: `atoms /
/// ranks` home atoms per rank, one pulse per decomposed dimension, sending the fraction
/// [`md_send_fraction`] gives (averaged over the decomposed dimensions, which differ only when
/// the grid is uneven).
pub fn synthetic_md_shape(atoms: usize, grid: [usize; 3], cutoff: f64) -> SyntheticShape {
    let ranks: usize = grid.iter().product();
    let dims: Vec<usize> = (0..3).filter(|&d| grid[d] > 1).collect();
    let fraction = if dims.is_empty() {
        0.0
    } else {
        dims.iter().map(|&d| md_send_fraction(atoms, NUMBER_DENSITY, cutoff, grid[d])).sum::<f64>() / dims.len() as f64
    };
    SyntheticShape {
        grid,
        pulses_per_dim: 1,
        home_atoms: atoms / ranks.max(1),
        send_fraction: fraction,
        box_len: box_edge(atoms, NUMBER_DENSITY) as f32,
    }
}

/// The halos of `atoms` on `grid` from `source` (deterministic in `seed`, so every rank of a
/// multi-process run builds the same ones).
pub fn build_halos(source: HaloSource, atoms: usize, grid: [usize; 3], cutoff: f32, seed: u64) -> Result<Vec<RankHalo>> {
    match source {
        HaloSource::Md => {
            let system =
                MolecularSystem::generate(atoms, seed).map_err(|e| HaloError::InvalidInput(format!("building the {atoms}-atom system: {e}")))?;
            let grid = RankGrid::new(grid).map_err(|e| HaloError::InvalidInput(e.to_string()))?;
            let plan =
                HaloPlan::build(&system, grid, cutoff).map_err(|e| HaloError::InvalidInput(format!("decomposing {atoms} atoms on {grid}: {e}")))?;
            Ok(plan.rank_halos())
        }
        HaloSource::Synthetic => Ok(synthetic::halos(synthetic_md_shape(atoms, grid, cutoff as f64), seed)),
    }
}

/// Per-step sizes of a decomposition: what one rank (the largest) sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaloSizes {
    /// Pulses per step.
    pub pulses: usize,
    /// Coordinates sent per step by the rank sending most (all pulses).
    pub atoms_x: usize,
    /// Forces sent back per step by the rank sending most.
    pub atoms_f: usize,
}

impl HaloSizes {
    /// The sizes of `halos`.
    pub fn of(halos: &[RankHalo]) -> Self {
        let atoms_x = halos.iter().map(|h| h.pulses.iter().map(|p| p.index_map.len()).sum::<usize>()).max().unwrap_or(0);
        let atoms_f = halos.iter().map(|h| h.pulses.iter().map(|p| p.recv_size).sum::<usize>()).max().unwrap_or(0);
        Self { pulses: halos.first().map_or(0, |h| h.pulses.len()), atoms_x, atoms_f }
    }

    /// The floor formulas' input.
    pub fn shape(&self, link: floor::Link, steps_per_graph: usize) -> floor::HaloShape {
        floor::HaloShape {
            bytes_x: self.atoms_x as u64 * FLOAT3_BYTES,
            bytes_f: self.atoms_f as u64 * FLOAT3_BYTES,
            pulses: self.pulses,
            link,
            steps_per_graph,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::spec::validate;

    #[test]
    fn method_names_round_trip() {
        for m in Method::ALL {
            assert_eq!(Method::parse(m.name()), Some(m));
        }
        assert_eq!(parse_methods("all").unwrap(), Method::ALL.to_vec());
        assert_eq!(parse_methods("fused, nccl,fused").unwrap(), vec![Method::Fused, Method::Nccl]);
        assert!(parse_methods("warp").unwrap_err().contains("unknown transport `warp`"));
        assert!(parse_methods("").is_err());
    }

    #[test]
    fn graph_variants_only_for_capturable_methods() {
        let v = Variant::list(&[Method::Staged, Method::DirectCopy, Method::Nccl, Method::Fused], true);
        let names: Vec<String> = v.iter().map(Variant::name).collect();
        assert_eq!(names, ["staged", "direct-copy", "nccl", "nccl+graph", "fused", "fused+graph"]);
        for t in Transport::ALL {
            assert_eq!(Method::of(t).transport(), Some(t));
        }
        assert_eq!(Variant::list(&[Method::Fused], false).len(), 1);
    }

    #[test]
    fn md_sizing_matches_the_slab_estimate() {
        // 6000 atoms: box 3.915 nm, cells 1.957 nm: 3000 * 1/1.957 = 1533 atoms per pulse.
        let n = md_send_atoms(6000, 100.0, 1.0, [2, 1, 1], 0);
        assert!((1520..=1545).contains(&n), "{n}");
        let n = md_send_atoms(1_500_000, 100.0, 1.0, [2, 1, 1], 0);
        assert!((60_000..=62_000).contains(&n), "{n}");
        // A cutoff past the cell sends everything (capped).
        assert_eq!(md_send_fraction(100, 100.0, 5.0, 2), 1.0);
    }

    #[test]
    fn synthetic_md_halos_are_valid_and_sized() {
        let h = build_halos(HaloSource::Synthetic, 6000, [2, 1, 1], 1.0, 1).unwrap();
        validate(&h).unwrap();
        let s = HaloSizes::of(&h);
        assert_eq!(s.pulses, 1);
        assert!((1500..=1570).contains(&s.atoms_x), "{s:?}");
        let h = build_halos(HaloSource::Synthetic, 6000, [2, 2, 2], 1.0, 1).unwrap();
        validate(&h).unwrap();
        assert_eq!(HaloSizes::of(&h).pulses, 3);
    }

    #[test]
    fn md_plans_convert_into_valid_halos() {
        for grid in [[2, 1, 1], [2, 2, 2]] {
            let h = build_halos(HaloSource::Md, 6000, grid, 1.0, 1).unwrap();
            validate(&h).unwrap();
            assert_eq!(h.len(), grid.iter().product::<usize>());
            let s = HaloSizes::of(&h);
            assert!(s.atoms_x > 1000, "{s:?}");
            // The MD plan and the synthetic sizing agree to within a few percent on 2x1x1.
            if grid == [2, 1, 1] {
                let est = md_send_atoms(6000, 100.0, 1.0, grid, 0) as f64;
                assert!((s.atoms_x as f64 / est - 1.0).abs() < 0.1, "{s:?} vs {est}");
            }
        }
    }
}
