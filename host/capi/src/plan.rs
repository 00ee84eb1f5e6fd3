//! The halo plan of one rank as GROMACS's `GpuHaloExchange` holds it, built pulse by pulse
//! (`halo_plan_create`, `halo_plan_add_pulse`), and the check that the ranks' plans fit together
//! (`halo_plan_validate`).

use crate::error::{Failure, guard};
use crate::status::halo_status;
use halo::exchange::{PulseSpec, RankHalo, spec};
use kernels_gpu::abi::Float3;

/// One rank's halo plan: its home atoms, all its atoms, and its pulses in execution order. Made by
/// `halo_plan_create`, filled by `halo_plan_add_pulse`, freed by `halo_plan_destroy`; an exchange
/// copies what it needs, so a plan may be destroyed once the exchange is created.
#[allow(non_camel_case_types)]
pub struct halo_plan {
    pub(crate) halo: RankHalo,
}

/// One pulse of one rank, as GROMACS's `GpuHaloExchange` holds it. Coordinates go to `send_rank`
/// and come from `recv_rank`; forces travel the other way.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct halo_pulse_desc {
    /// The rank this pulse's coordinates are sent to (0 <= send_rank < number of ranks).
    pub send_rank: i32,
    /// The rank this pulse's coordinates come from.
    pub recv_rank: i32,
    /// Local indices of the atoms sent, `send_count` of them, each a home atom or an atom received
    /// in an earlier pulse. May be null when `send_count` is 0. Copied by `halo_plan_add_pulse`.
    pub index_map: *const i32,
    /// How many atoms this pulse sends (entries of `index_map`).
    pub send_count: usize,
    /// How many atoms this pulse receives.
    pub recv_count: usize,
    /// Where the received atoms start in this rank's arrays (at or after the home atoms).
    pub atom_offset: usize,
    /// Where the sent atoms start in `send_rank`'s arrays (that rank's `atom_offset` of this pulse).
    pub peer_atom_offset: usize,
    /// Nonzero when the sent coordinates are shifted by `shift` (the pulse crosses a periodic boundary).
    pub has_shift: i32,
    /// The periodic shift (x, y, z) added to every sent coordinate when `has_shift` is nonzero.
    pub shift: [f32; 3],
    /// Nonzero: received forces are added to the mapped atoms' forces. Must be nonzero (a stored
    /// force would race with the other pulses' additions).
    pub accumulate_forces: i32,
}

/// Creates an empty plan for a rank with `home_atoms` home atoms and `total_atoms` atoms in all
/// (home atoms plus every received atom), and stores it in `*out`.
/// Fails with `HALO_INVALID_ARGUMENT` when `out` is null or `home_atoms > total_atoms`.
///
/// # Safety
/// `out` must be null or point to writable storage for a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_plan_create(home_atoms: usize, total_atoms: usize, out: *mut *mut halo_plan) -> halo_status {
    guard("halo_plan_create", || {
        if out.is_null() {
            return Err(Failure::invalid("`out` is null: pass the address of a `halo_plan*`"));
        }
        if home_atoms > total_atoms {
            return Err(Failure::invalid(format!(
                "home_atoms ({home_atoms}) is larger than total_atoms ({total_atoms}): total_atoms counts the home atoms plus every received atom"
            )));
        }
        if total_atoms > u32::MAX as usize {
            return Err(Failure::invalid(format!("total_atoms ({total_atoms}) does not fit the exchange's 32-bit atom indices")));
        }
        let plan = Box::new(halo_plan { halo: RankHalo { home_atoms, total_atoms, pulses: Vec::new() } });
        // SAFETY: `out` is non-null and writable (the caller's contract).
        unsafe { *out = Box::into_raw(plan) };
        Ok(())
    })
}

/// Appends a pulse (copied, index map included) to `plan`. Checks what one rank can check: ranks
/// not negative, `index_map` present when `send_count` > 0, every map entry within the plan's
/// atoms, the received range inside them and after the home atoms, forces accumulated. Whether the
/// ranks' plans fit together is checked by `halo_plan_validate` and when an exchange is created.
///
/// # Safety
/// `plan` must be null or a live plan; `pulse` null or a valid `halo_pulse_desc` whose
/// `index_map` points to `send_count` readable `int32_t`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_plan_add_pulse(plan: *mut halo_plan, pulse: *const halo_pulse_desc) -> halo_status {
    guard("halo_plan_add_pulse", || {
        // SAFETY: null or a live plan, used by this thread only (the caller's contract).
        let plan = unsafe { plan.as_mut() }.ok_or_else(|| Failure::invalid("`plan` is null: create it with halo_plan_create"))?;
        // SAFETY: null or a valid descriptor (the caller's contract).
        let desc = unsafe { pulse.as_ref() }.ok_or_else(|| Failure::invalid("`pulse` is null: pass a filled halo_pulse_desc"))?;
        let p = plan.halo.pulses.len();
        let spec = pulse_spec(desc, &plan.halo, p)?;
        plan.halo.pulses.push(spec);
        Ok(())
    })
}

/// The pulse `p` of `halo` that `desc` describes, or why it cannot be one.
fn pulse_spec(desc: &halo_pulse_desc, halo: &RankHalo, p: usize) -> Result<PulseSpec, Failure> {
    let bad = |msg: String| Err(Failure::invalid(format!("pulse {p}: {msg}")));
    if desc.send_rank < 0 || desc.recv_rank < 0 {
        return bad(format!("send_rank {} and recv_rank {} must be ranks (0 or more)", desc.send_rank, desc.recv_rank));
    }
    if desc.index_map.is_null() && desc.send_count > 0 {
        return bad(format!("index_map is null but send_count is {}: pass the local indices of the atoms sent", desc.send_count));
    }
    let map: &[i32] = if desc.send_count == 0 {
        &[]
    } else {
        // SAFETY: non-null and `send_count` readable entries (the caller's contract).
        unsafe { std::slice::from_raw_parts(desc.index_map, desc.send_count) }
    };
    let total = halo.total_atoms;
    if let Some((i, &m)) = map.iter().enumerate().find(|&(_, &m)| m < 0 || m as usize >= total) {
        return bad(format!("index_map[{i}] is {m}, outside this rank's {total} atoms (0..{total})"));
    }
    let end = desc.atom_offset.checked_add(desc.recv_count).filter(|&e| e <= total);
    if end.is_none() {
        return bad(format!(
            "receives {} atoms at atom_offset {}, past this rank's {total} atoms: raise total_atoms in halo_plan_create",
            desc.recv_count, desc.atom_offset
        ));
    }
    if desc.recv_count > 0 && desc.atom_offset < halo.home_atoms {
        return bad(format!("atom_offset {} is inside the {} home atoms: received atoms go after them", desc.atom_offset, halo.home_atoms));
    }
    if desc.accumulate_forces == 0 {
        return bad("accumulate_forces is 0: received forces must be added (a stored force would race with the other pulses' additions); \
             zero the forces of the received atoms and accumulate"
            .into());
    }
    let [x, y, z] = desc.shift;
    Ok(PulseSpec {
        send_rank: desc.send_rank as usize,
        recv_rank: desc.recv_rank as usize,
        index_map: map.iter().map(|&m| m as u32).collect(),
        recv_size: desc.recv_count,
        atom_offset: desc.atom_offset,
        peer_atom_offset: desc.peer_atom_offset,
        shift: (desc.has_shift != 0).then(|| Float3::new(x, y, z)),
        accumulate_forces: true,
    })
}

/// Frees a plan made by `halo_plan_create`. Null is allowed (nothing happens).
///
/// # Safety
/// `plan` must be null or a plan from `halo_plan_create` not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_plan_destroy(plan: *mut halo_plan) -> halo_status {
    // SAFETY: the caller's contract (made by Box::into_raw in its create call, not freed before).
    unsafe { crate::error::destroy("halo_plan_destroy", plan) }
}

/// Checks that the plans of all `nranks` ranks (`plans[r]` is rank r's) fit together: equal pulse
/// counts, each pulse's sizes and offsets matching at both ends, received ranges disjoint, every
/// map entry a home atom or an atom received in an earlier pulse. Needs no GPU; the exchange
/// constructors run the same check. `HALO_INVALID_ARGUMENT` with the first mismatch named.
///
/// # Safety
/// `plans` must be null or point to `nranks` pointers, each null or a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_plan_validate(plans: *const *const halo_plan, nranks: i32) -> halo_status {
    guard("halo_plan_validate", || {
        // SAFETY: the caller's contract, as documented.
        let halos = unsafe { collect_plans(plans, nranks) }?;
        spec::validate(&halos).map_err(Failure::from)
    })
}

/// The ranks' halos from `nranks` plan pointers, or which argument is missing.
///
/// # Safety
/// `plans` must be null or point to `nranks` pointers, each null or a live plan.
pub(crate) unsafe fn collect_plans(plans: *const *const halo_plan, nranks: i32) -> Result<Vec<RankHalo>, Failure> {
    if nranks <= 0 {
        return Err(Failure::invalid(format!("nranks is {nranks}: pass the number of ranks (1 or more)")));
    }
    if plans.is_null() {
        return Err(Failure::invalid("`plans` is null: pass an array of one plan per rank"));
    }
    // SAFETY: `nranks` readable pointers (the caller's contract).
    let ptrs = unsafe { std::slice::from_raw_parts(plans, nranks as usize) };
    ptrs.iter()
        .enumerate()
        .map(|(r, &p)| {
            // SAFETY: null or a live plan (the caller's contract).
            unsafe { p.as_ref() }.map(|p| p.halo.clone()).ok_or_else(|| Failure::invalid(format!("plans[{r}] is null: every rank needs a plan")))
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::error::last_error;
    use std::ptr::{null, null_mut};

    /// Rank `r` of a two-rank ring as the C++ example builds it: pulse 0 sends atoms 0 and 3 to
    /// the other rank (shifted by +10 in x on rank 0), received at 4.
    pub(crate) fn desc(peer: i32, map: &[i32], shifted: bool) -> halo_pulse_desc {
        halo_pulse_desc {
            send_rank: peer,
            recv_rank: peer,
            index_map: map.as_ptr(),
            send_count: map.len(),
            recv_count: 2,
            atom_offset: 4,
            peer_atom_offset: 4,
            has_shift: shifted as i32,
            shift: [10.0, 0.0, 0.0],
            accumulate_forces: 1,
        }
    }

    fn plan(home: usize, total: usize) -> *mut halo_plan {
        let mut p = null_mut();
        // SAFETY: `p` is writable.
        assert_eq!(unsafe { halo_plan_create(home, total, &mut p) }, halo_status::HALO_OK);
        p
    }

    #[test]
    fn a_two_rank_ring_builds_into_the_libraries_halos_and_validates() {
        let map = [0, 3];
        let (a, b) = (plan(4, 6), plan(4, 6));
        // SAFETY: live plans and descriptors over `map`.
        unsafe {
            assert_eq!(halo_plan_add_pulse(a, &desc(1, &map, true)), halo_status::HALO_OK);
            assert_eq!(halo_plan_add_pulse(b, &desc(0, &map, false)), halo_status::HALO_OK);
            let halo = &(*a).halo;
            assert_eq!((halo.home_atoms, halo.total_atoms, halo.pulses.len()), (4, 6, 1));
            let p = &halo.pulses[0];
            assert_eq!((p.send_rank, p.recv_rank, &p.index_map[..], p.recv_size, p.atom_offset), (1, 1, &[0u32, 3][..], 2, 4));
            assert_eq!(p.shift, Some(Float3::new(10.0, 0.0, 0.0)));
            let other = &(*b).halo;
            assert_eq!(other.pulses[0].shift, None);
            let plans = [a as *const halo_plan, b];
            assert_eq!(halo_plan_validate(plans.as_ptr(), 2), halo_status::HALO_OK);
            halo_plan_destroy(a);
            halo_plan_destroy(b);
        }
    }

    #[test]
    fn null_pointers_and_bad_sizes_are_errors() {
        // SAFETY: every pointer is null or valid; the calls check the nulls.
        unsafe {
            assert_eq!(halo_plan_create(4, 6, null_mut()), halo_status::HALO_INVALID_ARGUMENT);
            assert!(last_error().contains("`out` is null"), "{}", last_error());
            let mut p = null_mut();
            assert_eq!(halo_plan_create(7, 6, &mut p), halo_status::HALO_INVALID_ARGUMENT);
            assert!(p.is_null());
            assert!(last_error().contains("home_atoms (7) is larger than total_atoms (6)"), "{}", last_error());
            let map = [0, 3];
            assert_eq!(halo_plan_add_pulse(null_mut(), &desc(1, &map, false)), halo_status::HALO_INVALID_ARGUMENT);
            assert!(last_error().contains("`plan` is null"));
            let a = plan(4, 6);
            assert_eq!(halo_plan_add_pulse(a, null()), halo_status::HALO_INVALID_ARGUMENT);
            assert!(last_error().contains("`pulse` is null"));
            let mut d = desc(1, &map, false);
            d.index_map = null();
            assert_eq!(halo_plan_add_pulse(a, &d), halo_status::HALO_INVALID_ARGUMENT);
            assert!(last_error().contains("index_map is null but send_count is 2"), "{}", last_error());
            d.send_count = 0; // nothing sent: no map needed
            assert_eq!(halo_plan_add_pulse(a, &d), halo_status::HALO_OK);
            assert_eq!(halo_plan_validate(null(), 2), halo_status::HALO_INVALID_ARGUMENT);
            assert_eq!(halo_plan_validate([a as *const halo_plan].as_ptr(), 0), halo_status::HALO_INVALID_ARGUMENT);
            assert!(last_error().contains("nranks is 0"));
            assert_eq!(halo_plan_validate([a as *const halo_plan, null()].as_ptr(), 2), halo_status::HALO_INVALID_ARGUMENT);
            assert!(last_error().contains("plans[1] is null"), "{}", last_error());
            assert_eq!(halo_plan_destroy(null_mut()), halo_status::HALO_OK);
            halo_plan_destroy(a);
        }
    }

    #[test]
    fn a_pulse_one_rank_can_see_is_wrong_is_refused_with_its_index() {
        let a = plan(4, 6);
        type Change = fn(&mut halo_pulse_desc);
        let cases: [(Change, &str); 5] = [
            (|d| d.send_rank = -1, "pulse 0: send_rank -1 and recv_rank 1 must be ranks"),
            (|d| d.atom_offset = 5, "receives 2 atoms at atom_offset 5, past this rank's 6 atoms"),
            (|d| d.atom_offset = 3, "atom_offset 3 is inside the 4 home atoms"),
            (|d| d.accumulate_forces = 0, "accumulate_forces is 0"),
            (|d| d.recv_count = usize::MAX, "past this rank's 6 atoms"),
        ];
        let map = [0, 3];
        for (change, want) in cases {
            let mut d = desc(1, &map, false);
            change(&mut d);
            // SAFETY: a live plan and a descriptor over `map`.
            assert_eq!(unsafe { halo_plan_add_pulse(a, &d) }, halo_status::HALO_INVALID_ARGUMENT);
            assert!(last_error().contains(want), "{want}: {}", last_error());
        }
        for (bad_map, want) in [([0, 6], "index_map[1] is 6, outside this rank's 6 atoms"), ([-2, 1], "index_map[0] is -2")] {
            // SAFETY: as above, over `bad_map`.
            assert_eq!(unsafe { halo_plan_add_pulse(a, &desc(1, &bad_map, false)) }, halo_status::HALO_INVALID_ARGUMENT);
            assert!(last_error().contains(want), "{want}: {}", last_error());
        }
        // SAFETY: a live plan.
        unsafe {
            let halo = &(*a).halo;
            assert!(halo.pulses.is_empty(), "a refused pulse is not added");
            halo_plan_destroy(a);
        }
    }

    #[test]
    fn plans_that_do_not_fit_together_are_named_by_the_library_check() {
        let map = [0, 3];
        let (a, b) = (plan(4, 6), plan(4, 6));
        let mut other = desc(0, &map[..1], false); // rank 1 sends one atom, rank 0 expects two
        other.recv_count = 2;
        // SAFETY: live plans and descriptors over `map`.
        unsafe {
            halo_plan_add_pulse(a, &desc(1, &map, false));
            halo_plan_add_pulse(b, &other);
            let plans = [a as *const halo_plan, b];
            assert_eq!(halo_plan_validate(plans.as_ptr(), 2), halo_status::HALO_INVALID_ARGUMENT);
            let msg = last_error();
            assert!(
                msg.starts_with("halo_plan_validate: invalid input: inconsistent halo plan: rank 1 pulse 0 sends 1 atoms, rank 0 expects 2"),
                "{msg}"
            );
            // A rank named that does not exist.
            assert_eq!(halo_plan_validate(plans.as_ptr(), 1), halo_status::HALO_INVALID_ARGUMENT);
            assert!(last_error().contains("names rank 1 of 1"), "{}", last_error());
            halo_plan_destroy(a);
            halo_plan_destroy(b);
        }
    }
}
