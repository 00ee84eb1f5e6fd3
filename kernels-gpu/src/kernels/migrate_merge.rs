//! The merge of a rank's arrivals into its stayers on the GPU, second building block of a GPU
//! redecomposition (docs/nbnxm.md, "Search step cost"): the host's `Working::new`
//! (`host/src/decomp/redecompose.rs`), which builds the new home atoms in global-id order from the
//! stayers (in id order when the input came from the last plan) and the arrivals (sorted by id).
//! `halo::decomp::GpuMerge` drives it (for the MD step, inside `halo::decomp::GpuHome`),
//! `tests/gpu_merge.rs` checks it against the host bit for bit.
//!
//! `migrate_merge`, one thread per output atom, one pass: the first `n_stay` threads take a
//! stayer each, the others an arrival. Ids are unique, so an atom's place in the merged order is
//! its index in its own array plus the number of the other array's ids below its own, found by a
//! binary search (the arrivals, a few hundred, for a stayer; the stayers for an arrival). No
//! atomics decide a place, and every place is inside the output whatever the input (a search
//! returns at most its array's length). The order the merge relies on is checked on the way, each
//! check a plain store of 1 to its `info` word (every writer writes the same value): each thread
//! compares its id with its array's next one, and each arrival the stayer its search found.

use crate::abi::{Float3, MIGRATE_MERGE_INFO_ARRIVALS, MIGRATE_MERGE_INFO_REPEATED, MIGRATE_MERGE_INFO_STAYERS, MigrateLeaver, ids_below};
use crate::device::thread;

/// The merge (see [`crate::abi::MIGRATE_MERGE`]).
///
/// # Safety
/// The stayers' arrays have `n_stay` entries, `arrivals` `n_arrivals`, the outputs
/// `n_stay + n_arrivals` (no sum past `u32::MAX`), none aliasing an input; `info`
/// [`crate::abi::MIGRATE_MERGE_INFO_WORDS`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn merge(
    stay_ids: *const u32,
    stay_x: *const Float3,
    stay_v: *const Float3,
    n_stay: u32,
    arrivals: *const MigrateLeaver,
    n_arrivals: u32,
    ids_out: *mut u32,
    x_out: *mut Float3,
    v_out: *mut Float3,
    info: *mut u32,
) {
    let t = thread::index_1d();
    // SAFETY: every read index is below its array's length (a search reads below its `n`), every
    // place below `n_stay + n_arrivals`: `i < n_stay` plus at most `n_arrivals`, or `j <
    // n_arrivals` plus at most `n_stay`.
    unsafe {
        if t < n_stay {
            let i = t as usize;
            let id = *stay_ids.add(i);
            if t + 1 < n_stay && *stay_ids.add(i + 1) <= id {
                *info.add(MIGRATE_MERGE_INFO_STAYERS) = 1;
            }
            let at = i + ids_below(n_arrivals, id, |k| (*arrivals.add(k as usize)).id) as usize;
            *ids_out.add(at) = id;
            *x_out.add(at) = *stay_x.add(i);
            *v_out.add(at) = *stay_v.add(i);
        } else if t - n_stay < n_arrivals {
            let j = t - n_stay;
            let a = arrivals.add(j as usize);
            let id = (*a).id;
            if j + 1 < n_arrivals && (*a.add(1)).id <= id {
                *info.add(MIGRATE_MERGE_INFO_ARRIVALS) = 1;
            }
            let before = ids_below(n_stay, id, |k| *stay_ids.add(k as usize));
            if before < n_stay && *stay_ids.add(before as usize) == id {
                *info.add(MIGRATE_MERGE_INFO_REPEATED) = 1;
            }
            let at = (j + before) as usize;
            *ids_out.add(at) = id;
            // Field by field, as `migrate_scatter` writes a leaver (no stack copy of the struct).
            let (x, v) = ((*a).x, (*a).v);
            *x_out.add(at) = Float3::new(x.x, x.y, x.z);
            *v_out.add(at) = Float3::new(v.x, v.y, v.z);
        }
    }
}

kernel! {
    /// The merge of arrivals into stayers. See [`crate::abi::MIGRATE_MERGE`].
    fn migrate_merge(
        stay_ids: *const u32, stay_x: *const Float3, stay_v: *const Float3, n_stay: u32, arrivals: *const MigrateLeaver, n_arrivals: u32,
        ids_out: *mut u32, x_out: *mut Float3, v_out: *mut Float3, info: *mut u32,
    ) {
        // SAFETY: forwarded; the host's contract is on `merge`.
        unsafe { merge(stay_ids, stay_x, stay_v, n_stay, arrivals, n_arrivals, ids_out, x_out, v_out, info) }
    }
}
