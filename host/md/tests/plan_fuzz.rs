//! Fuzzing the plan builder and the plan validator with proptest (issue 8), no GPU:
//! - the builder on arbitrary boxes, grids, cutoffs and atoms (none, one, all at one point, exactly
//!   on cell boundaries, far outside the box, NaN and infinite) never panics; it either builds a
//!   plan that validates or returns an error with a message, and refuses every non-finite input;
//! - every single field mutation of a valid plan that changes it is rejected with a reason;
//! - sequences of arbitrary mutations (geometry included) never make the validator, or a consumer
//!   of a plan it accepts, panic.
//!
//! Sizes are kept small (at most 4x4x4 ranks, a few hundred atoms) so the file runs in seconds in
//! a debug build. `PROPTEST_CASES` raises the case counts for a longer local run.
//!
//! Determinism: proptest seeds its RNG randomly by default; here [`config`] fixes it
//! ([`DEFAULT_SEED`]) unless `PROPTEST_RNG_SEED` is set, so CI runs the same cases every time and
//! a fuzzing session explores with `PROPTEST_RNG_SEED=<n> PROPTEST_CASES=<m>`. Failure
//! persistence stays off: what fuzzing finds is kept as a named regression test at the end of this
//! file rather than as a `proptest-regressions` file.

use halo::abi::Float3;
use halo::decomp::{HaloPlan, PlanError, RankGrid};
use halo::system::MolecularSystem;
use halo_md::md_reference::exchange_coordinates;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::RngSeed;

/// The RNG seed every property here runs with, unless `PROPTEST_RNG_SEED` overrides it.
const DEFAULT_SEED: u64 = 0x4655_5a5a; // "FUZZ"

/// [`cases`]`(default)` cases from a fixed seed (or `PROPTEST_RNG_SEED`), no failure files: the
/// same cases on every run, so CI cannot flake; see the module comment.
fn config(default: u32) -> ProptestConfig {
    // `default()` has already read the PROPTEST_* variables; only the seed may still be random.
    let mut c = ProptestConfig { cases: cases(default), failure_persistence: None, ..ProptestConfig::default() };
    if c.rng_seed == RngSeed::Random {
        c.rng_seed = RngSeed::Fixed(DEFAULT_SEED);
    }
    c
}

/// Box edges and cutoffs: mostly ordinary lengths, sometimes the values that break arithmetic.
fn length() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => 0.5f32..12.0,
        1 => prop::sample::select(vec![
            0.0f32, -0.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE, 1e-30, 1e30, f32::MAX,
        ]),
    ]
}

fn cutoff() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => 0.05f32..3.0,
        1 => prop::sample::select(vec![0.0f32, -0.5, f32::NAN, f32::INFINITY, 1e-30, 1e30, f32::MIN_POSITIVE]),
    ]
}

/// How the atoms are placed, as fractions of the box (so every layout fits every box).
#[derive(Clone, Debug)]
enum Layout {
    /// Uniform, including up to half a box outside on either side (wrapping is exercised).
    Random(Vec<[f32; 3]>),
    /// Every atom at one point.
    OnePoint(usize, [f32; 3]),
    /// Exactly on cell boundaries `k / n` of the box (n up to 4, k up to n), the box edge included.
    Boundaries(Vec<([u8; 3], u8)>),
    /// Far outside the box (up to 1e6 boxes away).
    Far(Vec<[f32; 3]>),
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![
        prop::collection::vec(prop::array::uniform3(-0.5f32..1.5), 0..200).prop_map(Layout::Random),
        (1usize..60, prop::array::uniform3(-0.5f32..1.5)).prop_map(|(n, p)| Layout::OnePoint(n, p)),
        prop::collection::vec((prop::array::uniform3(0u8..=4), 1u8..=4), 1..80).prop_map(Layout::Boundaries),
        prop::collection::vec(prop::array::uniform3(-1e6f32..1e6), 1..40).prop_map(Layout::Far),
    ]
}

fn positions(layout: &Layout, b: [f32; 3]) -> Vec<Float3> {
    let at = |u: [f32; 3]| Float3::new(u[0] * b[0], u[1] * b[1], u[2] * b[2]);
    match layout {
        Layout::Random(us) | Layout::Far(us) => us.iter().map(|&u| at(u)).collect(),
        Layout::OnePoint(n, u) => vec![at(*u); *n],
        Layout::Boundaries(ks) => ks
            .iter()
            .map(|&(k, n)| {
                let f = |k: u8| f32::from(k.min(n)) / f32::from(n);
                at([f(k[0]), f(k[1]), f(k[2])])
            })
            .collect(),
    }
}

/// A non-finite value planted at a random atom (or none).
fn poison() -> impl Strategy<Value = Option<(Index, usize, f32)>> {
    prop::option::weighted(0.2, (any::<Index>(), 0usize..3, prop::sample::select(vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY])))
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn builder_never_panics_and_its_plans_validate(
        edges in prop::array::uniform3(length()),
        dims in prop::array::uniform3(1usize..=4),
        rc in cutoff(),
        layout in layout(),
        poison in poison(),
    ) {
        let mut pos = positions(&layout, edges);
        let poisoned = match (poison, pos.is_empty()) {
            (Some((i, c, v)), false) => {
                let k = i.index(pos.len());
                match c { 0 => pos[k].x = v, 1 => pos[k].y = v, _ => pos[k].z = v }
                true
            }
            _ => false,
        };
        // Scaling by a huge box can overflow a position to infinity too: that is also non-finite input.
        let non_finite = pos.iter().any(|p| !(p.x.is_finite() && p.y.is_finite() && p.z.is_finite()));
        let grid = RankGrid::new(dims).expect("1..=4 ranks per dimension");
        let geometry_ok = grid_geometry_ok(grid, edges, rc);
        match HaloPlan::from_positions(&pos, edges, grid, rc) {
            Ok(plan) => {
                prop_assert!(!non_finite, "non-finite positions accepted (poisoned: {poisoned})");
                prop_assert!(plan.validate().is_ok(), "built plan invalid: {:?}", plan.validate());
                prop_assert!(plan.validate_atoms(pos.len()).is_ok(), "{:?}", plan.validate_atoms(pos.len()));
                let homes: usize = plan.ranks.iter().map(|r| r.home_atoms).sum();
                prop_assert_eq!(homes, pos.len());
            }
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                // A sound geometry and finite atoms must plan; non-finite atoms must be named.
                prop_assert!(!geometry_ok || non_finite, "spurious error: {e}");
                if geometry_ok {
                    prop_assert!(matches!(e, PlanError::NonFinitePosition { .. }), "{e}");
                }
            }
        }
    }
}

/// Cases per property: `default`, or `PROPTEST_CASES` for a longer run.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Whether the decomposition itself (box, grid, cutoff) is acceptable.
fn grid_geometry_ok(grid: RankGrid, edges: [f32; 3], rc: f32) -> bool {
    HaloPlan::from_positions(&[], edges, grid, rc).is_ok()
}

// ---------------------------------------------------------------------------------------------
// Corrupted plans
// ---------------------------------------------------------------------------------------------

/// A small valid plan from a generated liquid (several pulses per dimension when `frac` is large).
fn base_plan(atoms: usize, seed: u64, dims: [usize; 3], frac: f64) -> Option<(HaloPlan, usize)> {
    let sys = MolecularSystem::generate(atoms, seed).ok()?;
    let rc = (frac * f64::from(sys.box_size[0]) / 2.0) as f32;
    let plan = HaloPlan::build(&sys, RankGrid::new(dims).ok()?, rc).ok()?;
    Some((plan, atoms))
}

/// One random edit of one field, as the strategies draw it: `kind` picks the field, `a`, `b`, `c`
/// pick ranks, pulses and entries; `v` and `x` are raw values.
struct Edit {
    kind: u8,
    a: Index,
    b: Index,
    c: Index,
    v: u64,
    x: f32,
}

/// Applies `edit` to `plan`. Returns false when the edit did not apply (nothing to edit).
fn mutate(plan: &mut HaloPlan, atoms: usize, edit: Edit) -> bool {
    let Edit { kind, a, b, c, v, x } = edit;
    let nr = plan.ranks.len();
    let r = a.index(nr);
    let np = plan.ranks[r].pulses.len();
    let vz = v as usize;
    // Pulse-level edits need a pulse.
    if (3..=14).contains(&kind) && np == 0 {
        return false;
    }
    let pi = b.index(np.max(1));
    match kind {
        0 => plan.ranks[r].rank = vz % (nr + 3),
        1 => plan.ranks[r].home_atoms = vz % (plan.ranks[r].total_atoms + 5),
        2 => plan.ranks[r].total_atoms = vz % (plan.ranks[r].total_atoms + 5),
        3 => plan.ranks[r].pulses[pi].dim = vz % 5,
        4 => plan.ranks[r].pulses[pi].pulse_in_dim = vz % 5,
        5 => plan.ranks[r].pulses[pi].spec.send_rank = vz % (nr + 2),
        6 => plan.ranks[r].pulses[pi].spec.recv_rank = vz % (nr + 2),
        // An index outside what the pulse may send: at or above the top of its sendable range.
        7 => {
            let rp = &plan.ranks[r];
            let p = &rp.pulses[pi];
            let hi = if p.pulse_in_dim == 0 || pi == 0 {
                p.spec.atom_offset
            } else {
                rp.pulses[pi - 1].spec.atom_offset + rp.pulses[pi - 1].spec.recv_size
            } as u64;
            let bad = (hi + v % (u64::from(u32::MAX) - hi + 1)) as u32;
            let map = &mut plan.ranks[r].pulses[pi].spec.index_map;
            if map.is_empty() {
                map.push(bad);
            } else {
                let k = c.index(map.len());
                map[k] = bad;
            }
        }
        // A duplicated entry.
        8 => {
            let map = &mut plan.ranks[r].pulses[pi].spec.index_map;
            match map.len() {
                0 => return false,
                1 => map.push(map[0]),
                n => {
                    let (i, j) = (c.index(n), (c.index(n) + 1 + vz % (n - 1)) % n);
                    map[i] = map[j];
                }
            }
        }
        9 => {
            let map = &mut plan.ranks[r].pulses[pi].spec.index_map;
            if map.pop().is_none() {
                map.push(0);
            }
        }
        10 => plan.ranks[r].pulses[pi].spec.recv_size = vz % (plan.ranks[r].total_atoms + 5),
        11 => plan.ranks[r].pulses[pi].spec.atom_offset = vz % (plan.ranks[r].total_atoms + 5),
        12 => plan.ranks[r].pulses[pi].spec.peer_atom_offset = vz % (plan.ranks[r].total_atoms + 5),
        // The periodic shift switched on (zero) or off, or one component changed.
        13 => {
            let shift = &mut plan.ranks[r].pulses[pi].spec.shift;
            *shift = if shift.is_some() { None } else { Some(Float3::default()) };
        }
        14 => {
            let s = plan.ranks[r].pulses[pi].spec.shift.get_or_insert(Float3::default());
            *[&mut s.x, &mut s.y, &mut s.z][vz % 3] = x;
        }
        15 => {
            if np == 0 {
                return false;
            }
            plan.ranks[r].pulses.remove(pi);
        }
        16 => {
            if np == 0 {
                plan.ranks[r].pulses.push(halo::decomp::PulsePlan {
                    dim: 0,
                    pulse_in_dim: 0,
                    spec: halo::exchange::PulseSpec {
                        send_rank: 0,
                        recv_rank: 0,
                        index_map: vec![],
                        recv_size: 0,
                        atom_offset: 0,
                        peer_atom_offset: 0,
                        shift: None,
                        accumulate_forces: true,
                    },
                });
            } else {
                let p = plan.ranks[r].pulses[pi].clone();
                plan.ranks[r].pulses.insert(pi, p);
            }
        }
        17 => {
            if vz.is_multiple_of(2) {
                plan.ranks.remove(r);
            } else {
                let extra = plan.ranks[r].clone();
                plan.ranks.push(extra);
            }
        }
        // A global id the system does not have.
        18 => {
            let ids = &mut plan.ranks[r].global_ids;
            let bad = atoms as u32 + (v % 1000) as u32;
            if ids.is_empty() {
                ids.push(bad);
            } else {
                let k = c.index(ids.len());
                ids[k] = bad;
            }
        }
        // A home atom relabelled as another atom of the system.
        19 => {
            let home = plan.ranks[r].home_atoms;
            if home == 0 {
                return false;
            }
            let k = c.index(home);
            plan.ranks[r].global_ids[k] = (vz % atoms) as u32;
        }
        20 => {
            let ids = &mut plan.ranks[r].global_ids;
            if ids.pop().is_none() {
                ids.push(0);
            }
        }
        21 => return remap_entry(plan, r, pi, |n| c.index(n), vz),
        22 => return relabel_halo_atom(plan, atoms, r, |n| c.index(n), vz),
        // The grid, including counts no valid grid has (0, or a product that overflows).
        _ => {
            let d = vz % 3;
            plan.grid.dims[d] = match v % 4 {
                0 => 0,
                1 => usize::MAX / 2 + vz % 7,
                _ => 1 + (v >> 8) as usize % 4,
            };
        }
    }
    true
}

/// Identity edit: an index-map entry of rank `r`'s pulse `pi` (`pick(len)` chooses which)
/// replaced by another atom the pulse may send and does not send yet (`v` chooses which): in
/// range, no repeat, every size unchanged, so only the identity check (the receiver's id at the
/// landing slot) sees it. False when there is no such entry or atom.
fn remap_entry(plan: &mut HaloPlan, r: usize, pi: usize, pick: impl Fn(usize) -> usize, v: usize) -> bool {
    let rp = &plan.ranks[r];
    let Some(p) = rp.pulses.get(pi) else { return false };
    if p.spec.index_map.is_empty() {
        return false;
    }
    let (lo, hi) = sendable(rp, pi);
    let free: Vec<u32> = (lo..hi).filter(|i| !p.spec.index_map.contains(i)).collect();
    if free.is_empty() {
        return false;
    }
    let k = pick(p.spec.index_map.len());
    let new = free[v % free.len()];
    plan.ranks[r].pulses[pi].spec.index_map[k] = new;
    true
}

/// Identity edit: a halo atom of rank `r` (`pick(halo count)` chooses which) relabelled as
/// another atom of the system that the rank does not hold (the first from `v` on), so ids stay
/// in range and unique on the rank and every atom keeps exactly one home. False when the rank has
/// no halo atoms or already holds every atom.
fn relabel_halo_atom(plan: &mut HaloPlan, atoms: usize, r: usize, pick: impl Fn(usize) -> usize, v: usize) -> bool {
    let rp = &plan.ranks[r];
    let halo = rp.home_atoms..rp.global_ids.len().min(rp.total_atoms);
    if halo.is_empty() || atoms == 0 {
        return false;
    }
    let held: std::collections::HashSet<u32> = rp.global_ids.iter().copied().collect();
    let Some(other) = (0..atoms).map(|k| ((k + v) % atoms) as u32).find(|id| !held.contains(id)) else {
        return false;
    };
    let k = halo.start + pick(halo.len());
    plan.ranks[r].global_ids[k] = other;
    true
}

/// The local indices pulse `pi` of `rank` may send, `[lo, hi)`, as `validate` states them:
/// everything before it for a dimension's first pulse, else the previous pulse's arrivals.
fn sendable(rank: &halo::decomp::RankPlan, pi: usize) -> (u32, u32) {
    let p = &rank.pulses[pi];
    let (lo, hi) = if p.pulse_in_dim == 0 || pi == 0 {
        (0, p.spec.atom_offset)
    } else {
        let before = &rank.pulses[pi - 1];
        (before.spec.atom_offset, before.spec.atom_offset.saturating_add(before.spec.recv_size))
    };
    // Mutation sequences can leave huge sizes behind: clamp, an empty range just means no edit.
    (lo.min(u32::MAX as usize) as u32, hi.min(u32::MAX as usize) as u32)
}

/// Edits `mutate` knows, the grid edit (the last) included.
const STRUCTURAL_KINDS: u8 = 24;

/// The edits that keep the plan structurally consistent and change only which atom is where.
const IDENTITY_KINDS: [u8; 2] = [21, 22];

fn raw_value() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..64, any::<u64>()]
}

fn raw_float() -> impl Strategy<Value = f32> {
    prop_oneof![any::<f32>(), Just(f32::NAN), Just(0.0f32), -10.0f32..10.0]
}

proptest! {
    #![proptest_config(config(400))]

    /// One mutation of one field: whenever the plan changed, it is rejected, with a reason.
    #[test]
    fn every_single_corruption_is_rejected(
        atoms in 1usize..400,
        seed in 0u64..50,
        dims in prop::array::uniform3(1usize..=3),
        frac in 0.2f64..0.95,
        kind in 0u8..STRUCTURAL_KINDS,
        (a, b, c) in (any::<Index>(), any::<Index>(), any::<Index>()),
        v in raw_value(),
        x in raw_float(),
    ) {
        let Some((original, atoms)) = base_plan(atoms, seed, dims, frac) else { return Ok(()) };
        let mut plan = original.clone();
        if !mutate(&mut plan, atoms, Edit { kind, a, b, c, v, x }) || plan == original {
            return Ok(());
        }
        let verdict = plan.validate().and_then(|()| plan.validate_atoms(atoms));
        match verdict {
            Ok(()) => prop_assert!(false, "mutation {kind} was accepted:\n{original:?}\n->\n{plan:?}"),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
        // Identity edits leave the structure intact: the structural check itself must name them.
        if IDENTITY_KINDS.contains(&kind) {
            let e = plan.validate();
            prop_assert!(matches!(e, Err(PlanError::HaloIdentity { .. })), "mutation {kind}: {e:?}");
        }
    }

    /// Several arbitrary mutations, the box and the cutoff included (which the validator cannot
    /// judge without positions): never a panic, in the validator or in a consumer of a plan it
    /// accepted.
    #[test]
    fn mutation_sequences_never_panic(
        atoms in 1usize..300,
        seed in 0u64..50,
        dims in prop::array::uniform3(1usize..=3),
        frac in 0.2f64..0.95,
        edits in prop::collection::vec((0u8..STRUCTURAL_KINDS + 2, any::<Index>(), any::<Index>(), any::<Index>(), raw_value(), raw_float()), 1..5),
    ) {
        let Some((mut plan, atoms)) = base_plan(atoms, seed, dims, frac) else { return Ok(()) };
        let sys = MolecularSystem::generate(atoms, seed).expect("generated above");
        for (kind, a, b, c, v, x) in edits {
            if plan.ranks.is_empty() {
                break;
            }
            match kind {
                k if k < STRUCTURAL_KINDS => { mutate(&mut plan, atoms, Edit { kind: k, a, b, c, v, x }); }
                k if k == STRUCTURAL_KINDS => plan.box_size[(v % 3) as usize] = x,
                _ => plan.cutoff = x,
            }
        }
        match plan.validate().and_then(|()| plan.validate_atoms(atoms)) {
            Ok(()) => {
                // Accepted (e.g. a box edge changed along an undecomposed dimension): consumers
                // must still run without panicking.
                let _ = exchange_coordinates(&plan, &sys);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Fixed cases found while fuzzing, kept as regressions
// ---------------------------------------------------------------------------------------------

/// A grid read from JSON bypasses `RankGrid::new`: zero or overflowing counts must be an error,
/// not a division by zero or a multiplication overflow.
#[test]
fn grids_no_constructor_allows_are_rejected() {
    let (mut plan, _) = base_plan(300, 1, [2, 1, 1], 0.5).expect("plan");
    plan.grid.dims = [usize::MAX / 2, 3, 1];
    let e = plan.validate().expect_err("overflowing grid");
    assert!(matches!(e, PlanError::BadGrid { .. }), "{e}");
    plan.grid.dims = [0, 1, 1];
    plan.ranks.clear();
    let e = plan.validate().expect_err("empty grid");
    assert!(matches!(e, PlanError::BadGrid { .. }), "{e}");
}

/// A receive size of 2^45 atoms on a forwarding pulse, with the next offset made consistent with
/// it, must be rejected without sizing anything by it (it used to allocate a 32 TB bitmap).
#[test]
fn huge_corrupted_sizes_are_rejected_without_allocating_by_them() {
    let (mut plan, _) = base_plan(400, 2, [3, 1, 1], 0.9).expect("plan");
    assert_eq!(plan.decomposition().expect("geometry").pulses[0], 2, "two pulses along x");
    let huge = 1usize << 45;
    let r = &mut plan.ranks[0];
    r.pulses[0].spec.recv_size = huge;
    r.pulses[1].spec.atom_offset = r.pulses[0].spec.atom_offset + huge;
    let e = plan.validate().expect_err("sizes disagree");
    assert!(!e.to_string().is_empty());
}

/// Both identity corruptions, on every pulse of every rank that allows them: each used to pass
/// `validate` and `validate_atoms` (a consistent but wrong plan), each is now a
/// [`PlanError::HaloIdentity`] naming the sender, pulse, entry and both ids.
#[test]
fn identity_corruptions_are_rejected_everywhere() {
    let (original, atoms) = base_plan(400, 2, [3, 2, 1], 0.9).expect("plan");
    let mut tried = [0usize; 2];
    for r in 0..original.ranks.len() {
        for pi in 0..original.ranks[r].pulses.len() {
            for (t, kind) in IDENTITY_KINDS.into_iter().enumerate() {
                let mut plan = original.clone();
                let applied = match kind {
                    21 => remap_entry(&mut plan, r, pi, |_| 0, 0),
                    _ => relabel_halo_atom(&mut plan, atoms, r, |n| pi % n, 7 * pi),
                };
                if !applied || plan == original {
                    continue;
                }
                tried[t] += 1;
                let e = plan.validate().expect_err("identity corruption accepted");
                assert!(matches!(e, PlanError::HaloIdentity { .. }), "kind {kind}, rank {r} pulse {pi}: {e}");
                assert!(e.to_string().contains("sends atom"), "{e}");
            }
        }
    }
    assert!(tried.iter().all(|&n| n > 0), "both kinds applied somewhere: {tried:?}");
}

#[test]
fn degenerate_systems_plan() {
    let grid = RankGrid::new([3, 3, 3]).expect("grid");
    // One atom, many ranks.
    let one = HaloPlan::from_positions(&[Float3::new(1.0, 1.0, 1.0)], [6.0; 3], grid, 1.5).expect("one atom");
    one.validate().expect("valid");
    one.validate_atoms(1).expect("valid");
    // Every atom at a cell corner, the box edge and the origin included.
    let corners: Vec<Float3> = [0.0f32, 2.0, 4.0, 6.0, -0.0].iter().flat_map(|&x| [Float3::new(x, x, x), Float3::new(x, 0.0, 6.0)]).collect();
    let p = HaloPlan::from_positions(&corners, [6.0; 3], grid, 1.9).expect("corners");
    p.validate().expect("valid");
    p.validate_atoms(corners.len()).expect("valid");
    // No atoms at all.
    let none = HaloPlan::from_positions(&[], [6.0; 3], grid, 1.0).expect("no atoms");
    none.validate().expect("valid");
}
