//! The second application's kernel (`examples/stencil3d`): one Jacobi step of the 7-point heat
//! stencil over an index-mapped neighbour table. It knows nothing about the halo: the exchange
//! fills the ghost cells before it runs, and the table says where each neighbour lives locally.

use crate::device::thread;

kernel! {
    /// One Jacobi step for the first `n` (interior) cells:
    /// `u_out[i] = u_in[i] + alpha * (s - 6 * u_in[i])`, with
    /// `s = ((((u_in[nb[0]] + u_in[nb[1]]) + u_in[nb[2]]) + u_in[nb[3]]) + u_in[nb[4]]) + u_in[nb[5]]`
    /// and `nb = neighbours[i]` in the order -x, +x, -y, +y, -z, +z. Grid-stride over `i`.
    ///
    /// Contract (the host's, checked where the table is built):
    /// - `u_in` holds every index that appears in `neighbours[0..n]` (interior cells `[0, n)` and
    ///   ghost cells after them) and those values are final for this step on this stream;
    /// - `u_out` holds `n` elements and does not overlap `u_in[0..n]` nor any ghost cell read;
    /// - `neighbours` holds `n` entries.
    ///
    /// Rounding: every operation is a separate IEEE-754 binary32 operation rounded to nearest
    /// (rustc emits `add.rn.f32` / `mul.rn.f32`, which ptxas may not contract into FMA), in the
    /// order written above, so a CPU evaluating the same expression in the same order gets the
    /// same bits.
    fn jacobi7(u_in: *const f32, u_out: *mut f32, neighbours: *const [u32; 6], n: u32, alpha: f32) {
        let mut i = thread::index_1d();
        while i < n {
            // SAFETY: i < n and the host's contract above on u_in, u_out and neighbours.
            unsafe {
                let nb = *neighbours.add(i as usize);
                let u = *u_in.add(i as usize);
                let at = |k: usize| *u_in.add(nb[k] as usize);
                let s = ((((at(0) + at(1)) + at(2)) + at(3)) + at(4)) + at(5);
                *u_out.add(i as usize) = u + alpha * (s - 6.0 * u);
            }
            i += thread::grid_stride_x();
        }
    }
}
