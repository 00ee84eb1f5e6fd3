//! Integrity checks for `--check-every N`: exact, order-independent checksums of coordinates and
//! forces that ranks can compare with each other without moving the data itself.
//!
//! Every atom contributes `atom_hash(quantity, global id, bits of its three f32 components)`; a
//! checksum is the wrapping sum of those contributions. Because
//! - the hash depends only on the atom's global id and the exact bits of its value, the same atom
//!   held by two ranks (the owner and a halo copy) hashes the same when, and only when, both hold
//!   the same bits;
//! - a wrapping sum is commutative and associative, the checksum of a set of atoms does not depend
//!   on the order the atoms are stored in, and sums over disjoint sets add up: the home checksums
//!   of all ranks add up to the checksum of the undecomposed system ([`system_checksum`]);
//! - the id is mixed in, two atoms that swap values change the checksum (a plain sum of bits
//!   would not notice).
//!
//! Per pulse, the sending rank sums what it sends (its mapped atoms plus the periodic shift, added
//! in f32 exactly as the pack kernels do) and the receiving rank sums what arrived in its receive
//! range; [`compare_across_ranks`] pairs the two ends of every pulse and names the first range
//! that differs. Only these few 64-bit words cross ranks ([`RankChecksums::to_words`]).
//!
//! Forces are summed over home atoms only: after the force halo a halo copy holds a partial force
//! that no other rank holds, so forces are checked against an undecomposed or reference run with
//! [`compare_with_system`] (exact where that run is bit-reproducible, as the coordinate path is).

use crate::desc::RankHalo;
use kernels_gpu::abi::Float3;
use std::fmt;

/// Which per-atom quantity a hash covers. Each has its own key, so coordinates and forces that
/// happen to hold the same numbers do not cancel or stand in for each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantity {
    /// Positions (nm).
    Coordinates,
    /// Forces (kJ/mol/nm).
    Forces,
}

impl Quantity {
    fn key(self) -> u64 {
        // Arbitrary odd constants (digits of the golden ratio and of sqrt(3)); any distinct pair works.
        match self {
            Quantity::Coordinates => 0x9E37_79B9_7F4A_7C15,
            Quantity::Forces => 0xBB67_AE85_84CA_A73B,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Quantity::Coordinates => "coordinates",
            Quantity::Forces => "forces",
        }
    }
}

/// A 64-bit bijective finaliser (the SplitMix64 output function): every input bit affects every
/// output bit, so a one-bit change in a coordinate changes about half of the hash's bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The contribution of atom `id` holding `v`: a mix of the id and the exact bits of the three
/// components (so `-0.0` and `0.0`, or two NaNs with different payloads, are different values).
pub fn atom_hash(quantity: Quantity, id: u32, v: Float3) -> u64 {
    let xy = (u64::from(v.x.to_bits()) << 32) | u64::from(v.y.to_bits());
    let z_id = (u64::from(v.z.to_bits()) << 32) | u64::from(id);
    // Chained rather than xor-ed together, so no two fields can cancel each other.
    mix(mix(mix(quantity.key() ^ z_id) ^ xy).wrapping_add(quantity.key()))
}

/// A wrapping sum of [`atom_hash`]es: order-independent, and additive over disjoint sets of atoms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Checksum(pub u64);

impl Checksum {
    /// Adds one atom.
    pub fn add_atom(&mut self, quantity: Quantity, id: u32, v: Float3) {
        self.0 = self.0.wrapping_add(atom_hash(quantity, id, v));
    }

    /// The checksum of two disjoint sets together.
    pub fn combine(self, other: Self) -> Self {
        Self(self.0.wrapping_add(other.0))
    }
}

impl std::iter::Sum for Checksum {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), Self::combine)
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Checksums of coordinates and forces of one set of atoms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateChecksum {
    /// Over the coordinates.
    pub x: Checksum,
    /// Over the forces.
    pub f: Checksum,
}

impl StateChecksum {
    /// The checksum of two disjoint sets together.
    pub fn combine(self, other: Self) -> Self {
        Self { x: self.x.combine(other.x), f: self.f.combine(other.f) }
    }
}

/// The two ends of one pulse of the coordinate halo, as one rank sees them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PulseChecksum {
    /// What this rank sends in the pulse: its mapped atoms, shifted where the pulse crosses the
    /// periodic boundary (the values the receiving rank should end up holding).
    pub sent: Checksum,
    /// What this rank holds in the pulse's receive range.
    pub received: Checksum,
}

/// One rank's checksums at one step: home atoms, and both ends of every pulse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankChecksums {
    /// The rank.
    pub rank: usize,
    /// Coordinates and forces of the home atoms.
    pub home: StateChecksum,
    /// Per pulse, in execution order.
    pub pulses: Vec<PulseChecksum>,
}

/// Why checksums could not be computed, or where ranks disagree.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IntegrityError {
    /// An input array is shorter than the rank's halo needs.
    #[error("integrity check on rank {rank}: {what} has {found} entries but the halo needs {needed}")]
    Length {
        /// The rank.
        rank: usize,
        /// Which array.
        what: &'static str,
        /// Its length.
        found: usize,
        /// The length the halo needs.
        needed: usize,
    },
    /// A map entry points outside the rank's atoms (the plan should have been rejected earlier).
    #[error("integrity check on rank {rank}: pulse {pulse} sends local atom {index}, but the rank has {atoms} atoms")]
    IndexOutOfRange {
        /// The rank.
        rank: usize,
        /// Flat pulse index.
        pulse: usize,
        /// The bad local index.
        index: u32,
        /// The rank's atom count.
        atoms: usize,
    },
    /// The checksums do not fit the halos they are compared against.
    #[error("integrity check: {0}")]
    Shape(String),
    /// The coordinates a rank received in a pulse differ from what the sending rank sent.
    #[error(
        "integrity check: rank {rank} holds atoms [{lo}, {hi}) (pulse {pulse}, from rank {from}) whose coordinates \
         differ from what rank {from} sent (checksum {received} received, {sent} sent): the coordinate halo \
         delivered wrong or stale data"
    )]
    HaloMismatch {
        /// The receiving rank.
        rank: usize,
        /// Flat pulse index.
        pulse: usize,
        /// The sending rank.
        from: usize,
        /// First local index of the receive range.
        lo: usize,
        /// One past its last.
        hi: usize,
        /// The sender's checksum.
        sent: Checksum,
        /// The receiver's checksum.
        received: Checksum,
    },
    /// The home atoms of all ranks together differ from the undecomposed system.
    #[error(
        "integrity check: the {what} of the home atoms of all ranks sum to checksum {decomposed}, \
         the undecomposed system to {undecomposed}: an atom is lost, duplicated or changed"
    )]
    SystemMismatch {
        /// `"coordinates"` or `"forces"`.
        what: &'static str,
        /// Sum over ranks.
        decomposed: Checksum,
        /// The undecomposed system's.
        undecomposed: Checksum,
    },
}

fn need(rank: usize, what: &'static str, found: usize, needed: usize) -> Result<(), IntegrityError> {
    if found < needed {
        return Err(IntegrityError::Length { rank, what, found, needed });
    }
    Ok(())
}

impl RankChecksums {
    /// Computes rank `rank`'s checksums from its halo, the global id of every local atom, and its
    /// coordinates and forces (arrays may be longer than `total_atoms`, e.g. padded device buffers
    /// copied back whole; the rest is ignored). Call after the coordinate halo of a step, and
    /// after the force halo for the forces to be final.
    pub fn compute(rank: usize, halo: &RankHalo, global_ids: &[u32], x: &[Float3], f: &[Float3]) -> Result<Self, IntegrityError> {
        let n = halo.total_atoms;
        need(rank, "global_ids", global_ids.len(), n)?;
        need(rank, "coordinates", x.len(), n)?;
        need(rank, "forces", f.len(), n)?;
        if halo.home_atoms > n {
            return Err(IntegrityError::Shape(format!("rank {rank} has {} home atoms of {n}", halo.home_atoms)));
        }
        let mut home = StateChecksum::default();
        for k in 0..halo.home_atoms {
            home.x.add_atom(Quantity::Coordinates, global_ids[k], x[k]);
            home.f.add_atom(Quantity::Forces, global_ids[k], f[k]);
        }
        let mut pulses = Vec::with_capacity(halo.pulses.len());
        for pulse in 0..halo.pulses.len() {
            let mut sent = Checksum::default();
            let range = each_sent_coordinate(rank, halo, pulse, global_ids, x, |id, v| sent.add_atom(Quantity::Coordinates, id, v))?;
            let mut received = Checksum::default();
            for k in range {
                received.add_atom(Quantity::Coordinates, global_ids[k], x[k]);
            }
            pulses.push(PulseChecksum { sent, received });
        }
        Ok(Self { rank, home, pulses })
    }

    /// The checksums as 64-bit words (home x, home f, then sent and received per pulse), for
    /// gathering across processes in a symmetric buffer or over the launcher's channel.
    pub fn to_words(&self) -> Vec<u64> {
        let mut w = vec![self.home.x.0, self.home.f.0];
        for p in &self.pulses {
            w.extend([p.sent.0, p.received.0]);
        }
        w
    }

    /// The inverse of [`Self::to_words`] for rank `rank`.
    pub fn from_words(rank: usize, words: &[u64]) -> Result<Self, IntegrityError> {
        if words.len() < 2 || !words.len().is_multiple_of(2) {
            return Err(IntegrityError::Shape(format!("rank {rank} sent {} checksum words; expected 2 plus 2 per pulse", words.len())));
        }
        let home = StateChecksum { x: Checksum(words[0]), f: Checksum(words[1]) };
        let pulses = words[2..].chunks_exact(2).map(|c| PulseChecksum { sent: Checksum(c[0]), received: Checksum(c[1]) }).collect();
        Ok(Self { rank, home, pulses })
    }
}

/// The per-atom hashes of one pulse ([`RankChecksums::pulse_atoms`]): what a rank sent, in map
/// order, and what it holds in the pulse's receive range, in slot order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PulseAtoms {
    /// One hash per atom sent (the pulse's checksum `sent` is their sum).
    pub sent: Vec<u64>,
    /// One hash per atom received (the pulse's checksum `received` is their sum).
    pub received: Vec<u64>,
}

impl RankChecksums {
    /// The per-atom hashes behind rank `rank`'s checksums of `pulse` (same inputs as
    /// [`Self::compute`]). Slot `k` of the receiving rank holds what the sender packed `k`-th, so
    /// after a [`IntegrityError::HaloMismatch`] the sender's `sent` and the receiver's `received`
    /// name the atoms that differ ([`differing_atoms`]): a few words per atom of one pulse, only
    /// when a mismatch was found.
    pub fn pulse_atoms(rank: usize, halo: &RankHalo, pulse: usize, global_ids: &[u32], x: &[Float3]) -> Result<PulseAtoms, IntegrityError> {
        let n = halo.total_atoms;
        need(rank, "global_ids", global_ids.len(), n)?;
        need(rank, "coordinates", x.len(), n)?;
        let p = halo.pulses.get(pulse).ok_or_else(|| IntegrityError::Shape(format!("rank {rank} has no pulse {pulse}")))?;
        let mut sent = Vec::with_capacity(p.index_map.len());
        let range = each_sent_coordinate(rank, halo, pulse, global_ids, x, |id, v| sent.push(atom_hash(Quantity::Coordinates, id, v)))?;
        let received = range.map(|k| atom_hash(Quantity::Coordinates, global_ids[k], x[k])).collect();
        Ok(PulseAtoms { sent, received })
    }
}

/// Calls `sent(global id, coordinate)` for every atom pulse `pulse` of `rank` sends, the coordinate
/// made by the same f32 additions of the pulse's shift as the pack kernels (so a correct halo copy
/// has these bits), and returns the pulse's receive range in the rank's atoms; refuses a map entry
/// or a receive range past the rank's `total_atoms`. `global_ids` and `x` hold at least that many.
fn each_sent_coordinate(
    rank: usize,
    halo: &RankHalo,
    pulse: usize,
    global_ids: &[u32],
    x: &[Float3],
    mut sent: impl FnMut(u32, Float3),
) -> Result<std::ops::Range<usize>, IntegrityError> {
    let (n, p) = (halo.total_atoms, &halo.pulses[pulse]);
    for &index in &p.index_map {
        let i = index as usize;
        if i >= n {
            return Err(IntegrityError::IndexOutOfRange { rank, pulse, index, atoms: n });
        }
        let v = match p.shift {
            Some(s) => Float3::new(x[i].x + s.x, x[i].y + s.y, x[i].z + s.z),
            None => x[i],
        };
        sent(global_ids[i], v);
    }
    let hi = p
        .atom_offset
        .checked_add(p.recv_size)
        .filter(|&hi| hi <= n)
        .ok_or_else(|| IntegrityError::Shape(format!("rank {rank} pulse {pulse} receives past its {n} atoms")))?;
    Ok(p.atom_offset..hi)
}

/// The local indices, on the receiving rank, of the atoms of one pulse that differ between what
/// the sender sent (`sent`, its [`PulseAtoms::sent`]) and what the receiver holds (`received`,
/// its [`PulseAtoms::received`]); `lo` is the start of the receive range
/// ([`IntegrityError::HaloMismatch`]'s `lo`). Slots one side has and the other lacks differ too.
pub fn differing_atoms(lo: usize, sent: &[u64], received: &[u64]) -> Vec<usize> {
    (0..sent.len().max(received.len())).filter(|&k| sent.get(k) != received.get(k)).map(|k| lo + k).collect()
}
/// The checksum of an undecomposed system whose atom `i` has global id `i`.
pub fn system_checksum(x: &[Float3], f: &[Float3]) -> Result<StateChecksum, IntegrityError> {
    if x.len() != f.len() {
        return Err(IntegrityError::Shape(format!("{} coordinates but {} forces", x.len(), f.len())));
    }
    if u32::try_from(x.len()).is_err() {
        return Err(IntegrityError::Shape(format!("{} atoms do not fit 32-bit global ids", x.len())));
    }
    let mut s = StateChecksum::default();
    for (i, (&xi, &fi)) in x.iter().zip(f).enumerate() {
        s.x.add_atom(Quantity::Coordinates, i as u32, xi);
        s.f.add_atom(Quantity::Forces, i as u32, fi);
    }
    Ok(s)
}

/// The home checksums of all ranks together (equal to [`system_checksum`] of the same state).
pub fn total_home(sums: &[RankChecksums]) -> StateChecksum {
    sums.iter().fold(StateChecksum::default(), |acc, s| acc.combine(s.home))
}

/// Pairs the two ends of every pulse: what rank `r` sent in pulse `p` must be exactly what its
/// `send_rank` holds in that pulse's receive range. `sums[i]` must be rank `i`'s. The first
/// disagreement, in pulse order and then rank order (the earliest pulse is the likeliest cause,
/// as later pulses forward what earlier ones delivered), is reported with its atom range
/// ([`halo_mismatches`] lists them all).
pub fn compare_across_ranks(halos: &[RankHalo], sums: &[RankChecksums]) -> Result<(), IntegrityError> {
    match halo_mismatches(halos, sums)?.into_iter().next() {
        Some(first) => Err(first),
        None => Ok(()),
    }
}

/// Every pulse receive range whose checksum differs from what its sender sent, as
/// [`IntegrityError::HaloMismatch`]es in pulse order and then rank order (empty: every pulse of
/// every rank agrees; its length is the count a checked step reports). `Err` only when the
/// checksums do not fit the halos.
pub fn halo_mismatches(halos: &[RankHalo], sums: &[RankChecksums]) -> Result<Vec<IntegrityError>, IntegrityError> {
    if halos.len() != sums.len() {
        return Err(IntegrityError::Shape(format!("{} ranks' halos but {} ranks' checksums", halos.len(), sums.len())));
    }
    for (r, (h, s)) in halos.iter().zip(sums).enumerate() {
        if s.rank != r || s.pulses.len() != h.pulses.len() {
            return Err(IntegrityError::Shape(format!(
                "checksum entry {r} is rank {} with {} pulses; the halo of rank {r} has {} pulses",
                s.rank,
                s.pulses.len(),
                h.pulses.len()
            )));
        }
    }
    let pulses = halos.iter().map(|h| h.pulses.len()).max().unwrap_or(0);
    let mut found = Vec::new();
    for pulse in 0..pulses {
        for (from, h) in halos.iter().enumerate() {
            let Some(p) = h.pulses.get(pulse) else { continue };
            let to = p.send_rank;
            let Some(dest) = halos.get(to).and_then(|d| d.pulses.get(pulse)) else {
                return Err(IntegrityError::Shape(format!("rank {from} pulse {pulse} sends to rank {to}, which has no such pulse")));
            };
            let (sent, received) = (sums[from].pulses[pulse].sent, sums[to].pulses[pulse].received);
            if sent != received {
                found.push(IntegrityError::HaloMismatch {
                    rank: to,
                    pulse,
                    from,
                    lo: dest.atom_offset,
                    hi: dest.atom_offset + dest.recv_size,
                    sent,
                    received,
                });
            }
        }
    }
    Ok(found)
}

/// Checks the home atoms of all ranks together against `expected` (for example
/// [`system_checksum`] of an undecomposed run of the same state): coordinates first, then forces.
pub fn compare_with_system(sums: &[RankChecksums], expected: StateChecksum) -> Result<(), IntegrityError> {
    let total = total_home(sums);
    for (q, got, want) in [(Quantity::Coordinates, total.x, expected.x), (Quantity::Forces, total.f, expected.f)] {
        if got != want {
            return Err(IntegrityError::SystemMismatch { what: q.name(), decomposed: got, undecomposed: want });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decomp::{HaloPlan, RankGrid};
    use crate::system::MolecularSystem;

    /// The plan of a generated system as exchange halos, with global ids per rank.
    fn plan_halos(atoms: usize, grid: [usize; 3]) -> (MolecularSystem, Vec<RankHalo>, Vec<Vec<u32>>) {
        let sys = MolecularSystem::generate(atoms, 7).expect("system");
        let cutoff = sys.box_size[0] * 0.3;
        let plan = HaloPlan::build(&sys, RankGrid::new(grid).expect("grid"), cutoff).expect("plan");
        let halos = plan.rank_halos();
        let ids = plan.ranks.iter().map(|r| r.global_ids.clone()).collect();
        (sys, halos, ids)
    }

    /// Exchanged coordinates (the CPU reference of the halo) and per-atom forces derived from ids.
    fn state(sys: &MolecularSystem, halos: &[RankHalo], ids: &[Vec<u32>]) -> (Vec<Vec<Float3>>, Vec<Vec<Float3>>, Vec<Float3>) {
        let force_of = |id: u32| Float3::new(id as f32 * 0.5, -(id as f32), 1.0 / (1.0 + id as f32));
        let home: Vec<Vec<Float3>> =
            ids.iter().zip(halos).map(|(ids, h)| ids[..h.home_atoms].iter().map(|&i| sys.positions[i as usize]).collect()).collect();
        let x = crate::exchange::reference::coordinates(halos, &home);
        let f = ids.iter().map(|ids| ids.iter().map(|&i| force_of(i)).collect()).collect();
        let global_f = (0..sys.len() as u32).map(force_of).collect();
        (x, f, global_f)
    }

    fn all_sums(halos: &[RankHalo], ids: &[Vec<u32>], x: &[Vec<Float3>], f: &[Vec<Float3>]) -> Vec<RankChecksums> {
        (0..halos.len()).map(|r| RankChecksums::compute(r, &halos[r], &ids[r], &x[r], &f[r]).expect("sums")).collect()
    }

    #[test]
    fn integrity_order_independent_and_additive() {
        let v: Vec<Float3> = (0..50).map(|i| Float3::new(i as f32, 2.0 * i as f32, -0.25)).collect();
        let mut a = Checksum::default();
        let mut b = Checksum::default();
        for (i, &p) in v.iter().enumerate() {
            a.add_atom(Quantity::Coordinates, i as u32, p);
        }
        for (i, &p) in v.iter().enumerate().rev() {
            b.add_atom(Quantity::Coordinates, i as u32, p);
        }
        assert_eq!(a, b);
        let halves: Checksum = [0..20usize, 20..50]
            .into_iter()
            .map(|r| {
                let mut c = Checksum::default();
                for i in r {
                    c.add_atom(Quantity::Coordinates, i as u32, v[i]);
                }
                c
            })
            .sum();
        assert_eq!(a, halves);
    }

    #[test]
    fn integrity_hash_sees_every_bit_ids_swaps_and_quantity() {
        let p = Float3::new(1.0, 2.0, 3.0);
        let base = atom_hash(Quantity::Coordinates, 5, p);
        for c in 0..3 {
            for bit in 0..32 {
                let mut q = [p.x, p.y, p.z];
                q[c] = f32::from_bits(q[c].to_bits() ^ (1 << bit));
                assert_ne!(atom_hash(Quantity::Coordinates, 5, Float3::new(q[0], q[1], q[2])), base, "component {c} bit {bit}");
            }
        }
        assert_ne!(atom_hash(Quantity::Coordinates, 6, p), base);
        assert_ne!(atom_hash(Quantity::Forces, 5, p), base);
        assert_ne!(atom_hash(Quantity::Coordinates, 0, Float3::new(0.0, 0.0, 0.0)), atom_hash(Quantity::Coordinates, 0, Float3::new(-0.0, 0.0, 0.0)));
        // Two atoms swapping values are noticed.
        let q = Float3::new(4.0, 5.0, 6.0);
        let mut s1 = Checksum::default();
        s1.add_atom(Quantity::Coordinates, 1, p);
        s1.add_atom(Quantity::Coordinates, 2, q);
        let mut s2 = Checksum::default();
        s2.add_atom(Quantity::Coordinates, 1, q);
        s2.add_atom(Quantity::Coordinates, 2, p);
        assert_ne!(s1, s2);
    }

    #[test]
    fn integrity_home_sums_equal_the_undecomposed_system() {
        for grid in [[1, 1, 1], [2, 1, 1], [2, 2, 1], [3, 2, 2]] {
            let (sys, halos, ids) = plan_halos(900, grid);
            let (x, f, global_f) = state(&sys, &halos, &ids);
            let sums = all_sums(&halos, &ids, &x, &f);
            let whole = system_checksum(&sys.positions, &global_f).expect("system");
            compare_with_system(&sums, whole).expect("home atoms add up to the system");
            compare_across_ranks(&halos, &sums).expect("a correct halo agrees");
        }
    }

    #[test]
    fn integrity_corrupted_halo_names_rank_pulse_and_range() {
        let (sys, halos, ids) = plan_halos(900, [2, 2, 1]);
        let (mut x, f, _) = state(&sys, &halos, &ids);
        // Flip the lowest mantissa bit of one received atom on rank 3, pulse 1.
        let p = &halos[3].pulses[1];
        assert!(p.recv_size > 0);
        let k = p.atom_offset + p.recv_size / 2;
        x[3][k].y = f32::from_bits(x[3][k].y.to_bits() ^ 1);
        let err = compare_across_ranks(&halos, &all_sums(&halos, &ids, &x, &f)).expect_err("one bit flipped");
        let msg = err.to_string();
        assert!(
            matches!(err, IntegrityError::HaloMismatch { rank: 3, pulse: 1, from, lo, hi, .. }
                if from == p.recv_rank && lo == p.atom_offset && hi == p.atom_offset + p.recv_size),
            "{msg}"
        );
        assert!(msg.contains("rank 3 holds atoms") && msg.contains("pulse 1"), "{msg}");
    }

    #[test]
    fn integrity_counts_every_mismatched_pulse_range() {
        let (sys, halos, ids) = plan_halos(900, [2, 2, 1]);
        let (mut x, f, _) = state(&sys, &halos, &ids);
        assert!(halo_mismatches(&halos, &all_sums(&halos, &ids, &x, &f)).expect("sums fit").is_empty(), "a correct halo");
        // One bit of one atom in two different receive ranges, and a second atom in the first.
        let (a, b) = (&halos[3].pulses[1], &halos[0].pulses[0]);
        assert!(a.recv_size > 1 && b.recv_size > 0);
        x[3][a.atom_offset].x = f32::from_bits(x[3][a.atom_offset].x.to_bits() ^ 1);
        x[3][a.atom_offset + 1].z += 0.5;
        x[0][b.atom_offset].y = f32::from_bits(x[0][b.atom_offset].y.to_bits() ^ 1);
        let found = halo_mismatches(&halos, &all_sums(&halos, &ids, &x, &f)).expect("sums fit");
        assert_eq!(found.len(), 2, "two ranges differ: {found:?}");
        // Pulse order first: rank 0's pulse 0, then rank 3's pulse 1; the first is what compare_across_ranks reports.
        assert!(matches!(found[0], IntegrityError::HaloMismatch { rank: 0, pulse: 0, .. }), "{found:?}");
        assert!(matches!(found[1], IntegrityError::HaloMismatch { rank: 3, pulse: 1, .. }), "{found:?}");
        assert_eq!(compare_across_ranks(&halos, &all_sums(&halos, &ids, &x, &f)).expect_err("two ranges differ"), found[0]);
    }

    #[test]
    fn integrity_stale_halo_and_lost_atoms_are_caught() {
        let (sys, halos, ids) = plan_halos(900, [2, 1, 1]);
        let (mut x, f, global_f) = state(&sys, &halos, &ids);
        // A stale halo: rank 0's received atoms still hold last step's values (shifted by 0.01 nm).
        let p = &halos[0].pulses[0];
        for a in &mut x[0][p.atom_offset..p.atom_offset + p.recv_size] {
            a.x -= 0.01;
        }
        assert!(matches!(compare_across_ranks(&halos, &all_sums(&halos, &ids, &x, &f)), Err(IntegrityError::HaloMismatch { rank: 0, pulse: 0, .. })));

        // A home force changed: only the comparison with the whole system sees it.
        let (x, mut f, _) = state(&sys, &halos, &ids);
        f[1][0].z += 1.0;
        let sums = all_sums(&halos, &ids, &x, &f);
        compare_across_ranks(&halos, &sums).expect("coordinates are fine");
        let whole = system_checksum(&sys.positions, &global_f).expect("system");
        let err = compare_with_system(&sums, whole).expect_err("a force changed");
        assert!(matches!(err, IntegrityError::SystemMismatch { what: "forces", .. }), "{err}");
    }

    #[test]
    fn integrity_words_round_trip_and_bad_inputs_are_errors() {
        let (sys, halos, ids) = plan_halos(400, [2, 1, 1]);
        let (x, f, _) = state(&sys, &halos, &ids);
        let sums = all_sums(&halos, &ids, &x, &f);
        for s in &sums {
            assert_eq!(&RankChecksums::from_words(s.rank, &s.to_words()).expect("words"), s);
        }
        assert!(RankChecksums::from_words(0, &[1, 2, 3]).is_err());
        assert!(matches!(RankChecksums::compute(0, &halos[0], &ids[0][..1], &x[0], &f[0]), Err(IntegrityError::Length { what: "global_ids", .. })));
        let mut bad = halos[0].clone();
        bad.pulses[0].index_map.push(u32::MAX);
        assert!(matches!(RankChecksums::compute(0, &bad, &ids[0], &x[0], &f[0]), Err(IntegrityError::IndexOutOfRange { .. })));
        assert!(matches!(compare_across_ranks(&halos, &sums[..1]), Err(IntegrityError::Shape(_))));
        assert!(system_checksum(&x[0], &f[0][..1]).is_err());
    }

    #[test]
    fn integrity_per_atom_hashes_name_the_changed_atom() {
        let (sys, halos, ids) = plan_halos(900, [2, 2, 1]);
        let (mut x, f, _) = state(&sys, &halos, &ids);
        let (to, pulse) = (3, 1);
        let p = &halos[to].pulses[pulse];
        let k = p.atom_offset + p.recv_size / 3;
        x[to][k].z += 0.5;
        let err = compare_across_ranks(&halos, &all_sums(&halos, &ids, &x, &f)).expect_err("an atom changed");
        let IntegrityError::HaloMismatch { rank, pulse: at, from, lo, .. } = err else { panic!("{err}") };
        assert_eq!((rank, at, from), (to, pulse, p.recv_rank));
        let sent = RankChecksums::pulse_atoms(from, &halos[from], at, &ids[from], &x[from]).expect("sender");
        let received = RankChecksums::pulse_atoms(rank, &halos[rank], at, &ids[rank], &x[rank]).expect("receiver");
        assert_eq!(differing_atoms(lo, &sent.sent, &received.received), vec![k]);
        // The per-atom hashes sum to the pulse's checksums.
        let sums = all_sums(&halos, &ids, &x, &f);
        assert_eq!(Checksum(sent.sent.iter().fold(0u64, |a, &h| a.wrapping_add(h))), sums[from].pulses[at].sent);
        assert_eq!(Checksum(received.received.iter().fold(0u64, |a, &h| a.wrapping_add(h))), sums[rank].pulses[at].received);
        assert_eq!(differing_atoms(10, &[1, 2], &[1, 2, 3]), vec![12], "a slot only one side has differs");
    }
}
