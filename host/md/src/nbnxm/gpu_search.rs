//! The cluster-pair search on the GPU (`nbnxm_search_count`, `nbnxm_search_write`): the host sorts
//! the atoms into the cluster grid and uploads it, the GPU finds the j-cluster words of every
//! (i-supercluster, shift) item, the host turns the counts into the lists' layout ([`layout`]),
//! and the GPU writes the words there. The lists equal [`super::PairSearch`]'s word for word (same
//! rule, same `f32` arithmetic, same order), which `tests/gpu_nbnxm.rs` checks.

use super::grid::{BBox, ClusterGrid};
use super::pairlist::{list_cutoff2, shifts, split_entries};
use crate::abi::{self, NbnxmBox, NbnxmEntry, NbnxmShift, NbnxmZone};
use crate::error::{CudaContextExt, Result};
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

fn to_box(b: &BBox) -> NbnxmBox {
    NbnxmBox { lo: b.lo, hi: b.hi }
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

/// The grid as the search kernels read it, and the pass buffer (counts, then offsets).
pub(crate) struct GpuSearch {
    super_bbox: DeviceBuffer<NbnxmBox>,
    cluster_bbox: DeviceBuffer<NbnxmBox>,
    super_zone: DeviceBuffer<u32>,
    zones: DeviceBuffer<NbnxmZone>,
    column_start: DeviceBuffer<u32>,
    shifts: DeviceBuffer<NbnxmShift>,
    counts: DeviceBuffer<u32>,
}

/// The two passes' common arguments.
struct Args {
    sb: u64,
    cb: u64,
    sz: u64,
    zones: u64,
    n_zones: u32,
    cs: u64,
    shifts: u64,
    n_shifts: u32,
    n_super: u32,
    rl: f32,
    rl2: f32,
}

impl GpuSearch {
    pub(crate) fn new(module: &KernelModule) -> Result<Self> {
        let ctx = module.context();
        Ok(Self {
            super_bbox: DeviceBuffer::uninit(ctx, 1)?,
            cluster_bbox: DeviceBuffer::uninit(ctx, 1)?,
            super_zone: DeviceBuffer::uninit(ctx, 1)?,
            zones: DeviceBuffer::uninit(ctx, 1)?,
            column_start: DeviceBuffer::uninit(ctx, 1)?,
            shifts: DeviceBuffer::uninit(ctx, 1)?,
            counts: DeviceBuffer::uninit(ctx, 1)?,
        })
    }

    fn shape(items: usize) -> LaunchShape {
        let blocks = items.div_ceil(abi::NBNXM_SEARCH_WARPS_PER_BLOCK as usize).max(1) as u32;
        LaunchShape { grid: (blocks, 1), block: abi::NBNXM_SEARCH_WARPS_PER_BLOCK * 32, shared_bytes: abi::NBNXM_SEARCH_SHARED_BYTES }
    }

    /// Runs both passes for `grid` at list cutoff `rl` on `stream`: `out(words)` gets the layout
    /// and returns the two device word arrays (home–home, with halo) to write into, each with room
    /// for `words[kind]` words. Returns the layout; the words are written when `stream` is done
    /// (it is synchronised before returning).
    pub(crate) fn run(
        &mut self, module: &KernelModule, grid: &ClusterGrid, rl: f32, max_j: usize, stream: &CudaStream,
        out: &mut dyn FnMut(&Layout) -> Result<[u64; 2]>,
    ) -> Result<Layout> {
        let shifts: Vec<(u32, [f32; 3])> = shifts(grid);
        let n_super = grid.superclusters();
        let items = n_super * shifts.len();
        let shift_index: Vec<u32> = shifts.iter().map(|s| s.0).collect();
        if items == 0 {
            let l = layout(&[], &shift_index, max_j);
            out(&l)?;
            return Ok(l);
        }
        fit(module, &mut self.super_bbox, &grid.super_bbox.iter().map(to_box).collect::<Vec<_>>())?;
        fit(module, &mut self.cluster_bbox, &grid.cluster_bbox.iter().map(to_box).collect::<Vec<_>>())?;
        fit(module, &mut self.super_zone, &grid.super_zone.iter().map(|&z| u32::from(z)).collect::<Vec<_>>())?;
        let mut flat = Vec::new();
        let zones: Vec<NbnxmZone> = grid
            .zones
            .iter()
            .map(|z| {
                let base = flat.len() as u32;
                flat.extend_from_slice(&z.column_start);
                NbnxmZone {
                    extent: to_box(&z.extent),
                    cell: z.cell,
                    columns: [z.columns[0] as u32, z.columns[1] as u32],
                    column_base: base,
                    sc_end: z.superclusters().end as u32,
                    zone: u32::from(z.zone),
                    reserved: 0,
                }
            })
            .collect();
        fit(module, &mut self.zones, &zones)?;
        fit(module, &mut self.column_start, &flat)?;
        fit(module, &mut self.shifts, &shifts.iter().map(|&(index, v)| NbnxmShift { v, index }).collect::<Vec<_>>())?;
        grow(module, &mut self.counts, 2 * items)?;
        let a = Args {
            sb: self.super_bbox.device_ptr(),
            cb: self.cluster_bbox.device_ptr(),
            sz: self.super_zone.device_ptr(),
            zones: self.zones.device_ptr(),
            n_zones: zones.len() as u32,
            cs: self.column_start.device_ptr(),
            shifts: self.shifts.device_ptr(),
            n_shifts: shifts.len() as u32,
            n_super: n_super as u32,
            rl,
            rl2: list_cutoff2(rl),
        };
        // The synchronous uploads above may still be in flight (pageable memory): order them first.
        module.context().synchronize().during("waiting for the grid's upload")?;
        let (mut sb, mut cb, mut sz, mut zp, mut nz, mut cs) = (a.sb, a.cb, a.sz, a.zones, a.n_zones, a.cs);
        let (mut sp, mut ns, mut nsc, mut rlv, mut rl2, mut counts) = (a.shifts, a.n_shifts, a.n_super, a.rl, a.rl2, self.counts.device_ptr());
        let mut args = kernel_args![sb, cb, sz, zp, nz, cs, sp, ns, nsc, rlv, rl2, counts];
        // SAFETY: arguments match `nbnxm_search_count`; the arrays were built from `grid` just now
        // (every column range and supercluster index inside them), `counts` holds 2 items.
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
