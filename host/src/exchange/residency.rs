//! How many blocks per pulse the spinning kernels of the ranks sharing one GPU may have, so that
//! every block one of them waits for can become resident (a waiting block must never starve the
//! block it waits for).
//!
//! A fused kernel is launched to overlap the previous kernel of its stream (programmatic dependent
//! launch, [`crate::gpu::KernelModule::launch_overlapping`]) and lets the next one start at its
//! own start (`griddepcontrol.launch_dependents`, once all its blocks are resident). So a rank may
//! hold two grids at once: the running one, spinning on its peers, and the next one, whose blocks
//! sit resident in `griddepcontrol.wait` until the first completes. The next one of those cannot
//! start before the parked one has run (it lets dependents start only after its own wait), so two
//! is the most. Counting one grid per rank let a rank's parked grid take the room a peer's grid
//! needed, and the running grid spun on that peer until its deadline.

/// The cap for the spinning grids of one rank, and whether its fused kernels overlap the kernel
/// before them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResidentGrids {
    /// Blocks per pulse of every spinning kernel ([`super::RankExchange::cap_grids`]).
    pub per_pulse: u32,
    /// Whether the fused kernels are launched to overlap the previous kernel: only where two grids
    /// of every rank fit at once.
    pub overlapped: bool,
}

/// Grids one rank may have resident at once when its fused kernels overlap (see the module).
pub const OVERLAPPED_GRIDS_PER_RANK: u32 = 2;

/// The grids of `sharing` ranks of `pulses` pulses each on a GPU that holds `capacity` resident
/// blocks of the spinning kernels, `reserved` of them kept for other kernels: overlapped launches
/// with two grids per rank where every pulse still gets a block, else one grid per rank and
/// launches that wait for the previous kernel to end; `None` when not even that fits.
pub fn fit(capacity: u32, reserved: u32, sharing: u32, pulses: usize) -> Option<ResidentGrids> {
    let room = capacity.saturating_sub(reserved);
    let grid = (pulses.max(1) as u32).saturating_mul(sharing.max(1));
    let overlapped = room / grid.saturating_mul(OVERLAPPED_GRIDS_PER_RANK);
    if overlapped > 0 {
        return Some(ResidentGrids { per_pulse: overlapped, overlapped: true });
    }
    let alone = room / grid;
    (alone > 0).then_some(ResidentGrids { per_pulse: alone, overlapped: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks resident at the worst moment: every rank with a running grid and, when overlapped,
    /// the next grid parked beside it.
    fn peak(g: ResidentGrids, sharing: u32, pulses: usize) -> u32 {
        let grids = if g.overlapped { OVERLAPPED_GRIDS_PER_RANK } else { 1 };
        grids * sharing * pulses as u32 * g.per_pulse
    }

    #[test]
    fn overlapped_grids_cap() {
        // Two ranks of three pulses on 132 SMs x 2 blocks: each rank's running grid and its parked
        // successor must fit together, 22 blocks per pulse (44 left room for one grid per rank only).
        assert_eq!(fit(264, 0, 2, 3), Some(ResidentGrids { per_pulse: 22, overlapped: true }));
        for capacity in [1, 2, 7, 132, 264, 1000] {
            for reserved in [0, 1, 8] {
                for sharing in 1..=24 {
                    for pulses in 1..=6 {
                        let Some(g) = fit(capacity, reserved, sharing, pulses) else {
                            // Refused only when one block per pulse per rank does not fit.
                            assert!(capacity.saturating_sub(reserved) < sharing * pulses as u32, "{capacity} {reserved} {sharing} {pulses}");
                            continue;
                        };
                        assert!(g.per_pulse >= 1);
                        assert!(peak(g, sharing, pulses) + reserved <= capacity, "{g:?}: {capacity} {reserved} {sharing} {pulses}");
                        // Overlap is given up only where two grids per rank cannot all have a block.
                        assert_eq!(g.overlapped, 2 * sharing * pulses as u32 <= capacity.saturating_sub(reserved), "{g:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_full_gpu_runs_one_grid_per_rank_without_overlap() {
        // 22 ranks x 6 pulses on 132 blocks: one block each, no room for a parked grid.
        assert_eq!(fit(132, 0, 22, 6), Some(ResidentGrids { per_pulse: 1, overlapped: false }));
        assert_eq!(fit(132, 0, 23, 6), None);
        assert_eq!(fit(132, 132, 1, 1), None, "everything reserved");
    }
}
