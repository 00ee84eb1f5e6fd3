//! What the home check needs of a rank's home ids, made where they are: the sums of their
//! scrambled values and of those values' squares, and whether every id is above the one before
//! it. A redecomposition on the GPU runs it over the merged home ids, so that the host's check of
//! them (`halo::decomp`'s `home_check`) adds up a few parts instead of passing over every id
//! (`halo::decomp::GpuIdFacts`; `tests/gpu_redecompose.rs` checks it against the host's sums).
//!
//! Each thread folds its grid-strided share, each warp its threads' with butterfly shuffles (five
//! steps per 32-bit half of each sum) and one vote, and lane 0 writes the warp's part: no shared
//! memory, no barrier, no atomic. Wrapping 64-bit sums are the same in any order, so the parts
//! add up to the host's sums bit for bit.

use crate::abi::{IdFactsPart, scramble_id};
use crate::device::{thread, warp};

kernel! {
    /// The parts of the facts of `ids[..n]`. See [`crate::abi::HOME_ID_FACTS`].
    fn home_id_facts(ids: *const u32, n: u32, parts: *mut IdFactsPart) {
        let (mut first, mut second, mut unordered) = (0u64, 0u64, false);
        let mut i = thread::index_1d();
        while i < n {
            // SAFETY: the host sizes `ids` for `n` ids; `i - 1 < n` when `i > 0`.
            let (id, before) = unsafe { (*ids.add(i as usize), if i > 0 { Some(*ids.add(i as usize - 1)) } else { None }) };
            let y = u64::from(scramble_id(id));
            first = first.wrapping_add(y);
            // `y < 2^31`: the square is below 2^62, exact.
            second = second.wrapping_add(y * y);
            unordered |= before.is_some_and(|b| id <= b);
            i += thread::grid_stride_x();
        }
        // Every lane of every warp gets here (the loop has no early return): the full-mask
        // shuffles and vote are safe.
        // SAFETY: all lanes together; `parts` holds one part per warp of the launch.
        unsafe {
            let part = IdFactsPart {
                first: warp::sum_u64(first),
                second: warp::sum_u64(second),
                unordered: u32::from(warp::warp_vote_any(warp::FULL_MASK, unordered)),
                pad: 0,
            };
            if warp::lane_id() == 0 {
                *parts.add((thread::index_1d() / 32) as usize) = part;
            }
        }
    }
}
