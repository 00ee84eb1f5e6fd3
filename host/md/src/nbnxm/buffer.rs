//! List lifetimes and the Verlet buffers chosen for them: an estimate of the energy drift that the
//! pairs missed by a list would cause, in the spirit of GROMACS's `verlet-buffer-tolerance`
//! (derived here from the physics; see `docs/nbnxm.md`).
//!
//! A list built with cutoff `rl = rc + b` is used for `n` steps. A pair that was beyond `rl` at
//! the search and comes within `rc` before the next search interacts but is not computed: the
//! step misses its energy `V(r) - V(rc)` (the potential is shifted to zero at `rc`). Model:
//! - atoms fly ballistically at the temperature's Maxwell–Boltzmann speeds (an overestimate in a
//!   liquid), so after `t` the radial component of a pair's relative displacement is Gaussian with
//!   variance `s² = kT t² (1/m_a + 1/m_b)`; `t = (n - 1) dt`, the last step that uses the list;
//! - partners are spread uniformly at the density of their type (`g(r) = 1` beyond the cutoff);
//! - near `rc` the shifted potential is its Taylor polynomial: at depth `x = rc - r` inside the
//!   cutoff, `|V(r) - V(rc)| <= A1 x + A2 x² + A3 x³` with `A1 = |V'(rc)|`, `A2 = |V''(rc)| / 2`,
//!   `A3 = |V'''(rc)| / 6` (absolute values: terms of either sign count as error).
//!
//! The expected missed energy per atom of type `a` from partners of type `b` at the list's last
//! step is then
//!
//! `E_ab = 4π ρ_b ∫_rl^∞ r0² dr0 ∫_0^∞ φ_s(r0 - rc + x) P(x) dx`,  `P(x) = A1 x + A2 x² + A3 x³`
//!
//! (`φ_s` the normal density). With `y = (r0 - rl) + x` the inner integral over `x ∈ [0, y]` is a
//! polynomial `G(y)` (done exactly below), leaving one smooth integral
//! `E_ab = 4π ρ_b ∫_0^∞ φ_s(b + y) G(y) dy`, computed numerically. The drift is the energy missed
//! per atom, summed over type pairs (each pair once: a factor 1/2), divided by the list period
//! `n dt`: kJ/mol/ps per atom, GROMACS's unit. The buffer is the smallest `b` (rounded up to
//! 0.1 pm) whose drift is at most the tolerance ([`DEFAULT_DRIFT_TOLERANCE`], GROMACS's default).
//!
//! Two lists, as GROMACS's dual pair list on GPUs: the outer list, searched every `nstlist` steps
//! with `rlist = rc + b(nstlist)` (also the halo's cutoff), and an inner list pruned from it on
//! the GPU every `nstprune` steps with `rlist_inner = rc + b(nstprune)`, both buffers for the same
//! tolerance over their own lifetimes. The force kernels run on the inner list.

use super::NbnxmError;
use crate::system::{BOLTZMANN, MolecularSystem, TEMPERATURE};

/// GROMACS's default `verlet-buffer-tolerance`: 0.005 kJ/mol/ps per atom.
pub const DEFAULT_DRIFT_TOLERANCE: f64 = 0.005;

/// One atom type as the buffer estimate sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BufferType {
    /// Fraction of the atoms that have this type.
    pub fraction: f64,
    /// Mass (g/mol).
    pub mass: f64,
}

/// The physical inputs of the buffer estimate (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct BufferModel {
    /// Temperature (K).
    pub temperature: f64,
    /// Atoms per nm³.
    pub density: f64,
    /// Time step (ps).
    pub dt: f64,
    /// The atom types.
    pub types: Vec<BufferType>,
    /// `(c6, c12)` of type pair `a * types.len() + b` (`V = c12 / r¹² - c6 / r⁶`).
    pub lj: Vec<(f64, f64)>,
}

/// `|V'|`, `|V''| / 2`, `|V'''| / 6` of `V = c12 / r¹² - c6 / r⁶` at `r`.
pub fn lj_taylor_coefficients(c6: f64, c12: f64, r: f64) -> [f64; 3] {
    let d1 = -12.0 * c12 * r.powi(-13) + 6.0 * c6 * r.powi(-7);
    let d2 = 156.0 * c12 * r.powi(-14) - 42.0 * c6 * r.powi(-8);
    let d3 = -2184.0 * c12 * r.powi(-15) + 336.0 * c6 * r.powi(-9);
    [d1.abs(), d2.abs() / 2.0, d3.abs() / 6.0]
}

/// `G(y) = ∫_0^y (rl + y - x)² P(x) dx` for `P(x) = Σ_k a[k] x^(k+1)`.
fn inner_polynomial(a: &[f64; 3], rl: f64, y: f64) -> f64 {
    // (rl + y - x)² = R² - 2 R x + x² with R = rl + y; ∫_0^y x^m dx = y^(m+1) / (m + 1).
    let r = rl + y;
    let mut g = 0.0;
    for (k, &ak) in a.iter().enumerate() {
        let m = (k + 1) as i32;
        let p = |e: i32| y.powi(e + 1) / f64::from(e + 1);
        g += ak * (r * r * p(m) - 2.0 * r * p(m + 1) + p(m + 2));
    }
    g
}

impl BufferModel {
    /// The model of `system` at [`TEMPERATURE`] and time step `dt` (ps): its density, type
    /// fractions, masses and Lorentz–Berthelot pair coefficients ([`MolecularSystem::lj_pair`]).
    pub fn for_system(system: &MolecularSystem, dt: f64) -> Self {
        let n = system.atom_types.len();
        let mut count = vec![0usize; n];
        for &t in &system.types {
            count[usize::from(t)] += 1;
        }
        let total = system.len().max(1) as f64;
        let types = system.atom_types.iter().zip(&count).map(|(t, &c)| BufferType { fraction: c as f64 / total, mass: t.mass }).collect();
        let lj = (0..n * n).map(|k| system.lj_pair(k / n, k % n)).map(|p| (p.c6, p.c12)).collect();
        Self { temperature: TEMPERATURE, density: system.density(), dt, types, lj }
    }

    /// `s`: standard deviation (nm) of the radial relative displacement of a pair of types `a`,
    /// `b` after `steps` steps of ballistic flight.
    pub fn sigma(&self, a: usize, b: usize, steps: u32) -> f64 {
        let inv_mass = 1.0 / self.types[a].mass + 1.0 / self.types[b].mass;
        f64::from(steps) * self.dt * (BOLTZMANN * self.temperature * inv_mass).sqrt()
    }

    /// `E_ab / (4π ρ_b)` of the module docs for a pair with displacement deviation `s`, Taylor
    /// coefficients `a`, list cutoff `rl` and buffer `b`: `∫_0^∞ φ_s(b + y) G(y) dy`, by Simpson's
    /// rule in `η = y / s` over `[0, 12]` (the normal density is below 1e-31 of its peak beyond).
    fn pair_integral(a: &[f64; 3], s: f64, rl: f64, b: f64) -> f64 {
        if s.is_nan() || s <= 0.0 {
            return 0.0;
        }
        let beta = b / s;
        // φ_s(b + sη) s dη = φ(β + η) dη = φ(β) exp(-βη - η²/2) dη: the factor φ(β) stays outside
        // so that large β cannot underflow the integrand before it is weighed.
        let f = |eta: f64| (-beta * eta - 0.5 * eta * eta).exp() * inner_polynomial(a, rl, s * eta);
        let n = 2400;
        let h = 12.0 / f64::from(n);
        let mut sum = f(0.0) + f(12.0);
        for i in 1..n {
            sum += f(f64::from(i) * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        let phi_beta = (-0.5 * beta * beta).exp() / std::f64::consts::TAU.sqrt();
        phi_beta * sum * h / 3.0
    }

    /// Expected energy (kJ/mol, a magnitude) missed per atom at the last step of a list with
    /// cutoff `cutoff + buffer` used for `nstlist` steps, by the model of the module docs.
    pub fn missed_energy_per_atom(&self, cutoff: f64, buffer: f64, nstlist: u32) -> f64 {
        let n = self.types.len();
        let rl = cutoff + buffer;
        let mut e = 0.0;
        for a in 0..n {
            for b in 0..n {
                let (c6, c12) = self.lj[a * n + b];
                let coef = lj_taylor_coefficients(c6, c12, cutoff);
                let s = self.sigma(a, b, nstlist.saturating_sub(1));
                let rho_b = self.density * self.types[b].fraction;
                e += 0.5 * self.types[a].fraction * 4.0 * std::f64::consts::PI * rho_b * Self::pair_integral(&coef, s, rl, buffer);
            }
        }
        e
    }

    /// Estimated energy drift (kJ/mol/ps per atom) of a list with cutoff `cutoff + buffer` rebuilt
    /// every `nstlist` steps: [`Self::missed_energy_per_atom`] over the period `nstlist dt`.
    pub fn drift(&self, cutoff: f64, buffer: f64, nstlist: u32) -> f64 {
        if nstlist == 0 {
            return 0.0;
        }
        self.missed_energy_per_atom(cutoff, buffer, nstlist) / (f64::from(nstlist) * self.dt)
    }

    /// The smallest buffer (nm, rounded up to 0.1 pm) whose [`Self::drift`] over `nstlist`
    /// steps is at most `tolerance` (kJ/mol/ps per atom).
    pub fn buffer_for(&self, cutoff: f64, nstlist: u32, tolerance: f64) -> f64 {
        if self.drift(cutoff, 0.0, nstlist) <= tolerance {
            return 0.0;
        }
        let widest = (0..self.types.len()).map(|a| self.sigma(a, a, nstlist)).fold(0.0, f64::max);
        let (mut lo, mut hi) = (0.0, 20.0 * widest + 1e-3);
        while self.drift(cutoff, hi, nstlist) > tolerance {
            hi *= 2.0;
        }
        while hi - lo > 2e-5 {
            let mid = 0.5 * (lo + hi);
            if self.drift(cutoff, mid, nstlist) <= tolerance { hi = mid } else { lo = mid }
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

    /// Buffers by the drift estimate of the module docs for `system` at time step `dt` (ps), each
    /// list's estimated drift at most `tolerance` kJ/mol/ps per atom ([`DEFAULT_DRIFT_TOLERANCE`]
    /// is GROMACS's default). Checks that `rlist` stays below half the box.
    pub fn for_system(system: &MolecularSystem, cutoff: f32, dt: f32, nstlist: u32, nstprune: u32, tolerance: f64) -> Result<Self, NbnxmError> {
        if !(dt.is_finite() && dt > 0.0 && tolerance.is_finite() && tolerance > 0.0) {
            return Err(NbnxmError::Setup(format!("time step {dt} ps and drift tolerance {tolerance} kJ/mol/ps must be positive")));
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
        BufferModel::for_system(&MolecularSystem::generate(3000, 1).unwrap(), 0.002)
    }

    #[test]
    fn the_reduced_integral_matches_the_double_integral() {
        // E_ab / (4π ρ_b) = ∫_rl^∞ r0² ∫_0^∞ φ_s(r0 - rc + x) P(x) dx dr0, by brute force (midpoint
        // rule in both variables), against the production form with G(y) done exactly.
        let (rc, s) = (1.0, 0.05);
        let a = [6e-4, 2.5e-3, 7e-3];
        for b in [0.0, 0.02, 0.08] {
            let rl = rc + b;
            let phi = |z: f64| (-0.5 * (z / s).powi(2)).exp() / (s * std::f64::consts::TAU.sqrt());
            let p = |x: f64| a[0] * x + a[1] * x * x + a[2] * x * x * x;
            let (n, span) = (1500, 10.0 * s);
            let h = span / f64::from(n);
            let mut brute = 0.0;
            for i in 0..n {
                let r0 = rl + (f64::from(i) + 0.5) * h;
                let mut inner = 0.0;
                for k in 0..n {
                    let x = (f64::from(k) + 0.5) * h;
                    inner += phi(r0 - rc + x) * p(x);
                }
                brute += r0 * r0 * inner * h;
            }
            brute *= h;
            let fast = BufferModel::pair_integral(&a, s, rl, b);
            assert!((brute - fast).abs() <= 2e-4 * fast, "buffer {b}: brute {brute:e}, reduced {fast:e}");
        }
    }

    #[test]
    fn the_taylor_polynomial_is_close_to_the_shifted_potential() {
        // The model's error per pair (Taylor polynomial of degree 3) against the exact shifted LJ
        // potential, integrated the same way over depths up to 3 s (deeper, the Gaussian tail of
        // ballistic flight would run pairs into the repulsive wall, which no real pair reaches
        // from beyond the cutoff in 100 steps): within 15%.
        let m = model();
        let (c6, c12) = m.lj[0];
        let rc = 1.0;
        let a = lj_taylor_coefficients(c6, c12, rc);
        let exact = |x: f64| {
            let v = |r: f64| c12 * r.powi(-12) - c6 * r.powi(-6);
            (v(rc - x) - v(rc)).abs()
        };
        let s = m.sigma(0, 0, 99);
        let phi = |z: f64| (-0.5 * (z / s).powi(2)).exp() / (s * std::f64::consts::TAU.sqrt());
        let (n, h) = (1200, 10.0 * s / 1200.0);
        let (mut taylor, mut truth) = (0.0, 0.0);
        for i in 0..n {
            let r0 = rc + (f64::from(i) + 0.5) * h;
            for k in 0..n {
                let x = (f64::from(k) + 0.5) * h;
                if x > 3.0 * s {
                    break;
                }
                let w = r0 * r0 * phi(r0 - rc + x);
                taylor += w * (a[0] * x + a[1] * x * x + a[2] * x * x * x);
                truth += w * exact(x);
            }
        }
        eprintln!("Taylor {taylor:e} vs exact {truth:e}");
        assert!((taylor / truth - 1.0).abs() < 0.15, "Taylor {taylor:e} vs exact {truth:e}");
    }

    #[test]
    fn buffers_grow_with_the_lifetime_and_shrink_with_the_tolerance() {
        let m = model();
        let mut last = -1.0;
        for steps in [1, 2, 5, 10, 20, 50, 100, 200] {
            let b = m.buffer_for(1.0, steps, DEFAULT_DRIFT_TOLERANCE);
            assert!(b >= last, "{steps} steps: {b} < {last}");
            assert!(m.drift(1.0, b, steps) <= DEFAULT_DRIFT_TOLERANCE);
            if b > 0.0 {
                assert!(m.drift(1.0, b - 2e-4, steps) > DEFAULT_DRIFT_TOLERANCE, "{steps}: not the smallest");
            }
            last = b;
        }
        assert_eq!(m.buffer_for(1.0, 1, DEFAULT_DRIFT_TOLERANCE), 0.0, "a list rebuilt every step needs no buffer");
        assert!(m.buffer_for(1.0, 200, DEFAULT_DRIFT_TOLERANCE) > 0.0);
        let mut last = f64::INFINITY;
        for tol in [1e-6, 1e-5, 1e-4, 1e-3, 5e-3, 2e-2] {
            let b = m.buffer_for(1.0, 100, tol);
            assert!(b <= last, "tolerance {tol}: {b} > {last}");
            last = b;
        }
        assert!(m.buffer_for(1.0, 100, 1e-6) > m.buffer_for(1.0, 100, 2e-2));
        // The drift falls with the buffer and rises with the lifetime.
        assert!(m.drift(1.0, 0.01, 100) > m.drift(1.0, 0.02, 100));
        assert!(m.drift(1.0, 0.01, 50) < m.drift(1.0, 0.01, 100));
    }

    #[test]
    fn setups_follow_the_estimate() {
        let s = MolecularSystem::generate(45_000, 13).unwrap();
        let l = ListSetup::for_system(&s, 1.0, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE).unwrap();
        let m = BufferModel::for_system(&s, 0.002);
        assert_eq!(l.rlist, 1.0 + m.buffer_for(1.0, 100, DEFAULT_DRIFT_TOLERANCE) as f32);
        assert_eq!(l.rlist_inner, 1.0 + m.buffer_for(1.0, 10, DEFAULT_DRIFT_TOLERANCE) as f32);
        assert!(l.rlist_inner <= l.rlist && l.rlist > 1.0);
        assert!(ListSetup::for_system(&s, 1.0, 0.002, 100, 10, 0.0).is_err());
    }

    #[test]
    fn bad_setups_are_refused() {
        assert!(ListSetup::new(1.0, 10, 0.9, 5, 0.95).is_err());
        assert!(ListSetup::new(1.0, 10, 1.2, 20, 1.1).is_err());
        assert!(ListSetup::new(1.0, 10, 1.2, 0, 1.1).is_err());
        assert!(ListSetup::new(1.0, 10, 1.2, 10, 1.2).is_ok());
        let s = MolecularSystem::generate(500, 1).unwrap();
        let e = ListSetup::for_system(&s, 0.9, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE).unwrap_err();
        assert!(e.to_string().contains("half the box"), "{e}");
    }
}
