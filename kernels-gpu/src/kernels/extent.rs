//! The extent of a run of positions on the GPU: per dimension the lowest and highest coordinate,
//! and whether one is NaN. A redecomposition on the GPU runs it over the merged home atoms, so
//! that the pair search's zone checks need not pass over them on the host
//! (`halo::decomp::GpuExtent`; `tests/gpu_redecompose.rs` checks it against `halo::decomp::scan`).
//!
//! Each thread folds its grid-strided share, each warp its threads' with butterfly shuffles (five
//! steps per value), and lane 0 writes the warp's part: no shared memory, no barrier, no atomic.
//! The comparisons are the host scan's (`v < m` keeps `v`, so a NaN is never kept and is flagged
//! apart); which of `0.0` and `-0.0` a zero bound is depends on the order, as on the host.

use crate::abi::{ExtentPart, Float3};
use crate::device::{thread, warp};

/// The lower of `a` and `b` as the host scan picks it: `b` when `b < a`.
#[inline(always)]
fn lower(a: f32, b: f32) -> f32 {
    if b < a { b } else { a }
}

/// The higher: `b` when `b > a`.
#[inline(always)]
fn higher(a: f32, b: f32) -> f32 {
    if b > a { b } else { a }
}

/// `v` folded over the warp, the lowest when `LOW`, else the highest (butterfly: every lane ends
/// with the warp's value).
///
/// # Safety
/// All lanes of the warp together.
#[inline(always)]
unsafe fn warp_fold<const LOW: bool>(mut v: f32) -> f32 {
    let pick = |a: f32, b: f32| if LOW { lower(a, b) } else { higher(a, b) };
    // Written out: a loop over an array of offsets lands in local memory.
    // SAFETY: all lanes together.
    unsafe {
        v = pick(v, warp::shfl_xor_f32(warp::FULL_MASK, v, 16));
        v = pick(v, warp::shfl_xor_f32(warp::FULL_MASK, v, 8));
        v = pick(v, warp::shfl_xor_f32(warp::FULL_MASK, v, 4));
        v = pick(v, warp::shfl_xor_f32(warp::FULL_MASK, v, 2));
        pick(v, warp::shfl_xor_f32(warp::FULL_MASK, v, 1))
    }
}

kernel! {
    /// The parts of the extent of `x[..n]`. See [`crate::abi::POSITION_EXTENT`].
    fn position_extent(x: *const Float3, n: u32, parts: *mut ExtentPart) {
        let (mut lo, mut hi, mut nan) = (Float3::new(f32::INFINITY, f32::INFINITY, f32::INFINITY), Float3::new(f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY), false);
        let mut i = thread::index_1d();
        while i < n {
            // SAFETY: the host sizes `x` for `n` positions.
            let p = unsafe { *x.add(i as usize) };
            // Field by field (an array indexed in a loop could land in local memory).
            nan |= (p.x != p.x) | (p.y != p.y) | (p.z != p.z);
            lo = Float3::new(lower(lo.x, p.x), lower(lo.y, p.y), lower(lo.z, p.z));
            hi = Float3::new(higher(hi.x, p.x), higher(hi.y, p.y), higher(hi.z, p.z));
            i += thread::grid_stride_x();
        }
        // Every lane of every warp gets here (the loop has no early return): the full-mask
        // shuffles and vote are safe.
        // SAFETY: all lanes together; `parts` holds one part per warp of the launch.
        unsafe {
            let part = ExtentPart {
                lo: [warp_fold::<true>(lo.x), warp_fold::<true>(lo.y), warp_fold::<true>(lo.z)],
                hi: [warp_fold::<false>(hi.x), warp_fold::<false>(hi.y), warp_fold::<false>(hi.z)],
                nan: u32::from(warp::warp_vote_any(warp::FULL_MASK, nan)),
                pad: 0,
            };
            if warp::lane_id() == 0 {
                *parts.add((thread::index_1d() / 32) as usize) = part;
            }
        }
    }
}
