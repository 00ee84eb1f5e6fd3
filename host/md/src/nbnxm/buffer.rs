//! List lifetimes and the Verlet buffers chosen for them.
//!
//! The rule (documented in `docs/nbnxm.md`): during a list's lifetime of `n` steps, an atom pair
//! that was beyond `rc + b` at the search must not come within `rc`, except with a small expected
//! number of such pairs per atom. Model, as GROMACS's buffer estimate: atoms fly ballistically at
//! the temperature's Maxwell–Boltzmann speeds (which overestimates motion in a liquid), so the
//! radial component of a pair's relative displacement after `t = n dt` is Gaussian with
//! `σ = t sqrt(kT (1/m_i + 1/m_j))`, taken for the lightest pair (conservative); pair partners are
//! spread uniformly at the system's density `ρ`. The expected number of pairs per atom that start
//! beyond `rc + b` and end within `rc` is then
//!
//! `N(b) = (ρ / 2) ∫_{rc+b}^∞ 4π r² Q((r - rc) / σ) dr = 2πρ ∫_b^∞ φ_σ(t) ((rc + t)³ - (rc + b)³) / 3 dt`
//!
//! (`Q` the normal tail, `φ_σ` the normal density; the second form, from swapping the integrals,
//! needs only `exp`). The buffer is the smallest `b` with `N(b) <= tolerance`.
//!
//! Two lists, as GROMACS on GPUs: the outer list, searched on the host every `nstlist` steps with
//! `rlist = rc + b(nstlist)`, and an inner list pruned from it on the GPU every `nstprune` steps
//! with `rlist_inner = rc + b(nstprune)`. The force kernels run on the inner list. The halo must
//! cover the outer `rlist`.

use super::NbnxmError;
use crate::system::{BOLTZMANN, MolecularSystem, TEMPERATURE};

/// The motion model behind the buffer rule (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BufferModel {
    /// Temperature (K).
    pub temperature: f64,
    /// Mass of the lightest atom (g/mol).
    pub min_mass: f64,
    /// Atoms per nm³.
    pub density: f64,
    /// Time step (ps).
    pub dt: f64,
}

impl BufferModel {
    /// The model of a generated system at [`TEMPERATURE`].
    pub fn for_system(system: &MolecularSystem, dt: f64) -> Self {
        let min_mass = system.types.iter().map(|&t| system.atom_types[usize::from(t)].mass).fold(f64::INFINITY, f64::min);
        Self { temperature: TEMPERATURE, min_mass, density: system.density(), dt }
    }

    /// `σ` of the radial relative displacement of the lightest pair after `steps` steps (nm).
    pub fn sigma(&self, steps: u32) -> f64 {
        f64::from(steps) * self.dt * (2.0 * BOLTZMANN * self.temperature / self.min_mass).sqrt()
    }

    /// `N(b)`: expected pairs per atom that start beyond `cutoff + buffer` and end within
    /// `cutoff` after `steps` steps.
    pub fn missed_pairs_per_atom(&self, cutoff: f64, buffer: f64, steps: u32) -> f64 {
        let sigma = self.sigma(steps);
        if !(sigma > 0.0) {
            return 0.0;
        }
        let outer3 = (cutoff + buffer).powi(3);
        let density = |t: f64| (-0.5 * (t / sigma).powi(2)).exp() / (sigma * std::f64::consts::TAU.sqrt());
        let integrand = |t: f64| density(t) * ((cutoff + t).powi(3) - outer3) / 3.0;
        // Simpson's rule over [b, b + 12 σ]: the normal density is below 1e-31 of its peak beyond.
        let n = 4000;
        let h = 12.0 * sigma / f64::from(n);
        let mut s = integrand(buffer) + integrand(buffer + 12.0 * sigma);
        for i in 1..n {
            s += integrand(buffer + f64::from(i) * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        std::f64::consts::TAU * self.density * s * h / 3.0
    }

    /// The smallest buffer (nm, rounded up to 0.1 pm) with at most `tolerance` expected missed
    /// pairs per atom over `steps` steps.
    pub fn buffer_for(&self, cutoff: f64, steps: u32, tolerance: f64) -> f64 {
        let (mut lo, mut hi) = (0.0, 20.0 * self.sigma(steps) + 1e-4);
        if self.missed_pairs_per_atom(cutoff, 0.0, steps) <= tolerance {
            return 0.0;
        }
        while hi - lo > 1e-5 {
            let mid = 0.5 * (lo + hi);
            if self.missed_pairs_per_atom(cutoff, mid, steps) <= tolerance { hi = mid } else { lo = mid }
        }
        (hi * 1e4).ceil() / 1e4
    }
}

/// Cutoffs and list lifetimes of one run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ListSetup {
    /// Interaction cutoff (nm); the potential is shifted to zero there.
    pub cutoff: f32,
    /// Steps between host searches (the outer list's lifetime).
    pub nstlist: u32,
    /// Outer list cutoff (nm); also the halo's cutoff.
    pub rlist: f32,
    /// Steps between GPU prunes of the inner list (the first one at the search step).
    pub nstprune: u32,
    /// Inner list cutoff (nm).
    pub rlist_inner: f32,
}

impl ListSetup {
    /// Explicit cutoffs; checks `0 < cutoff <= rlist_inner <= rlist` and
    /// `1 <= nstprune <= nstlist`.
    pub fn new(cutoff: f32, nstlist: u32, rlist: f32, nstprune: u32, rlist_inner: f32) -> Result<Self, NbnxmError> {
        let bad = |m: String| Err(NbnxmError::Setup(m));
        if !(cutoff.is_finite() && cutoff > 0.0) {
            return bad(format!("cutoff {cutoff} nm must be positive"));
        }
        if !(rlist_inner.is_finite() && rlist.is_finite() && cutoff <= rlist_inner && rlist_inner <= rlist) {
            return bad(format!("need cutoff {cutoff} <= inner list cutoff {rlist_inner} <= list cutoff {rlist} (nm)"));
        }
        if nstlist == 0 || nstprune == 0 || nstprune > nstlist {
            return bad(format!("need 1 <= nstprune ({nstprune}) <= nstlist ({nstlist})"));
        }
        Ok(Self { cutoff, nstlist, rlist, nstprune, rlist_inner })
    }

    /// Buffers by the rule of the module docs for `system` at time step `dt` (ps), with at most
    /// `tolerance` expected missed pairs per atom per list lifetime, for both lists. Checks that
    /// `rlist` stays below half the box.
    pub fn for_system(system: &MolecularSystem, cutoff: f32, dt: f32, nstlist: u32, nstprune: u32, tolerance: f64) -> Result<Self, NbnxmError> {
        if !(dt.is_finite() && dt > 0.0 && tolerance.is_finite() && tolerance > 0.0) {
            return Err(NbnxmError::Setup(format!("time step {dt} ps and tolerance {tolerance} must be positive")));
        }
        let model = BufferModel::for_system(system, f64::from(dt));
        let rc = f64::from(cutoff);
        let outer = cutoff + model.buffer_for(rc, nstlist, tolerance) as f32;
        let inner = cutoff + model.buffer_for(rc, nstprune.min(nstlist), tolerance) as f32;
        let setup = Self::new(cutoff, nstlist, outer, nstprune, inner.min(outer))?;
        let half = system.box_size.iter().fold(f32::INFINITY, |a, &b| a.min(b)) / 2.0;
        if setup.rlist >= half {
            return Err(NbnxmError::Setup(format!(
                "list cutoff {:.3} nm (cutoff {cutoff} + buffer for {nstlist} steps) is not below half the box ({half:.3} nm): \
                 use a shorter nstlist, a smaller cutoff or more atoms",
                setup.rlist
            )));
        }
        Ok(setup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> BufferModel {
        BufferModel { temperature: 300.0, min_mass: 14.027, density: 100.0, dt: 0.002 }
    }

    #[test]
    fn the_integral_matches_its_first_form() {
        // N(b) = 2πρ ∫_b^∞ (rc + u)² Q(u / σ) du, with Q by direct quadrature of the density.
        let m = model();
        let (rc, b, steps) = (1.0, 0.05, 20);
        let sigma = m.sigma(steps);
        let q = |x: f64| {
            let n = 2000;
            let h = 12.0 / f64::from(n);
            (0..n).map(|i| x + (f64::from(i) + 0.5) * h).map(|t| (-0.5 * t * t).exp()).sum::<f64>() * h / std::f64::consts::TAU.sqrt()
        };
        let n = 2000;
        let h = 12.0 * sigma / f64::from(n);
        let first: f64 = (0..n).map(|i| b + (f64::from(i) + 0.5) * h).map(|u| (rc + u).powi(2) * q(u / sigma)).sum::<f64>() * h;
        let first = std::f64::consts::TAU * m.density * first;
        let second = m.missed_pairs_per_atom(rc, b, steps);
        assert!((first - second).abs() < 1e-3 * second, "{first} vs {second}");
    }

    #[test]
    fn buffers_grow_with_the_lifetime_and_meet_the_tolerance() {
        let m = model();
        let mut last = 0.0;
        for steps in [1, 10, 50, 100] {
            let b = m.buffer_for(1.0, steps, 1e-3);
            assert!(b > last, "{steps}: {b}");
            assert!(m.missed_pairs_per_atom(1.0, b, steps) <= 1e-3);
            assert!(m.missed_pairs_per_atom(1.0, b - 2e-4, steps) > 1e-3, "{steps}: not the smallest");
            last = b;
        }
    }

    #[test]
    fn bad_setups_are_refused() {
        assert!(ListSetup::new(1.0, 10, 0.9, 5, 0.95).is_err());
        assert!(ListSetup::new(1.0, 10, 1.2, 20, 1.1).is_err());
        assert!(ListSetup::new(1.0, 10, 1.2, 0, 1.1).is_err());
        assert!(ListSetup::new(1.0, 10, 1.2, 10, 1.2).is_ok());
        let s = MolecularSystem::generate(500, 1).unwrap();
        let e = ListSetup::for_system(&s, 0.7, 0.002, 100, 10, 1e-3).unwrap_err();
        assert!(e.to_string().contains("half the box"), "{e}");
    }
}
