//! One step of any method on the ranks of this process, and the checked step: shared by
//! `halo bench` (which times steps and checks every variant once its timed loops are done) and
//! `halo exchange-check` (which checks step after step), so both run exactly the same code.
//!
//! A checked step writes fresh random coordinates and forces (and poisons the halo with NaN),
//! runs one full step of the method — enqueued, or as one replay of the captured step — waits,
//! reads every local rank back and compares with the CPU reference: coordinates bit for bit,
//! forces within 1e-5 of max(|reference|, 1). Under a launcher every PE runs it together (host
//! barriers around the data), each checking its own rank against the reference of all ranks
//! (the data is a function of the seed, so every PE knows every rank's inputs).

use super::Method;
use super::graph::{Phase, PhaseGraphs};
use super::nccl::{self, NcclComms};
use crate::abi::Float3;
use crate::error::{CudaContextExt, HaloError, Result};
use crate::exchange::{Exchange, RankHalo, reference, synthetic};
use crate::gpu::DeviceMemory;

/// A method's exchange on the ranks of this process, and NCCL when the method is NCCL.
pub struct Stepper {
    /// The exchange (its buffers serve NCCL as well).
    pub x: Box<dyn Exchange>,
    /// NCCL, for the NCCL method.
    pub nccl: Option<NcclComms>,
}

impl Stepper {
    /// An exchange, with NCCL when `method` needs it.
    pub fn new(x: Box<dyn Exchange>, nccl: Option<NcclComms>) -> Self {
        Self { x, nccl }
    }

    fn nccl(&self) -> Result<&NcclComms> {
        self.nccl.as_ref().ok_or_else(|| HaloError::InvalidInput("NCCL is not set up".into()))
    }

    /// Enqueues (GPU-initiated, direct-copy, NCCL) or runs (staged) `steps` steps of `phase`.
    pub fn enqueue(&mut self, method: Method, phase: Phase, steps: usize) -> Result<()> {
        let Some(transport) = method.transport() else {
            let (api, comms) = self.nccl()?;
            let io: Vec<_> = self.x.local_ranks().iter().zip(comms.iter()).zip(self.x.streams()).map(|((rank, c), s)| (rank, c, s)).collect();
            return nccl::enqueue(api, &io, phase, steps);
        };
        phase.repeat(steps, |forces| if forces { self.x.exchange_reverse_accumulate(transport) } else { self.x.exchange_forward(transport) })
    }

    /// One step of every phase of every local rank captured as graphs (`graphs[rank]`).
    pub fn capture(&mut self, method: Method) -> Result<Vec<PhaseGraphs>> {
        if !method.capturable() {
            return Err(HaloError::InvalidInput(format!("the {} method is host-driven and cannot be captured", method.name())));
        }
        let Some(transport) = method.transport() else {
            let (api, comms) = self.nccl()?;
            let io: Vec<_> = self.x.local_ranks().iter().zip(comms.iter()).zip(self.x.streams()).map(|((rank, c), s)| (rank, c, s)).collect();
            // Phase-major from the captures, rank-major for the caller.
            let mut per_rank: Vec<Vec<_>> = (0..io.len()).map(|_| Vec::new()).collect();
            for phase in Phase::ALL {
                for (r, g) in nccl::capture(api, &io, phase)?.into_iter().enumerate() {
                    per_rank[r].push(g);
                }
            }
            return Ok(per_rank.into_iter().map(|graphs| PhaseGraphs { graphs }).collect());
        };
        self.x.check_transport(transport)?;
        let streams = self.x.streams().to_vec();
        self.x.local_ranks_mut().iter_mut().zip(&streams).map(|(rank, s)| PhaseGraphs::capture(rank, s, transport)).collect()
    }

    /// Replays `steps` captured steps of `phase`, every local rank's graph once per step.
    pub fn replay(graphs: &[PhaseGraphs], phase: Phase, steps: usize) -> Result<()> {
        for _ in 0..steps {
            for g in graphs {
                g.get(phase).launch().during("replaying a captured step")?;
            }
        }
        Ok(())
    }

    /// One checked full step (see the module docs) with data from `seed`: enqueued, or replayed
    /// from `graphs`. `Ok(Ok(largest force error))`, `Ok(Err(the first wrong value))`, or an
    /// error when the step itself failed.
    pub fn checked_step(&mut self, method: Method, graphs: Option<&[PhaseGraphs]>, halos: &[RankHalo], seed: u64) -> Result<Checked> {
        let (home, forces) = check_inputs(halos, seed);
        self.fill(&home, &forces)?;
        match graphs {
            Some(g) => Self::replay(g, Phase::Step, 1)?,
            None => self.enqueue(method, Phase::Step, 1)?,
        }
        self.compare_step(halos, &home, &forces)
    }

    /// Waits for the exchange, then writes `home` coordinates (halo poisoned with NaN) and
    /// `forces` into every local rank; returns once every PE has its inputs in place.
    pub fn fill(&mut self, home: &[Vec<Float3>], forces: &[Vec<Float3>]) -> Result<()> {
        self.x.finish()?;
        self.upload(home, forces)
    }

    /// [`Self::fill`] without the wait (the caller waited for the exchange already): the inputs
    /// written between two barriers, so no PE writes before every PE is idle, and none exchanges
    /// before every PE's inputs are in place.
    pub fn upload(&mut self, home: &[Vec<Float3>], forces: &[Vec<Float3>]) -> Result<()> {
        upload(self.x.as_ref(), home, forces)
    }

    /// Waits for the step, then compares every local rank with the CPU reference of the inputs
    /// [`Self::fill`] wrote. Ends with a barrier that every PE reaches whatever it found, so no
    /// PE overwrites a halo another is still reading and the collectives stay in step.
    pub fn compare_step(&mut self, halos: &[RankHalo], home: &[Vec<Float3>], forces: &[Vec<Float3>]) -> Result<Checked> {
        compare_step(self.x.as_mut(), halos, home, forces)
    }
}

/// Waits for `x`, then compares every local rank's coordinates (home and halo) with the CPU
/// reference of `home`: what any number of coordinate exchanges after [`upload`] of `home` must
/// leave (the halo is a function of the home atoms alone). Forces are not compared (a loop of
/// steps accumulates them). Ends with a barrier every PE reaches, as [`compare_step`].
pub fn compare_coordinates(x: &mut dyn Exchange, halos: &[RankHalo], home: &[Vec<Float3>]) -> Result<Checked> {
    let outcome = (|| -> Result<Checked> {
        x.finish()?;
        let want_x = reference::coordinates(halos, home);
        let xs = x.read_forward()?;
        for (i, rank) in x.local_ranks().iter().enumerate() {
            let r = rank.rank();
            if let Err(why) = compare(r, &xs[i], Some(&want_x[r]), &[], None) {
                return Ok(Err(why));
            }
        }
        Ok(Ok(0.0))
    })();
    x.barrier()?;
    outcome
}

/// The inputs of a checked step written into every local rank of `x` between two barriers (so no
/// PE writes before every PE is idle, and none exchanges before every PE's inputs are in place):
/// the halo poisoned with NaN, `home` coordinates, `forces` (halo entries included).
pub fn upload(x: &dyn Exchange, home: &[Vec<Float3>], forces: &[Vec<Float3>]) -> Result<()> {
    x.barrier()?;
    for rank in x.local_ranks() {
        rank.x.fill_bytes(0xFF)?;
        rank.upload_coordinates(&home[rank.rank()])?;
        rank.f.copy_from_host(&forces[rank.rank()])?;
    }
    x.barrier()
}

/// Waits for `x`, then compares every local rank with the CPU reference of the inputs [`upload`]
/// wrote. Ends with a barrier that every PE reaches whatever it found, so no PE overwrites a halo
/// another is still reading and the collectives stay in step.
pub fn compare_step(x: &mut dyn Exchange, halos: &[RankHalo], home: &[Vec<Float3>], forces: &[Vec<Float3>]) -> Result<Checked> {
    let outcome = (|| -> Result<Checked> {
        x.finish()?;
        let (want_x, want_f) = (reference::coordinates(halos, home), reference::forces(halos, forces));
        let (xs, fs) = (x.read_forward()?, x.read_reverse()?);
        let mut worst = 0.0f64;
        for (i, rank) in x.local_ranks().iter().enumerate() {
            let r = rank.rank();
            match compare(r, &xs[i], Some(&want_x[r]), &fs[i], Some(&want_f[r])) {
                Ok(w) => worst = worst.max(w),
                Err(why) => return Ok(Err(why)),
            }
        }
        Ok(Ok(worst))
    })();
    // Every PE reaches this barrier, whatever its outcome: the collectives stay in step.
    x.barrier()?;
    outcome
}

/// The inputs of the checked step of `seed`: home coordinates and forces (halo entries included),
/// random values in [-5, 5) as the GPU exchange tests use, a function of the seed alone (so every
/// PE knows every rank's inputs).
pub fn check_inputs(halos: &[RankHalo], seed: u64) -> (Vec<Vec<Float3>>, Vec<Vec<Float3>>) {
    (
        synthetic::random_values(halos, seed.wrapping_mul(1_000_003), true),
        synthetic::random_values(halos, seed.wrapping_mul(7_000_003).wrapping_add(1), false),
    )
}

/// One checked full step on `x` made by `step` (coordinates out, forces back, on every local rank):
/// fresh inputs from `seed` ([`check_inputs`]), the step, the comparison with the CPU reference.
/// For the commands that time steps their own way (`calibrate`, `timeline`).
pub fn checked_step_with(x: &mut dyn Exchange, halos: &[RankHalo], seed: u64, step: impl FnOnce(&mut dyn Exchange) -> Result<()>) -> Result<Checked> {
    let (home, forces) = check_inputs(halos, seed);
    x.finish()?;
    upload(x, &home, &forces)?;
    step(x)?;
    compare_step(x, halos, &home, &forces)
}

/// Every process's verdict on one check, agreed through `placement` (collective: every process
/// calls it with the same `tag`): the first failure any rank saw, or the largest force error.
pub fn agree(placement: &crate::exchange::Placement, tag: &str, mine: &Checked) -> Result<Checked> {
    let bytes = serde_json::to_vec(mine).map_err(|e| HaloError::InvalidInput(format!("encoding a check's verdict: {e}")))?;
    let all = placement.all_gather(tag, vec![bytes])?;
    let mut worst = 0.0f64;
    for b in &all {
        let v: Checked = serde_json::from_slice(b).map_err(|e| HaloError::InvalidInput(format!("a process's check verdict does not parse: {e}")))?;
        match v {
            Ok(w) => worst = worst.max(w),
            Err(why) => return Ok(Err(why)),
        }
    }
    Ok(Ok(worst))
}

/// A checked step's verdict: the largest force error, or what was wrong.
pub type Checked = std::result::Result<f64, String>;

/// Largest force error of one rank (relative to max(|reference|, 1): accumulated sums of O(1)
/// terms may cancel, so their rounding is measured against the terms' scale), or a message naming
/// the first coordinate or force that differs. Only what was exchanged is compared (`None`: that
/// direction did not run, e.g. `exchange-check --phase x`).
pub fn compare(rank: usize, x: &[Float3], want_x: Option<&[Float3]>, f: &[Float3], want_f: Option<&[Float3]>) -> std::result::Result<f64, String> {
    let same = |a: &Float3, b: &Float3| a.x.to_bits() == b.x.to_bits() && a.y.to_bits() == b.y.to_bits() && a.z.to_bits() == b.z.to_bits();
    for (what, got, want) in [("coordinates", x.len(), want_x.map(<[_]>::len)), ("forces", f.len(), want_f.map(<[_]>::len))] {
        if let Some(n) = want.filter(|&n| n != got) {
            return Err(format!("rank {rank}: {got} {what} read back, the CPU reference has {n}"));
        }
    }
    let (want_x, want_f) = (want_x.unwrap_or_default(), want_f.unwrap_or_default());
    if let Some(i) = (0..want_x.len()).find(|&i| !same(&x[i], &want_x[i])) {
        return Err(format!("rank {rank}: coordinate of atom {i} is {:?}, the CPU reference says {:?}", x[i], want_x[i]));
    }
    let mut worst = 0.0f64;
    for (i, (a, b)) in f.iter().zip(want_f).enumerate() {
        for (u, v) in [(a.x, b.x), (a.y, b.y), (a.z, b.z)] {
            let err = ((u - v).abs() as f64) / (v.abs() as f64).max(1.0);
            if !err.is_finite() || err > 1e-5 {
                return Err(format!("rank {rank}: force of atom {i} is {a:?}, the CPU reference says {b:?}"));
            }
            worst = worst.max(err);
        }
    }
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_names_the_first_wrong_value() {
        let x = vec![Float3::new(1.0, 2.0, 3.0), Float3::new(4.0, 5.0, 6.0)];
        let f = vec![Float3::new(0.5, -1.0, 100.0); 2];
        let both = |x: &[Float3], f: &[Float3], want_x: &[Float3], want_f: &[Float3]| compare(3, x, Some(want_x), f, Some(want_f));
        assert_eq!(both(&x, &f, &x, &f), Ok(0.0));
        let mut bad = x.clone();
        bad[1].y = f32::NAN;
        let e = both(&bad, &f, &x, &f).unwrap_err();
        assert!(e.contains("rank 3") && e.contains("atom 1"), "{e}");
        // A NaN where the reference holds a value: the halo never arrived.
        let mut g = f.clone();
        g[0].x = f32::NAN;
        assert!(both(&x, &g, &x, &f).unwrap_err().contains("force of atom 0"));
        // Rounding within 1e-5 of the terms' scale passes and is reported.
        let mut g = f.clone();
        g[1].z = 100.0 + 1e-4;
        let worst = both(&x, &g, &x, &f).unwrap();
        assert!(worst > 0.0 && worst < 1e-5, "{worst}");
        assert!(both(&x[..1], &f, &x, &f).unwrap_err().contains("1 coordinates read back, the CPU reference has 2"));
        // A direction that did not run is not compared (its buffer holds the inputs).
        assert_eq!(compare(0, &bad, None, &f, Some(&f)), Ok(0.0), "forces only");
        assert_eq!(compare(0, &x, Some(&x), &g[..1], None), Ok(0.0), "coordinates only");
        assert!(compare(0, &bad, Some(&x), &f, None).is_err());
    }
}
