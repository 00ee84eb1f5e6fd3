//! The cluster-pair search on the GPU (`nbnxm_search_count`, `nbnxm_search_write`) on a grid in
//! device memory ([`DeviceGrid`]: uploaded from the host's sort, or built on the GPU): the GPU
//! finds the j-cluster words of every (i-supercluster, shift) item, the host turns the counts
//! into the lists' layout ([`layout`]), and the GPU writes the words there. The lists equal
//! [`super::PairSearch`]'s word for word (same rule, same `f32` arithmetic, same order), which
//! `tests/gpu_nbnxm.rs` and `tests/gpu_grid.rs` check.

use super::gpu_grid::DeviceGrid;
use super::pairlist::{list_cutoff2, shifts_of, split_entries};
use crate::abi::{self, NbnxmEntry, NbnxmShift};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use crate::kernel_args;
use bytemuck::Pod;

/// Where each list's words go and its entries, from the per-item counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// `2 item + kind`: the first word of the item's words in list `kind` (0: home–home).
    pub offsets: Vec<u32>,
    /// The entries of each list.
    pub entries: [Vec<NbnxmEntry>; 2],
    /// Words of each list.
    pub words: [usize; 2],
}

/// The lists' layout from `counts` (`2 item + kind`, items `sci * n_shifts + s`): items in order,
/// each item's words split into entries of at most `max_j` words, as the host search lays them out.
pub fn layout(counts: &[u32], shift_index: &[u32], max_j: usize) -> Layout {
    let n_shifts = shift_index.len().max(1);
    let mut out = Layout { offsets: vec![0; counts.len()], ..Layout::default() };
    for (item, pair) in counts.chunks_exact(2).enumerate() {
        let (sci, shift) = ((item / n_shifts) as u32, shift_index.get(item % n_shifts).copied().unwrap_or(abi::NBNXM_CENTRAL_SHIFT));
        for (kind, &count) in pair.iter().enumerate() {
            let start = out.words[kind] as u32;
            out.offsets[2 * item + kind] = start;
            out.entries[kind].extend(split_entries(sci, shift, start, count, max_j));
            out.words[kind] += count as usize;
        }
    }
    out
}

/// Copies `data` into `buf`, reallocating (with 25% headroom) when it does not fit.
pub fn fit<T: Pod>(module: &KernelModule, buf: &mut DeviceBuffer<T>, data: &[T]) -> Result<()> {
    grow(module, buf, data.len())?;
    buf.copy_from_host(data)
}

/// Makes `buf` hold at least `len` elements (reallocating with 25% headroom; contents lost then).
pub(crate) fn grow<T: Pod>(module: &KernelModule, buf: &mut DeviceBuffer<T>, len: usize) -> Result<()> {
    if buf.len() < len {
        *buf = DeviceBuffer::uninit(module.context(), len + len / 4)?;
    }
    Ok(())
}

/// The search's own buffers (the grid's are a [`DeviceGrid`]'s): the shifts and the pass buffer
/// (counts, then offsets).
pub(crate) struct GpuSearch {
    shifts: DeviceBuffer<NbnxmShift>,
    /// The shifts `shifts` holds (uploaded again only when they change).
    uploaded: Vec<(u32, [f32; 3])>,
    counts: DeviceBuffer<u32>,
}

impl GpuSearch {
    pub(crate) fn new(module: &KernelModule) -> Result<Self> {
        let ctx = module.context();
        Ok(Self { shifts: DeviceBuffer::uninit(ctx, 1)?, uploaded: Vec::new(), counts: DeviceBuffer::uninit(ctx, 1)? })
    }

    fn shape(items: usize) -> LaunchShape {
        let blocks = items.div_ceil(abi::NBNXM_SEARCH_WARPS_PER_BLOCK as usize).max(1) as u32;
        LaunchShape { grid: (blocks, 1), block: abi::NBNXM_SEARCH_WARPS_PER_BLOCK * 32, shared_bytes: abi::NBNXM_SEARCH_SHARED_BYTES }
    }

    /// Runs both passes on the grid `grid` holds (uploaded from the host, or built on the GPU on
    /// `stream`) at list cutoff `rl` on `stream`: `out(layout)` gets the layout and returns the two
    /// device word arrays (home–home, with halo) to write into, each with room for `words[kind]`
    /// words. Returns the layout; the words are written when this returns (`stream` and the
    /// context are synchronised).
    pub(crate) fn run(
        &mut self, module: &KernelModule, grid: &DeviceGrid, rl: f32, max_j: usize, stream: &CudaStream,
        out: &mut dyn FnMut(&Layout) -> Result<[u64; 2]>,
    ) -> Result<Layout> {
        let held = grid.held().ok_or_else(|| HaloError::InvalidInput("the GPU search needs a grid on the device".into()))?;
        let shifts = shifts_of(held.periodic, held.box_size);
        let n_super = held.superclusters;
        let items = n_super * shifts.len();
        let shift_index: Vec<u32> = shifts.iter().map(|s| s.0).collect();
        if items == 0 {
            let l = layout(&[], &shift_index, max_j);
            out(&l)?;
            return Ok(l);
        }
        if self.uploaded != shifts {
            fit(module, &mut self.shifts, &shifts.iter().map(|&(index, v)| NbnxmShift { v, index }).collect::<Vec<_>>())?;
            self.uploaded = shifts.clone();
        }
        grow(module, &mut self.counts, 2 * items)?;
        let (mut sb, mut cb, mut sz, mut zp) =
            (grid.super_bbox.device_ptr(), grid.cluster_bbox.device_ptr(), grid.super_zone.device_ptr(), grid.zones.device_ptr());
        let (mut nz, mut cs, mut sp, mut ns) = (held.zones as u32, grid.column_start.device_ptr(), self.shifts.device_ptr(), shifts.len() as u32);
        let (mut nsc, mut rlv, mut rl2, mut counts) = (n_super as u32, rl, list_cutoff2(rl), self.counts.device_ptr());
        // Synchronous uploads (the grid's, the shifts) may still be in flight (pageable memory):
        // order them first.
        module.context().synchronize().during("waiting for the grid's upload")?;
        let mut args = kernel_args![sb, cb, sz, zp, nz, cs, sp, ns, nsc, rlv, rl2, counts];
        // SAFETY: arguments match `nbnxm_search_count`; the grid's arrays describe `n_super`
        // superclusters in `nz` zones (every column range and supercluster index inside them),
        // `counts` holds 2 per item.
        unsafe { module.launch(abi::NBNXM_SEARCH_COUNT, Self::shape(items), stream, &mut args)? };
        stream.synchronize().during("waiting for the search's counts")?;
        let mut counts_host = self.counts.to_host()?;
        counts_host.truncate(2 * items);
        let l = layout(&counts_host, &shift_index, max_j);
        let [mut jl, mut jn] = out(&l)?;
        self.counts.copy_from_host(&l.offsets)?;
        module.context().synchronize().during("waiting for the search's offsets")?;
        let mut offsets = self.counts.device_ptr();
        let mut args = kernel_args![sb, cb, sz, zp, nz, cs, sp, ns, nsc, rlv, rl2, offsets, jl, jn];
        // SAFETY: arguments match `nbnxm_search_write`; as above, and `out` gave arrays with room
        // for every word the counts announced.
        unsafe { module.launch(abi::NBNXM_SEARCH_WRITE, Self::shape(items), stream, &mut args)? };
        stream.synchronize().during("waiting for the search's words")?;
        Ok(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbnxm::pairlist::shifts;
    use crate::nbnxm::{ClusterPairList, LocalAtoms, PairSearch, SearchOptions};
    use crate::system::MolecularSystem;

    #[test]
    fn the_layout_of_the_counts_is_the_host_lists_layout() {
        // The host search's own word counts per item, laid out again: the same entries.
        let s = MolecularSystem::generate(3000, 4).unwrap();
        let types: Vec<u32> = s.types.iter().map(|&t| u32::from(t)).collect();
        let one = LocalAtoms::single_rank(&s.positions, &types, 2, s.box_size).unwrap();
        let plan = crate::decomp::HaloPlan::build(&s, crate::decomp::RankGrid::new([2, 2, 1]).unwrap(), 1.2).unwrap();
        let corner = LocalAtoms::from_plan(&plan, 3, &s.positions, &s.types).unwrap();
        for (a, max_j) in [(&one, 32), (&one, 7), (&corner, 32), (&corner, 5)] {
            let search = PairSearch::build(a, &SearchOptions { max_j_per_entry: max_j, ..SearchOptions::new(1.2) }).unwrap();
            let sh: Vec<u32> = shifts(&search.grid).iter().map(|s| s.0).collect();
            let items = search.grid.superclusters() * sh.len();
            let mut counts = vec![0u32; 2 * items];
            for (kind, list) in [&search.local, &search.nonlocal].into_iter().enumerate() {
                for e in &list.entries {
                    let s_slot = sh.iter().position(|&i| i == e.shift).unwrap();
                    counts[2 * (e.sci as usize * sh.len() + s_slot) + kind] += e.j_end - e.j_start;
                }
            }
            let l = layout(&counts, &sh, max_j);
            let check = |kind: usize, list: &ClusterPairList| {
                assert_eq!(l.entries[kind], list.entries, "max_j {max_j}, list {kind}");
                assert_eq!(l.words[kind], list.j_list.len());
            };
            check(0, &search.local);
            check(1, &search.nonlocal);
            assert!(!search.local.is_empty());
            // Every item's offset is where its first entry starts.
            for e in &search.local.entries {
                let s_slot = sh.iter().position(|&i| i == e.shift).unwrap();
                assert!(l.offsets[2 * (e.sci as usize * sh.len() + s_slot)] <= e.j_start);
            }
        }
        assert_eq!(layout(&[], &[13], 32), Layout::default());
    }
}
