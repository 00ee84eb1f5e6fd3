//! The launch order of a list: which entry each block of the force and prune kernels runs
//! (`order[b]`). A launch's blocks start in block order, and the entries lie in the search's
//! (supercluster) order, so long entries that come late leave a tail of a few busy multiprocessors
//! at the end of the launch. Launched longest first, the short entries fill that tail: the force
//! kernel is 5–7 % faster at 45,000 atoms on an H200
//! (`docs/results/nbnxm/entry-order.log`). The entries themselves stay where the search
//! put them; only the order of the blocks changes (and with it the order of the float atomics).
//!
//! [`entry_order`] is the order, and the reference of the GPU's ([`DeviceOrder`], the
//! `nbnxm_order_*` kernels, `kernels-gpu/src/kernels/nbnxm_order.rs`): a counting sort by length
//! over tiles of [`abi::NBNXM_ORDER_TILE`] entries, deterministic, for lists searched on the GPU.
//! Lists searched on the host get their order from [`entry_order`], uploaded with them.

use super::NbnxmError;
use super::gpu_search::grow;
use crate::abi::{self, NbnxmEntry};
use crate::error::{HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use crate::kernel_args;

/// The launch order of `entries`: the stable sort of their indices by length `j_end - j_start`,
/// longest first (entries of equal length keep their order), so the same list always gets the
/// same order.
pub fn entry_order(entries: &[NbnxmEntry]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..entries.len() as u32).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(entries[i as usize].j_end.wrapping_sub(entries[i as usize].j_start)));
    order
}

/// `max_j` (the longest entry the search makes) as the order kernels take it: at least 1, an error
/// beyond [`abi::NBNXM_ORDER_MAX_J`] (the kernels' keys live in shared memory).
pub fn order_max_j(max_j: usize) -> Result<u32> {
    match u32::try_from(max_j) {
        Ok(m) if m <= abi::NBNXM_ORDER_MAX_J => Ok(m.max(1)),
        _ => Err(HaloError::InvalidInput(NbnxmError::EntryTooLong { max_j, most: abi::NBNXM_ORDER_MAX_J }.to_string())),
    }
}

/// The launch order on the GPU (the `nbnxm_order_*` kernels): [`entry_order`] of a list's entries
/// in device memory, written to a device array without a host round trip. Holds the per-tile
/// counts, reused from one list to the next.
pub struct DeviceOrder {
    /// `(max_j + 1) n_tiles` counts, then their exclusive scan.
    counts: DeviceBuffer<u32>,
}

impl DeviceOrder {
    /// An empty count buffer, grown by the first order.
    pub fn new(module: &KernelModule) -> Result<Self> {
        Ok(Self { counts: DeviceBuffer::uninit(module.context(), 1)? })
    }

    /// Tiles of `n_entries` entries.
    fn tiles(n_entries: usize) -> usize {
        n_entries.div_ceil(abi::NBNXM_ORDER_TILE as usize)
    }

    /// Makes room for the counts of lists of up to `n_entries` entries with entries of at most
    /// `max_j` words (reallocating: no order of this object may still be running).
    pub(crate) fn reserve(&mut self, module: &KernelModule, n_entries: usize, max_j: u32) -> Result<()> {
        grow(module, &mut self.counts, (max_j as usize + 1) * Self::tiles(n_entries).max(1))
    }

    /// Enqueues on `stream` the order of the `n_entries` entries at device address `entries` into
    /// the `u32`s at `order`, entries of at most `max_j` words (from [`order_max_j`]). The counts
    /// must have room ([`Self::reserve`]), and a previous order of this object must run before on
    /// the same stream or be complete.
    ///
    /// # Safety
    /// `entries` holds `n_entries` entries (written before, in `stream` order) and `order` room for
    /// `n_entries` `u32`s; both stay allocated until the passes ran.
    pub(crate) unsafe fn enqueue(
        &self,
        module: &KernelModule,
        entries: u64,
        n_entries: usize,
        max_j: u32,
        order: u64,
        stream: &CudaStream,
    ) -> Result<()> {
        if n_entries == 0 {
            return Ok(());
        }
        if n_entries > (u32::MAX - abi::NBNXM_ORDER_TILE) as usize {
            return Err(HaloError::InvalidInput(format!("GPU launch order: {n_entries} entries, more than a u32 index holds")));
        }
        let tiles = Self::tiles(n_entries);
        let keys = max_j.min(abi::NBNXM_ORDER_MAX_J) as usize + 1;
        if self.counts.len() < keys * tiles {
            return Err(HaloError::InvalidInput(format!("GPU launch order: room for {} counts, {keys} keys x {tiles} tiles", self.counts.len())));
        }
        let per_tile = LaunchShape { grid: (tiles as u32, 1), block: abi::NBNXM_ORDER_TILE, shared_bytes: abi::NBNXM_ORDER_SHARED_BYTES };
        let (mut e, mut n, mut mj, mut c, mut o) = (entries, n_entries as u32, max_j, self.counts.device_ptr(), order);
        let mut nc = (keys * tiles) as u32;
        let mut args = kernel_args![e, n, mj, c];
        // SAFETY: arguments match `nbnxm_order_tiles`: `n_entries` entries (the caller's), room for
        // `keys` counts per tile (checked), blocks and shared memory as the ABI says.
        unsafe { module.launch(abi::NBNXM_ORDER_TILES, per_tile, stream, &mut args)? };
        let one = LaunchShape { grid: (1, 1), block: abi::NBNXM_ORDER_SCAN_THREADS, shared_bytes: abi::NBNXM_ORDER_SCAN_SHARED_BYTES };
        let mut args = kernel_args![c, nc];
        // SAFETY: arguments match `nbnxm_order_scan`: the first pass's counts, one block; their sum
        // is `n_entries`, which fits a u32.
        unsafe { module.launch(abi::NBNXM_ORDER_SCAN, one, stream, &mut args)? };
        let mut args = kernel_args![e, n, mj, c, o];
        // SAFETY: arguments match `nbnxm_order_write`: the scan of these entries' counts (same
        // stream, so after it), room for `n_entries` places (the caller's).
        unsafe { module.launch(abi::NBNXM_ORDER_WRITE, per_tile, stream, &mut args) }
    }

    /// Enqueues on `stream` the launch order of the first `n_entries` entries of `entries` (at most
    /// `max_j` words each; an error beyond [`abi::NBNXM_ORDER_MAX_J`]) into `order[..n_entries]`:
    /// [`entry_order`] of them (an entry longer than `max_j` counts as `max_j` long). Nothing is
    /// written past `n_entries`. `entries` must be complete before `stream`'s work (after a
    /// synchronous upload from pageable memory, synchronise the context first), and no order of
    /// this object may still be running (its counts may be reallocated); the caller synchronises
    /// `stream` before reading `order`.
    pub fn build(
        &mut self,
        module: &KernelModule,
        entries: &DeviceBuffer<NbnxmEntry>,
        n_entries: usize,
        max_j: usize,
        order: &DeviceBuffer<u32>,
        stream: &CudaStream,
    ) -> Result<()> {
        let max_j = order_max_j(max_j)?;
        if entries.len() < n_entries || order.len() < n_entries {
            return Err(HaloError::InvalidInput(format!(
                "GPU launch order of {n_entries} entries: {} entries and room for {} given",
                entries.len(),
                order.len()
            )));
        }
        self.reserve(module, n_entries, max_j)?;
        // SAFETY: both buffers hold `n_entries` (checked) and outlive the passes by the caller's
        // synchronisation; the entries are complete before the stream's work (the contract).
        unsafe { self.enqueue(module, entries.device_ptr(), n_entries, max_j, order.device_ptr(), stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn entry(len: u32, at: u32) -> NbnxmEntry {
        NbnxmEntry { sci: at, shift: 13, j_start: 100 * at, j_end: 100 * at + len }
    }

    fn of_lengths(lengths: &[u32]) -> Vec<NbnxmEntry> {
        lengths.iter().enumerate().map(|(i, &l)| entry(l, i as u32)).collect()
    }

    /// What the order must be: a permutation, lengths not increasing, equal lengths in entry order.
    fn check_order(entries: &[NbnxmEntry], order: &[u32]) {
        let len = |i: u32| entries[i as usize].j_end - entries[i as usize].j_start;
        let mut seen = vec![false; entries.len()];
        for &i in order {
            assert!(!std::mem::replace(&mut seen[i as usize], true), "entry {i} twice");
        }
        assert_eq!(order.len(), entries.len());
        for w in order.windows(2) {
            assert!(len(w[0]) > len(w[1]) || (len(w[0]) == len(w[1]) && w[0] < w[1]), "{w:?}: not longest first, stable");
        }
    }

    #[test]
    fn the_order_is_the_stable_sort_longest_first() {
        assert!(entry_order(&[]).is_empty());
        assert_eq!(entry_order(&of_lengths(&[7])), [0]);
        // Equal lengths: the identity.
        assert_eq!(entry_order(&of_lengths(&[32; 100])), (0..100).collect::<Vec<u32>>());
        assert_eq!(entry_order(&of_lengths(&[1, 32, 5, 32, 1, 7, 32])), [1, 3, 6, 5, 2, 0, 4]);
        // Lengths 1 and max_j only, and the lengths the split makes (1..=max_j), at random.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(40);
        for (n, max_j) in [(1000, 32), (5000, 1), (3000, 64), (257, 5)] {
            let ends = of_lengths(&(0..n).map(|_| if rng.random_bool(0.5) { 1 } else { max_j }).collect::<Vec<_>>());
            let order = entry_order(&ends);
            check_order(&ends, &order);
            let longest = ends.iter().filter(|e| e.j_end - e.j_start == max_j).count();
            assert!(order[..longest].iter().all(|&i| ends[i as usize].j_end - ends[i as usize].j_start == max_j));
            let random = of_lengths(&(0..n).map(|_| rng.random_range(1..=max_j)).collect::<Vec<_>>());
            check_order(&random, &entry_order(&random));
        }
    }

    /// The `nbnxm_order_*` passes on the CPU: tiles of `NBNXM_ORDER_TILE` entries and warps of 32,
    /// per warp the ranks among the lanes of the same key and the warp's count of each key, those
    /// scanned over the warps, the tiles' counts scanned key by key, then each entry's place.
    fn passes(entries: &[NbnxmEntry], max_j: u32) -> Vec<u32> {
        let (tile, warps) = (abi::NBNXM_ORDER_TILE as usize, abi::NBNXM_ORDER_WARPS as usize);
        let max_j = max_j.min(abi::NBNXM_ORDER_MAX_J);
        let keys = max_j as usize + 1;
        let key = |e: &NbnxmEntry| abi::nbnxm_order_key(e.j_end.wrapping_sub(e.j_start), max_j) as usize;
        let n_tiles = entries.len().div_ceil(tile);
        // Per tile: each entry's rank in its warp, the warps' starts per key, the tile's counts.
        let mut ranks = vec![0usize; entries.len()];
        let mut warp_starts = vec![vec![[0usize; abi::NBNXM_ORDER_KEYS as usize]; warps]; n_tiles];
        let mut counts = vec![0u32; keys * n_tiles];
        for t in 0..n_tiles {
            let mut per_warp = vec![[0usize; abi::NBNXM_ORDER_KEYS as usize]; warps];
            for (w, counts_w) in per_warp.iter_mut().enumerate() {
                let lanes: Vec<Option<usize>> = (0..32).map(|l| entries.get(t * tile + w * 32 + l).map(key)).collect();
                for (l, k) in lanes.iter().enumerate() {
                    if let Some(k) = k {
                        // match.any, the peers below this lane, and the lowest lane's count.
                        let below = lanes[..l].iter().filter(|o| *o == &Some(*k)).count();
                        ranks[t * tile + w * 32 + l] = below;
                        if below == 0 {
                            counts_w[*k] = lanes.iter().filter(|o| *o == &Some(*k)).count();
                        }
                    }
                }
            }
            for k in 0..keys {
                let mut run = 0;
                for w in 0..warps {
                    warp_starts[t][w][k] = run;
                    run += per_warp[w][k];
                }
                counts[k * n_tiles + t] = run as u32;
            }
        }
        // The scan, then each entry's place.
        let mut run = 0;
        for c in counts.iter_mut() {
            (*c, run) = (run, run + *c);
        }
        let mut order = vec![u32::MAX; entries.len()];
        for (i, e) in entries.iter().enumerate() {
            let (t, w, k) = (i / tile, (i % tile) / 32, key(e));
            order[counts[k * n_tiles + t] as usize + warp_starts[t][w][k] + ranks[i]] = i as u32;
        }
        order
    }

    #[test]
    fn the_gpu_order_passes_give_the_host_order() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x0de7);
        let tile = abi::NBNXM_ORDER_TILE as usize;
        for (n, max_j) in [(0, 32), (1, 32), (31, 1), (tile - 1, 32), (tile, 5), (tile + 1, 64), (3 * tile + 17, 32), (20_000, 64), (4000, 2)] {
            let entries = of_lengths(&(0..n).map(|_| rng.random_range(1..=max_j)).collect::<Vec<_>>());
            assert_eq!(passes(&entries, max_j), entry_order(&entries), "{n} entries, max_j {max_j}");
        }
        // Runs of one length (a warp all of one key) and lengths 0 (sorted last, as the host does).
        let runs = of_lengths(&(0..3000u32).map(|i| if (i / 100) % 2 == 0 { 32 } else { i % 3 }).collect::<Vec<_>>());
        assert_eq!(passes(&runs, 32), entry_order(&runs));
    }

    #[test]
    fn entries_longer_than_the_kernels_sort_are_refused() {
        assert_eq!(order_max_j(32).unwrap(), 32);
        assert_eq!(order_max_j(0).unwrap(), 1);
        assert_eq!(order_max_j(abi::NBNXM_ORDER_MAX_J as usize).unwrap(), abi::NBNXM_ORDER_MAX_J);
        for bad in [abi::NBNXM_ORDER_MAX_J as usize + 1, usize::MAX] {
            let e = order_max_j(bad).unwrap_err().to_string();
            assert!(e.contains("at most 64 words") && e.contains(&bad.to_string()), "{e}");
        }
    }
}
