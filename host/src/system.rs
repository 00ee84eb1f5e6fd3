//! A deterministic synthetic liquid: atoms on a jittered cubic lattice in a periodic cubic box at
//! about 100 atoms/nm³ (the density of the water–ethanol systems GROMACS benchmarks), two
//! Lennard-Jones atom types, Maxwell–Boltzmann velocities. Same atom count and seed, same system,
//! on every machine.

use kernels_gpu::abi::Float3;
use rand::seq::{SliceRandom, index};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Atoms per nm³.
pub const NUMBER_DENSITY: f64 = 100.0;
/// Temperature of the initial velocities (K).
pub const TEMPERATURE: f64 = 300.0;
/// Boltzmann's constant in kJ/(mol K).
pub const BOLTZMANN: f64 = 0.008_314_462_618;
/// Largest system [`MolecularSystem::generate`] builds: local indices are `u32` and a rank's halo
/// can hold several times its home atoms.
pub const MAX_ATOMS: usize = 1 << 30;
/// Jitter of each coordinate around its lattice site, as a fraction of the lattice spacing. With
/// ±5% no two atoms come closer than 90% of the spacing (about 0.19–0.2 nm at this density), so
/// Lennard-Jones forces stay finite.
pub const JITTER: f64 = 0.05;

/// Why a system cannot be generated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SystemError {
    /// Zero atoms asked for.
    #[error("cannot generate a system with 0 atoms: ask for at least 1 atom (for example --atoms 45000)")]
    NoAtoms,
    /// More atoms than halo can index.
    #[error("{atoms} atoms is more than halo supports ({max}): ask for fewer atoms")]
    TooManyAtoms {
        /// Atoms asked for.
        atoms: usize,
        /// The limit, [`MAX_ATOMS`].
        max: usize,
    },
}

/// A Lennard-Jones atom type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AtomType {
    /// Short name.
    pub name: String,
    /// Mass (g/mol).
    pub mass: f64,
    /// LJ diameter σ (nm).
    pub sigma: f64,
    /// LJ well depth ε (kJ/mol).
    pub epsilon: f64,
}

/// LJ coefficients of a pair of types: `V(r) = c12 / r¹² - c6 / r⁶`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LjPair {
    /// `4 ε σ⁶` (kJ/mol nm⁶).
    pub c6: f64,
    /// `4 ε σ¹²` (kJ/mol nm¹²).
    pub c12: f64,
}

/// Atoms in a periodic rectangular box (cubic when generated).
#[derive(Clone, Debug, PartialEq)]
pub struct MolecularSystem {
    /// Box edges (nm).
    pub box_size: [f32; 3],
    /// Positions (nm), inside the box when generated.
    pub positions: Vec<Float3>,
    /// Velocities (nm/ps), zero total momentum when generated.
    pub velocities: Vec<Float3>,
    /// Type of each atom, an index into `atom_types`.
    pub types: Vec<u8>,
    /// The atom types.
    pub atom_types: Vec<AtomType>,
    /// The seed it was generated from.
    pub seed: u64,
}

/// The two atom types of generated systems, heavy-atom-like masses and energies with a σ that fits
/// the density: at 100 atoms/nm³ the lattice spacing is 0.215 nm, so σ ≈ 0.19 nm puts neighbours
/// near the LJ minimum (2^(1/6) σ). With water-like σ = 0.316 nm at this density every atom would sit
/// deep in its neighbours' repulsion (forces ~3·10⁴ kJ/mol/nm) and the liquid would explode within
/// a pair-list interval.
pub fn default_atom_types() -> Vec<AtomType> {
    vec![
        AtomType { name: "A".into(), mass: 15.999, sigma: 0.195, epsilon: 0.650 },
        AtomType { name: "B".into(), mass: 14.027, sigma: 0.185, epsilon: 0.500 },
    ]
}

/// Edge (nm) of the cubic box holding `atoms` atoms at [`NUMBER_DENSITY`].
pub fn box_edge_for(atoms: usize) -> f64 {
    (atoms as f64 / NUMBER_DENSITY).cbrt()
}

impl MolecularSystem {
    /// A system of `atoms` atoms from `seed`.
    ///
    /// The box is a cube at [`NUMBER_DENSITY`]; atoms fill the sites of the smallest cubic lattice
    /// with at least `atoms` sites (randomly chosen sites stay empty), each jittered by
    /// [`JITTER`] of the spacing. Global ids follow lattice order (x fastest), which keeps
    /// neighbouring ids spatially close. One atom in three is of type 1.
    pub fn generate(atoms: usize, seed: u64) -> Result<Self, SystemError> {
        if atoms == 0 {
            return Err(SystemError::NoAtoms);
        }
        if atoms > MAX_ATOMS {
            return Err(SystemError::TooManyAtoms { atoms, max: MAX_ATOMS });
        }
        let edge = box_edge_for(atoms);
        let mut m = (atoms as f64).cbrt().round() as usize;
        while m * m * m < atoms {
            m += 1;
        }
        while m > 1 && (m - 1).pow(3) >= atoms {
            m -= 1;
        }
        let sites = m * m * m;
        let spacing = edge / m as f64;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut empty = vec![false; sites];
        for s in index::sample(&mut rng, sites, sites - atoms) {
            empty[s] = true;
        }
        let atom_types = default_atom_types();
        let mut positions = Vec::with_capacity(atoms);
        let mut types = Vec::with_capacity(atoms);
        for s in (0..sites).filter(|&s| !empty[s]) {
            let cell = [s % m, (s / m) % m, s / (m * m)];
            let mut p = [0.0f32; 3];
            for (x, c) in p.iter_mut().zip(cell) {
                let jitter = (rng.random::<f64>() * 2.0 - 1.0) * JITTER;
                *x = ((c as f64 + 0.5 + jitter) * spacing) as f32;
            }
            positions.push(Float3::new(p[0], p[1], p[2]));
            types.push(u8::from(rng.random::<f64>() < 1.0 / 3.0));
        }
        let velocities = maxwell_boltzmann(&mut rng, &types, &atom_types);
        let l = edge as f32;
        Ok(Self { box_size: [l; 3], positions, velocities, types, atom_types, seed })
    }

    /// The same atoms in an order drawn from `seed` (positions, velocities and types moved
    /// together): global ids no longer follow the lattice, as after a long run in which the atoms
    /// diffused away from their first neighbours. Ids that stay in lattice order keep neighbouring
    /// atoms in neighbouring memory for as long as a run is short; this order measures what a
    /// run pays once that locality is gone.
    pub fn shuffle(&mut self, seed: u64) {
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        self.positions = order.iter().map(|&i| self.positions[i]).collect();
        self.velocities = order.iter().map(|&i| self.velocities[i]).collect();
        self.types = order.iter().map(|&i| self.types[i]).collect();
    }

    /// Number of atoms.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    /// Whether there are no atoms.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// Atoms per nm³.
    pub fn density(&self) -> f64 {
        self.len() as f64 / self.box_size.iter().map(|&l| f64::from(l)).product::<f64>()
    }

    /// Mass of atom `i` (g/mol).
    pub fn mass(&self, i: usize) -> f64 {
        self.atom_types[usize::from(self.types[i])].mass
    }

    /// LJ coefficients of types `a` and `b` by Lorentz–Berthelot combination
    /// (σ arithmetic mean, ε geometric mean).
    pub fn lj_pair(&self, a: usize, b: usize) -> LjPair {
        let (ta, tb) = (&self.atom_types[a], &self.atom_types[b]);
        let sigma = 0.5 * (ta.sigma + tb.sigma);
        let eps = (ta.epsilon * tb.epsilon).sqrt();
        let s6 = sigma.powi(6);
        LjPair { c6: 4.0 * eps * s6, c12: 4.0 * eps * s6 * s6 }
    }
}

/// Velocities at [`TEMPERATURE`] (Box–Muller normals), with the centre-of-mass motion removed.
fn maxwell_boltzmann(rng: &mut ChaCha8Rng, types: &[u8], atom_types: &[AtomType]) -> Vec<Float3> {
    let mut normal = move || {
        // 1 - u keeps the logarithm's argument in (0, 1].
        let u1 = 1.0 - rng.random::<f64>();
        let u2 = rng.random::<f64>();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    };
    let mut v: Vec<[f64; 3]> = types
        .iter()
        .map(|&t| {
            let s = (BOLTZMANN * TEMPERATURE / atom_types[usize::from(t)].mass).sqrt();
            [s * normal(), s * normal(), s * normal()]
        })
        .collect();
    let mut momentum = [0.0; 3];
    let mut total_mass = 0.0;
    for (vi, &t) in v.iter().zip(types) {
        let m = atom_types[usize::from(t)].mass;
        total_mass += m;
        for d in 0..3 {
            momentum[d] += m * vi[d];
        }
    }
    for vi in &mut v {
        for d in 0..3 {
            vi[d] -= momentum[d] / total_mass;
        }
    }
    v.iter().map(|a| Float3::new(a[0] as f32, a[1] as f32, a[2] as f32)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_atoms_is_an_error_that_names_the_fix() {
        let e = MolecularSystem::generate(0, 1).unwrap_err();
        assert_eq!(e, SystemError::NoAtoms);
        assert!(e.to_string().contains("at least 1 atom"));
    }

    #[test]
    fn box_matches_the_density() {
        assert!((box_edge_for(45_000) - 7.663).abs() < 0.01);
        let s = MolecularSystem::generate(2000, 7).unwrap();
        assert_eq!(s.len(), 2000);
        assert!((s.density() - NUMBER_DENSITY).abs() < 1e-3);
        for p in &s.positions {
            for (x, l) in [p.x, p.y, p.z].into_iter().zip(s.box_size) {
                assert!((0.0..l).contains(&x));
            }
        }
    }

    #[test]
    fn deterministic_per_seed() {
        let a = MolecularSystem::generate(500, 11).unwrap();
        assert_eq!(a, MolecularSystem::generate(500, 11).unwrap());
        assert_ne!(a.positions, MolecularSystem::generate(500, 12).unwrap().positions);
        let ones = a.types.iter().filter(|&&t| t == 1).count();
        assert!((100..240).contains(&ones), "{ones}");
    }

    /// Mean distance (nm, nearest image) between atoms of consecutive ids.
    fn consecutive_distance(s: &MolecularSystem) -> f64 {
        let l = f64::from(s.box_size[0]);
        let d: f64 = s
            .positions
            .windows(2)
            .map(|w| {
                [w[1].x - w[0].x, w[1].y - w[0].y, w[1].z - w[0].z]
                    .iter()
                    .map(|&d| {
                        let d = f64::from(d);
                        let d = d - l * (d / l).round();
                        d * d
                    })
                    .sum::<f64>()
                    .sqrt()
            })
            .sum();
        d / (s.len() - 1) as f64
    }

    #[test]
    fn a_shuffled_system_holds_the_same_atoms_in_an_order_without_locality() {
        let lattice = MolecularSystem::generate(3000, 9).unwrap();
        let mut shuffled = lattice.clone();
        shuffled.shuffle(4);
        // The same atoms: every (position, velocity, type) triple once.
        let key = |s: &MolecularSystem| {
            let mut k: Vec<_> = (0..s.len())
                .map(|i| {
                    let (p, v) = (s.positions[i], s.velocities[i]);
                    ([p.x, p.y, p.z, v.x, v.y, v.z].map(f32::to_bits), s.types[i])
                })
                .collect();
            k.sort_unstable();
            k
        };
        assert_eq!(key(&lattice), key(&shuffled));
        assert_ne!(lattice.positions, shuffled.positions);
        // Deterministic per seed.
        let mut again = lattice.clone();
        again.shuffle(4);
        assert_eq!(again, shuffled);
        let mut other = lattice.clone();
        other.shuffle(5);
        assert_ne!(other.positions, shuffled.positions);
        // Lattice order keeps consecutive ids a lattice spacing apart (0.215 nm); shuffled, they
        // are about as far apart as two random atoms of the box (about half its edge).
        let (near, far) = (consecutive_distance(&lattice), consecutive_distance(&shuffled));
        assert!(near < 0.5, "lattice order: {near} nm");
        assert!(far > 0.4 * f64::from(lattice.box_size[0]), "shuffled: {far} nm of a {} nm box", lattice.box_size[0]);
    }

    #[test]
    fn no_two_atoms_overlap() {
        let s = MolecularSystem::generate(1000, 5).unwrap();
        let l = f64::from(s.box_size[0]);
        let mut min2 = f64::INFINITY;
        for i in 0..s.len() {
            for j in 0..i {
                let (a, b) = (s.positions[i], s.positions[j]);
                let r2: f64 = [a.x - b.x, a.y - b.y, a.z - b.z]
                    .iter()
                    .map(|&d| {
                        let d = f64::from(d);
                        let d = d - l * (d / l).round();
                        d * d
                    })
                    .sum();
                min2 = min2.min(r2);
            }
        }
        assert!(min2.sqrt() > 0.19, "closest pair {}", min2.sqrt());
    }

    #[test]
    fn velocities_have_no_net_momentum_and_the_right_temperature() {
        let s = MolecularSystem::generate(3000, 2).unwrap();
        let mut p = [0.0f64; 3];
        let mut ke = 0.0;
        for (i, v) in s.velocities.iter().enumerate() {
            let m = s.mass(i);
            for (pd, vd) in p.iter_mut().zip([v.x, v.y, v.z]) {
                *pd += m * f64::from(vd);
                ke += 0.5 * m * f64::from(vd) * f64::from(vd);
            }
        }
        assert!(p.iter().all(|x| x.abs() < 1e-2), "{p:?}");
        let t = 2.0 * ke / (3.0 * s.len() as f64 * BOLTZMANN);
        assert!((t - TEMPERATURE).abs() < 20.0, "{t}");
    }

    #[test]
    fn combination_rules() {
        let s = MolecularSystem::generate(1, 0).unwrap();
        let p = s.lj_pair(0, 1);
        let sigma: f64 = 0.19;
        let eps = (0.65f64 * 0.5).sqrt();
        assert!((p.c6 - 4.0 * eps * sigma.powi(6)).abs() < 1e-12);
    }
}
