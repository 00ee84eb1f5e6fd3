//! The argument checks the GPU redecomposition's passes ([`super::GpuMigrate`],
//! [`super::GpuMerge`], [`super::GpuSelect`]) make before they enqueue anything: arrays long
//! enough, and no array a pass writes overlapping one it reads (other blocks write while the
//! passes read). Each error names the pass, the array and the fix.

use crate::error::{HaloError, Result};

/// An error naming the first array of `lens` (name, elements) shorter than the `n` atoms of a run
/// of `pass` ("GPU migration", ...).
pub(super) fn check_lengths(pass: &str, n: usize, lens: &[(&str, usize)]) -> Result<()> {
    match lens.iter().find(|(_, len)| *len < n) {
        Some((name, len)) => Err(HaloError::InvalidInput(format!("{pass} of {n} atoms: `{name}` holds {len}"))),
        None => Ok(()),
    }
}

/// Whether two byte ranges `(address, length)` share a byte (an empty range shares none).
pub(super) fn overlap((a, la): (u64, u64), (b, lb): (u64, u64)) -> bool {
    la > 0 && lb > 0 && a < b.saturating_add(lb) && b < a.saturating_add(la)
}

/// An error naming the first output (in order) whose bytes `(address, length)` overlap an
/// input's or an earlier output's, for a run of `pass` whose outputs are `what`'s arrays.
pub(super) fn check_disjoint(pass: &str, what: &str, inputs: &[(&str, (u64, u64))], outputs: &[(&str, (u64, u64))]) -> Result<()> {
    for (k, (out, range)) in outputs.iter().enumerate() {
        if let Some((other, _)) = inputs.iter().chain(&outputs[..k]).find(|(_, r)| overlap(*range, *r)) {
            return Err(HaloError::InvalidInput(format!("{pass}: `{out}` overlaps `{other}`; give {what} arrays of their own")));
        }
    }
    Ok(())
}
