//! The extent of positions on the GPU (kernel `position_extent`, `kernels-gpu/src/kernels/extent.rs`):
//! what [`super::scan`] finds of them, made where they are. A redecomposition on the GPU
//! ([`super::GpuHome`]) runs it over the merged home atoms and reads the parts back with the rest
//! of its read-back, so that neither the host's copy of the home atoms nor the pair search's zone
//! checks pass over them for it.

use super::Scan;
use super::gpu_parts::{PositionExtent, WarpParts};
use crate::error::Result;
use crate::gpu::{CudaStream, DeviceMemory, KernelModule};
use kernels_gpu::abi::{ExtentPart, Float3};

/// The device parts of one extent (one per warp of the launch; kernel `position_extent`).
pub type GpuExtent = WarpParts<PositionExtent>;

impl GpuExtent {
    /// The [`Scan`] of `x[..n]` against `lo..hi`, synchronously (enqueued on `stream`, waited for).
    pub fn run(
        &self,
        module: &KernelModule,
        stream: &CudaStream,
        x: &dyn DeviceMemory<Float3>,
        n: usize,
        lo: [f32; 3],
        hi: [f32; 3],
    ) -> Result<Scan> {
        Ok(fold_extent(&self.run_parts(module, stream, x, n)?, lo, hi))
    }
}

/// The [`Scan`] against `lo..hi` of the positions whose extent `parts` hold: their lowest and
/// highest coordinates folded as the scan folds them, and every coordinate in range when none is
/// NaN and the lowest and highest lie in `lo..hi` (`lo <= v < hi` for all of them exactly then).
pub fn fold_extent(parts: &[ExtentPart], lo: [f32; 3], hi: [f32; 3]) -> Scan {
    let mut s = Scan::EMPTY;
    let mut nan = false;
    for p in parts {
        s = s.join(Scan { in_range: true, lo: p.lo, hi: p.hi });
        nan |= p.nan != 0;
    }
    s.in_range = !nan && (0..3).all(|d| s.lo[d] >= lo[d] && s.hi[d] < hi[d]);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(lo: [f32; 3], hi: [f32; 3], nan: bool) -> ExtentPart {
        ExtentPart { lo, hi, nan: u32::from(nan), pad: 0 }
    }

    #[test]
    fn folded_parts_are_the_scan_of_their_positions() {
        let empty = part([f32::INFINITY; 3], [f32::NEG_INFINITY; 3], false);
        let (lo, hi) = ([0.0; 3], [4.0, 5.0, 6.0]);
        // No positions: in range, the empty extent.
        assert_eq!(fold_extent(&[empty; 8], lo, hi), Scan::EMPTY);
        let a = part([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], false);
        let b = part([0.5, 2.2, 3.1], [3.9, 2.4, 5.9], false);
        let s = fold_extent(&[a, empty, b], lo, hi);
        assert_eq!(s, Scan { in_range: true, lo: [0.5, 2.0, 3.0], hi: [3.9, 2.5, 5.9] });
        // At the upper bound, below the lower one, NaN: out of range (the extent of the rest kept).
        assert!(!fold_extent(&[a, part([1.0; 3], [4.0, 1.0, 1.0], false)], lo, hi).in_range);
        assert!(!fold_extent(&[a, part([1.0, -1e-7, 1.0], [1.0; 3], false)], lo, hi).in_range);
        let with_nan = fold_extent(&[a, part([1.0; 3], [1.0; 3], true), empty], lo, hi);
        assert!(!with_nan.in_range && with_nan.lo == [1.0, 1.0, 1.0]);
        // Non-periodic bounds: any finite value; infinities are out.
        let (flo, fhi) = ([-f32::MAX; 3], [f32::INFINITY; 3]);
        assert!(fold_extent(&[part([-1e30; 3], [1e30; 3], false)], flo, fhi).in_range);
        assert!(!fold_extent(&[part([f32::NEG_INFINITY, 0.0, 0.0], [1.0; 3], false)], flo, fhi).in_range);
        assert!(!fold_extent(&[part([0.0; 3], [f32::INFINITY, 0.0, 0.0], false)], flo, fhi).in_range);
    }
}
