//! Running the MD loop: all ranks in one process, or one rank per NVSHMEM PE, through one driver
//! over [`Exchange`]; optionally checking every step against the CPU references.

use super::domain::Domain;
use super::rank::{MdRank, Physics};
use crate::abi::Float3;
use crate::decomp::RankGrid;
use crate::error::{HaloError, Result};
use crate::exchange::pe::PathPolicy;
use crate::exchange::{Exchange, Placement, RankExchange, Routing, Transport, reference};
use crate::gpu::{DeviceMemory, KernelModule};
use crate::integrity::{self, RankChecksums};
use crate::md_reference;
use crate::session::PeSession;
use crate::system::MolecularSystem;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to simulate and how.
#[derive(Clone, Debug)]
pub struct MdConfig {
    /// Atoms in the synthetic liquid.
    pub atoms: usize,
    /// Rank grid.
    pub grid: RankGrid,
    /// Interaction cutoff (nm).
    pub cutoff: f32,
    /// Pair-list buffer added to the cutoff for the halo and the pair lists (nm).
    pub buffer: f32,
    /// Steps between re-decompositions.
    pub nstlist: u64,
    /// Time step (ps).
    pub dt: f32,
    /// Steps to run.
    pub steps: u64,
    /// Seed of the system.
    pub seed: u64,
    /// Exchange transport.
    pub transport: Transport,
    /// Check every `check_every` steps against the CPU references (0: never).
    pub check_every: u64,
    /// Deadline of every device wait.
    pub wait_timeout: Duration,
    /// PE mode: how pulses reach their peers.
    pub path_policy: PathPolicy,
}

/// Errors of one checked step, per quantity (largest over ranks and atoms).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCheck {
    /// Largest absolute coordinate difference after the coordinate halo (0: bit-exact).
    pub coord_max_abs: f64,
    /// Largest force-component difference after the force halo, against the undecomposed system,
    /// relative to max(|F| of that atom, RMS force of the system). Not relative to the component
    /// alone: a small net force is the sum of large pair forces, and f32 coordinates and sums err in
    /// proportion to those (about 1e-5 of a pair force), not to what is left after they cancel.
    pub force_max_rel: f64,
    /// Largest absolute force difference (kJ/mol/nm).
    pub force_max_abs: f64,
}

impl StepCheck {
    fn merge(&mut self, o: StepCheck) {
        self.coord_max_abs = self.coord_max_abs.max(o.coord_max_abs);
        self.force_max_rel = self.force_max_rel.max(o.force_max_rel);
        self.force_max_abs = self.force_max_abs.max(o.force_max_abs);
    }
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct MdOutcome {
    /// Steps run.
    pub steps: u64,
    /// Steps checked against the references.
    pub checked_steps: u64,
    /// Worst errors over the checked steps.
    pub worst: StepCheck,
    /// Re-decompositions.
    pub rebuilds: u64,
    /// Wall time of the steps (host clock, including checks).
    pub wall: Duration,
    /// Pairs within the list cutoff at the last rebuild.
    pub pairs: usize,
    /// GPU time per step (µs) of each window of steps between two search steps that had no
    /// checked step, on rank 0's local stream (the step's end), in order.
    pub window_step_us: Vec<f64>,
    /// What the router chose for the ranks of this process at the last re-decomposition (empty
    /// without routing).
    pub routes: Vec<crate::route::RoutedSummary>,
    /// Windows of steps run again after a safe point found a failure (routing only).
    pub reruns: u64,
}

impl MdOutcome {
    /// Median of [`Self::window_step_us`], if any window was timed.
    pub fn median_step_us(&self) -> Option<f64> {
        let mut v = self.window_step_us.clone();
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[v.len() / 2])
    }
}

/// Relative force tolerance against the undecomposed CPU forces (float accumulation order differs).
pub const FORCE_TOLERANCE: f64 = 1e-4;

impl MdConfig {
    fn physics(&self, system: &MolecularSystem) -> Physics {
        Physics { box_size: system.box_size, rc2: self.cutoff * self.cutoff, dt: self.dt, ntypes: system.atom_types.len() as u32 }
    }

    fn list_cutoff(&self) -> f32 {
        self.cutoff + self.buffer
    }

    fn checks_step(&self, step: u64) -> bool {
        self.check_every > 0 && step % self.check_every == 0
    }

    /// Whether `step` opens a timed window: the step after a search step, when no step of the
    /// window is checked (a check synchronises the host and would be timed too).
    fn opens_window(&self, step: u64) -> bool {
        let n = self.nstlist.max(2);
        step % n == 1 && (step..(step + n - 1).min(self.steps)).all(|s| !self.checks_step(s))
    }

    /// Whether `step` closes the window opened at `step - (nstlist - 2)` (or ends the run).
    fn closes_window(&self, step: u64) -> bool {
        let n = self.nstlist.max(2);
        step % n == n - 1 || step + 1 == self.steps
    }
}

/// Compares one rank's coordinates (all local atoms) and home forces with the references.
fn check_rank(domain: &Domain, r: usize, x: &[Float3], want_x: &[Float3], f: &[Float3], ref_f: &[[f64; 3]], step: u64) -> Result<StepCheck> {
    let mut c = StepCheck::default();
    for (i, (a, b)) in x.iter().zip(want_x).enumerate() {
        let same = a.x.to_bits() == b.x.to_bits() && a.y.to_bits() == b.y.to_bits() && a.z.to_bits() == b.z.to_bits();
        if !same {
            return Err(HaloError::InvalidInput(format!(
                "verification failed at step {step}: rank {r} local atom {i} (global {}) has coordinates {a:?} after the halo, the reference {b:?}",
                domain.ranks[r].global_ids[i]
            )));
        }
    }
    let home = domain.plan.ranks[r].home_atoms;
    let rms = (ref_f.iter().map(|v| v.iter().map(|c| c * c).sum::<f64>()).sum::<f64>() / ref_f.len().max(1) as f64).sqrt();
    for (i, a) in f[..home].iter().enumerate() {
        let g = domain.ranks[r].global_ids[i] as usize;
        let norm = ref_f[g].iter().map(|c| c * c).sum::<f64>().sqrt().max(rms).max(1e-12);
        for (u, v) in [(a.x, ref_f[g][0]), (a.y, ref_f[g][1]), (a.z, ref_f[g][2])] {
            let abs = (f64::from(u) - v).abs();
            let rel = abs / norm;
            if !rel.is_finite() || rel > FORCE_TOLERANCE {
                return Err(HaloError::InvalidInput(format!(
                    "verification failed at step {step}: rank {r} atom {g} has force {a:?}, the undecomposed reference {:?} \
                     (error {abs:.2e} kJ/mol/nm, {rel:.2e} of max(|F|, RMS force {rms:.1}))",
                    ref_f[g]
                )));
            }
            c.force_max_abs = c.force_max_abs.max(abs);
            c.force_max_rel = c.force_max_rel.max(rel);
        }
    }
    Ok(c)
}

/// Global positions from every rank's home coordinates.
fn scatter_home(domain: &Domain, homes: &[Vec<Float3>], out: &mut [Float3]) {
    for (r, h) in homes.iter().enumerate() {
        for (i, v) in h.iter().enumerate() {
            out[domain.ranks[r].global_ids[i] as usize] = *v;
        }
    }
}

/// All ranks in this process, rank `r` on GPU `r % modules.len()`.
pub fn run_local(cfg: &MdConfig, modules: &[Arc<KernelModule>], progress: impl FnMut(u64, &StepCheck)) -> Result<MdOutcome> {
    run(cfg, &Placement::Local(modules.to_vec()).with_policy(cfg.path_policy), progress)
}

/// One rank per NVSHMEM PE (started by `halo launch`, mpirun or srun), reaching peers as
/// `cfg.path_policy` says.
pub fn run_pe(cfg: &MdConfig, session: &PeSession, progress: impl FnMut(u64, &StepCheck)) -> Result<MdOutcome> {
    run(cfg, &Placement::pe(session, cfg.path_policy), progress)
}

/// The MD loop on the ranks `placement` puts in this process. Across PEs every PE runs it with the
/// same configuration: each builds the same decomposition, runs its rank, and gathers home atoms
/// through the launcher's rendezvous ([`Placement::all_gather`]) at search steps and checked steps.
pub fn run(cfg: &MdConfig, placement: &Placement, mut progress: impl FnMut(u64, &StepCheck)) -> Result<MdOutcome> {
    let mut system = MolecularSystem::generate(cfg.atoms, cfg.seed).map_err(|e| HaloError::InvalidInput(e.to_string()))?;
    let phys = cfg.physics(&system);
    let lj = system.lj_table_f32();
    let mut out = MdOutcome::default();
    let started = Instant::now();
    let mut state: Option<(Domain, Box<dyn Exchange>, Vec<MdRank>)> = None;
    let mut window: Option<u64> = None;
    // Routed paths (the default): a router with agreed failover; safe points at every search step,
    // every checked step and the end; a failure rolls back to the last search step.
    let mut routing = match cfg.path_policy {
        PathPolicy::Routed => Some(Routing::new(placement, cfg.grid.num_ranks(), &[])?),
        _ => None,
    };
    let mut rollback = Rollback::default();
    let mut step = 0u64;
    loop {
        let search = step % cfg.nstlist.max(1) == 0;
        let end = step == cfg.steps;
        if let (Some(r), Some((_, x, md))) = (routing.as_mut(), state.as_mut())
            && step > 0
            && (search || end)
        {
            // Safe point: the steps since the last search step are settled before anything of
            // them leaves the GPUs.
            settle(r, x.finish())?;
            for m in md.iter() {
                m.synchronize()?;
            }
            if r.safe_point()?.rerun {
                rollback.restore(&mut state, &mut system, &mut out, &mut step, &mut window)?;
                continue;
            }
        }
        if end {
            break;
        }
        if search {
            if let Some((domain, x, md)) = state.take() {
                // Gather home coordinates and velocities back into the system (a search step).
                let mut mine = Vec::with_capacity(md.len());
                for (rank, m) in x.local_ranks().iter().zip(&md) {
                    mine.push(vec![rank.x.to_host()?[..rank.halo().home_atoms].to_vec(), m.velocities()?]);
                }
                let all = gather(placement, &format!("rebuild-{step}"), mine)?;
                scatter_home(&domain, &all.iter().map(|p| p[0].clone()).collect::<Vec<_>>(), &mut system.positions);
                scatter_home(&domain, &all.iter().map(|p| p[1].clone()).collect::<Vec<_>>(), &mut system.velocities);
                drop((x, md)); // freed in the same order on every PE (collective)
            }
            if routing.is_some() {
                rollback.save(&system, &out, step);
            }
            let domain = Domain::build(&mut system, cfg.grid, cfg.list_cutoff())?;
            let mut x = match routing.as_mut() {
                Some(r) => {
                    r.plan::<Float3>(&domain.halos)?;
                    out.routes = r.local_summaries()?;
                    placement.exchange_planned::<Float3>(domain.halos.clone(), r.plans())?
                }
                None => placement.exchange::<Float3>(domain.halos.clone())?,
            };
            x.set_wait_timeout(cfg.wait_timeout);
            x.check_transport(cfg.transport)?;
            let homes = domain.home_values(&system.positions);
            let vels = domain.home_values(&system.velocities);
            let mut md = Vec::with_capacity(x.local_ranks().len());
            for rank in x.local_ranks() {
                let r = rank.rank();
                rank.upload_coordinates(&homes[r])?;
                md.push(MdRank::new(rank.module().clone(), &domain.ranks[r], homes[r].len(), &vels[r], &lj)?);
            }
            x.barrier()?; // every PE has its coordinates in place before any halo moves
            out.rebuilds += 1;
            out.pairs = domain.total_pairs;
            state = Some((domain, x, md));
        }
        let Some((domain, x, md)) = state.as_mut() else { unreachable!("built above") };
        if cfg.opens_window(step) {
            window = Some(step);
            md[0].mark_window_start()?;
        }
        // An injected failure (HALO_INJECT_FAILURE) skips this step's halo launches here.
        let injected = routing.as_ref().map_or_else(Vec::new, |r| r.injected(step));
        for (i, m) in md.iter().enumerate() {
            m.begin_step(&x.local_ranks()[i], &x.streams()[i], &phys)?;
        }
        if injected.is_empty() {
            launched(routing.as_mut(), x.exchange_forward(cfg.transport))?;
        }
        for (i, m) in md.iter().enumerate() {
            m.nonlocal_forces(&x.local_ranks()[i], &x.streams()[i], &phys)?;
        }
        if injected.is_empty() {
            launched(routing.as_mut(), x.exchange_reverse_accumulate(cfg.transport))?;
        }
        if let Some(r) = routing.as_mut() {
            for (rank, peers) in &injected {
                eprintln!("route: injected failure: rank {rank} skips step {step}'s halo towards {peers:?}");
                r.record_launch_failure(*rank, peers);
            }
        }
        if cfg.checks_step(step) {
            match routing.as_mut() {
                Some(r) => settle(r, x.finish())?,
                None => x.finish()?,
            }
            for m in md.iter() {
                m.synchronize()?;
            }
            // A safe point before the check: a failure anywhere means this window runs again.
            if let Some(r) = routing.as_mut()
                && r.safe_point()?.rerun
            {
                rollback.restore(&mut state, &mut system, &mut out, &mut step, &mut window)?;
                continue;
            }
            let c = check_step(cfg, placement, &mut system, domain, x.as_ref(), step)?;
            out.worst.merge(c);
            out.checked_steps += 1;
            progress(step, &c);
            x.barrier()?; // no PE overwrites a halo that another is still checking
        }
        for (i, m) in md.iter().enumerate() {
            m.integrate(&x.local_ranks()[i], &x.streams()[i], &phys)?;
        }
        if let Some(first) = window.filter(|_| cfg.closes_window(step)) {
            md[0].mark_window_end()?;
            out.window_step_us.push(f64::from(md[0].window_ms()?) * 1e3 / (step + 1 - first) as f64);
            window = None;
        }
        out.steps += 1;
        step += 1;
    }
    if let Some((_, mut x, md)) = state {
        x.finish()?;
        for m in &md {
            m.synchronize()?;
        }
        x.barrier()?;
    }
    out.wall = started.elapsed();
    Ok(out)
}

/// A failed halo launch under routing is recorded for the next safe point (the window then runs
/// again on the agreed paths); without routing it ends the run.
fn launched(routing: Option<&mut Routing>, result: Result<()>) -> Result<()> {
    match (result, routing) {
        (Err(e), Some(r)) => {
            r.record_failed_launch(&e);
            Ok(())
        }
        (result, _) => result,
    }
}

/// A failed finish under routing: a device wait timeout is recorded for the next safe point (the
/// window then runs again); any other error ends the run.
fn settle(routing: &mut Routing, finished: Result<()>) -> Result<()> {
    match finished {
        Err(e) if !routing.record_error(&e) => Err(e),
        _ => Ok(()),
    }
}

/// The state at the last search step (positions, velocities, outcome so far): what a safe point
/// that found a failure rolls back to, on every PE alike.
#[derive(Default)]
struct Rollback {
    saved: Option<(Vec<Float3>, Vec<Float3>, MdOutcome, u64)>,
    attempts: u32,
}

impl Rollback {
    fn save(&mut self, system: &MolecularSystem, out: &MdOutcome, step: u64) {
        if self.saved.as_ref().is_some_and(|s| s.3 != step) {
            self.attempts = 0; // a new window
        }
        self.saved = Some((system.positions.clone(), system.velocities.clone(), out.clone(), step));
    }

    /// Drops the exchange (collectively) and puts the run back to the last search step.
    fn restore(
        &mut self,
        state: &mut Option<(Domain, Box<dyn Exchange>, Vec<MdRank>)>,
        system: &mut MolecularSystem,
        out: &mut MdOutcome,
        step: &mut u64,
        window: &mut Option<u64>,
    ) -> Result<()> {
        let (pos, vel, saved, at) = self.saved.clone().ok_or_else(|| HaloError::InvalidInput("a safe point before any state was saved".into()))?;
        self.attempts += 1;
        if self.attempts > crate::exchange::routing::MAX_RERUNS {
            return Err(HaloError::InvalidInput(format!(
                "steps {at}..{} failed {} times in a row after agreed failovers; giving up",
                *step,
                self.attempts
            )));
        }
        eprintln!("route: a safe point before step {} found a failure; running again from step {at} with the agreed paths", *step);
        // Every PE is alive and idle at a safe point: reset the failed exchange together
        // (collective, fenced by barriers), then drop it as a healthy one (its symmetric buffers
        // are freed in the same order on every PE).
        if let Some((_, mut x, md)) = state.take() {
            x.reset_protocol()?;
            drop((x, md));
        }
        system.positions = pos;
        system.velocities = vel;
        let reruns = out.reruns + 1;
        *out = MdOutcome { reruns, ..saved };
        *step = at;
        *window = None;
        Ok(())
    }
}

/// A checked step, after the exchange finished: every rank's coordinates against the exchange's
/// reference, its home forces against the undecomposed system, and the cross-rank integrity
/// checksums (only checksum words cross between PEs).
fn check_step(cfg: &MdConfig, placement: &Placement, system: &mut MolecularSystem, domain: &Domain, x: &dyn Exchange, step: u64) -> Result<StepCheck> {
    let ids: Vec<usize> = x.local_ranks().iter().map(RankExchange::rank).collect();
    let (xs, fs) = (x.read_forward()?, x.read_reverse()?);
    let mine = xs.iter().zip(&ids).map(|(v, &r)| vec![v[..domain.halos[r].home_atoms].to_vec()]).collect();
    let homes: Vec<Vec<Float3>> = gather(placement, &format!("check-{step}"), mine)?.into_iter().map(|mut p| p.swap_remove(0)).collect();
    let want = reference::coordinates(&domain.halos, &homes);
    scatter_home(domain, &homes, &mut system.positions);
    let ref_f = md_reference::lj_forces(system, cfg.cutoff).map_err(|e| HaloError::InvalidInput(e.to_string()))?;
    let mut c = StepCheck::default();
    for (i, &r) in ids.iter().enumerate() {
        c.merge(check_rank(domain, r, &xs[i], &want[r], &fs[i], &ref_f, step)?);
    }
    // Cross-rank integrity: both ends of every pulse agree on what moved.
    let words = ids
        .iter()
        .enumerate()
        .map(|(i, &r)| {
            let sums = RankChecksums::compute(r, &domain.halos[r], &domain.ranks[r].global_ids, &xs[i], &fs[i])?;
            Ok(sums.to_words().iter().flat_map(|w| w.to_le_bytes()).collect())
        })
        .collect::<Result<Vec<Vec<u8>>, integrity::IntegrityError>>()
        .map_err(|e| HaloError::InvalidInput(format!("step {step}: {e}")))?;
    let all = placement.all_gather(&format!("integrity-{step}"), words)?;
    let sums = all
        .iter()
        .enumerate()
        .map(|(r, b)| RankChecksums::from_words(r, &b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect::<Vec<_>>()))
        .collect::<Result<Vec<_>, _>>()
        .and_then(|sums| integrity::compare_across_ranks(&domain.halos, &sums));
    sums.map_err(|e| HaloError::InvalidInput(format!("step {step}: {e}")))?;
    Ok(c)
}

/// Every rank's arrays (the same count per rank, any lengths) from each local rank's `mine`:
/// serialised and gathered across PEs ([`Placement::all_gather`]), as they are in one process.
fn gather(placement: &Placement, tag: &str, mine: Vec<Vec<Vec<Float3>>>) -> Result<Vec<Vec<Vec<Float3>>>> {
    let count = mine.first().map_or(0, Vec::len);
    let bytes = mine
        .iter()
        .map(|arrays| {
            let mut b = Vec::new();
            for a in arrays {
                b.extend_from_slice(&(a.len() as u64).to_le_bytes());
                b.extend_from_slice(bytemuck::cast_slice(a));
            }
            b
        })
        .collect();
    let all = placement.all_gather(tag, bytes)?;
    all.iter()
        .map(|b| {
            let mut arrays = Vec::with_capacity(count);
            let mut at = 0usize;
            for _ in 0..count {
                let len = b.get(at..at + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap_or_default()) as usize);
                let len = len.ok_or_else(|| HaloError::InvalidInput("truncated gather".into()))?;
                at += 8;
                let raw = b.get(at..at + 12 * len).ok_or_else(|| HaloError::InvalidInput("truncated gather".into()))?;
                arrays.push(bytemuck::pod_collect_to_vec::<u8, Float3>(raw));
                at += 12 * len;
            }
            Ok(arrays)
        })
        .collect()
}
