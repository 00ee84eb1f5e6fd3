//! The cluster grid on the GPU: the device buffers the force, prune and search kernels read (slots,
//! types, boxes, zones, column starts), filled either by uploading a host [`ClusterGrid`] (any
//! rank, any zones) or by building the grid of one undecomposed rank on the GPU
//! ([`DeviceGrid::build`]: the `nbnxm_grid_*` kernels, `kernels-gpu/src/kernels/nbnxm_grid.rs`),
//! which gives exactly the grid `ClusterGrid::build(&LocalAtoms::single_rank(..))` gives on the
//! host, slot for slot and box for box (`tests/gpu_grid.rs` checks it).
//!
//! A build enqueues five passes on the caller's stream and synchronises once, to read back three
//! words: the superclusters, the first atom with a non-finite coordinate, the largest atom type.
//! The buffers are reused from one build to the next, grown with headroom when a build needs more.

use super::NbnxmError;
use super::gpu_search::{fit, grow};
use super::grid::{BBox, ClusterGrid, ZoneGrid, column_shape};
use crate::abi::{self, Float3, NBNXM_MASK_BITS, NbnxmBox, NbnxmZone};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use crate::kernel_args;

const SS: usize = abi::NBNXM_SUPER_SIZE as usize;
const SC: usize = abi::NBNXM_CLUSTERS_PER_SUPER as usize;

/// What a GPU build produced: the grid's size and its one zone's column shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GridInfo {
    /// Atoms in the grid (all home).
    pub atoms: usize,
    /// Superclusters (64 slots each).
    pub superclusters: usize,
    /// Clusters (8 per supercluster, empty ones included).
    pub clusters: usize,
    /// Columns along x and y (none without atoms).
    pub columns: [usize; 2],
    /// Column widths along x and y (nm).
    pub cell: [f32; 2],
    /// The zone's extent: `[0, box)` along every dimension.
    pub extent: BBox,
    /// Box edges (nm).
    pub box_size: [f32; 3],
    /// The largest atom type among the atoms (0 without atoms).
    pub max_type: u32,
}

/// What the search kernels need to know of the grid the buffers hold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Held {
    /// Superclusters.
    pub(crate) superclusters: usize,
    /// Zones with atoms (entries of `zones`).
    pub(crate) zones: usize,
    /// Dimensions searched through periodic images.
    pub(crate) periodic: [bool; 3],
    /// Box edges (nm).
    pub(crate) box_size: [f32; 3],
    /// Whether the search buffers were copied from pageable host memory ([`DeviceGrid::upload_boxes`]:
    /// the copies may still be in flight) rather than built on the GPU (complete when the build returns).
    pub(crate) uploaded: bool,
}

/// The working arrays of a GPU build.
struct Scratch {
    /// Column of every atom.
    atom_column: DeviceBuffer<u32>,
    /// Atoms per column.
    counts: DeviceBuffer<u32>,
    /// First place of every column, and the total.
    atom_start: DeviceBuffer<u32>,
    /// Next free place of every column while scattering.
    cursor: DeviceBuffer<u32>,
    /// Keys `(z, atom)` by column, unordered within a column.
    keys: DeviceBuffer<u64>,
    /// The same keys sorted within each column.
    sorted: DeviceBuffer<u64>,
    /// The three words read back ([`abi::NBNXM_GRID_INFO_WORDS`]).
    info: DeviceBuffer<u32>,
}

/// One rank's cluster grid in device memory (see the module docs).
pub struct DeviceGrid {
    /// Local atom of every slot, `NBNXM_FILLER` for padding.
    pub(crate) atom_index: DeviceBuffer<u32>,
    /// Atom type of every slot (0 for padding).
    pub(crate) atom_type: DeviceBuffer<u32>,
    /// Box of every cluster.
    pub(crate) cluster_bbox: DeviceBuffer<NbnxmBox>,
    /// Box of every supercluster.
    pub(crate) super_bbox: DeviceBuffer<NbnxmBox>,
    /// Zone of every supercluster.
    pub(crate) super_zone: DeviceBuffer<u32>,
    /// The column grid of every zone.
    pub(crate) zones: DeviceBuffer<NbnxmZone>,
    /// Every zone's column starts, one after the other (`NbnxmZone::column_base`).
    pub(crate) column_start: DeviceBuffer<u32>,
    scratch: Scratch,
    /// The grid the search buffers hold (`None` after an upload of the slots alone, or a failed build).
    held: Option<Held>,
    /// The last GPU build, while its grid is held.
    built: Option<GridInfo>,
}

impl DeviceGrid {
    /// Empty buffers (one element each), grown by the first build or upload.
    pub fn new(module: &KernelModule) -> Result<Self> {
        let ctx = module.context();
        Ok(Self {
            atom_index: DeviceBuffer::uninit(ctx, 1)?,
            atom_type: DeviceBuffer::uninit(ctx, 1)?,
            cluster_bbox: DeviceBuffer::uninit(ctx, 1)?,
            super_bbox: DeviceBuffer::uninit(ctx, 1)?,
            super_zone: DeviceBuffer::uninit(ctx, 1)?,
            zones: DeviceBuffer::uninit(ctx, 1)?,
            column_start: DeviceBuffer::uninit(ctx, 1)?,
            scratch: Scratch {
                atom_column: DeviceBuffer::uninit(ctx, 1)?,
                counts: DeviceBuffer::uninit(ctx, 1)?,
                atom_start: DeviceBuffer::uninit(ctx, 1)?,
                cursor: DeviceBuffer::uninit(ctx, 1)?,
                keys: DeviceBuffer::uninit(ctx, 1)?,
                sorted: DeviceBuffer::uninit(ctx, 1)?,
                info: DeviceBuffer::uninit(ctx, abi::NBNXM_GRID_INFO_WORDS)?,
            },
            held: None,
            built: None,
        })
    }

    /// The grid the search buffers hold, if any.
    pub(crate) fn held(&self) -> Option<Held> {
        self.held
    }

    /// The last GPU build's shape, while its grid is held.
    pub fn info(&self) -> Option<GridInfo> {
        self.built
    }

    /// Uploads `grid`'s slots and types (what the force and prune kernels read), synchronously;
    /// the search buffers no longer describe a grid until [`Self::upload_boxes`].
    pub(crate) fn upload_slots(&mut self, module: &KernelModule, grid: &ClusterGrid) -> Result<()> {
        self.held = None;
        self.built = None;
        fit(module, &mut self.atom_index, &grid.atom_index)?;
        fit(module, &mut self.atom_type, &grid.atom_type)
    }

    /// Uploads what the search kernels read of `grid` (boxes, zones, column starts), synchronously
    /// from the host's side (the copies may still be in flight on the device: the caller orders
    /// them before a launch).
    pub(crate) fn upload_boxes(&mut self, module: &KernelModule, grid: &ClusterGrid) -> Result<()> {
        self.held = None;
        self.built = None;
        let to_box = |b: &BBox| NbnxmBox { lo: b.lo, hi: b.hi };
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
        self.held =
            Some(Held { superclusters: grid.superclusters(), zones: zones.len(), periodic: grid.periodic, box_size: grid.box_size, uploaded: true });
        Ok(())
    }

    /// Builds the cluster grid of `n` atoms at `x` (device coordinates; wrapped into the box in
    /// place first when `wrap`, exactly as `decomp::wrap_position` wraps them) with atom types
    /// `types` (one per atom), all home, every dimension periodic in a box of `box_size`: the grid
    /// of `ClusterGrid::build(&LocalAtoms::single_rank(..))`. Enqueues the passes on `stream` and
    /// synchronises it. An atom with a non-finite coordinate is an error naming the first such atom
    /// (the buffers then hold no grid; the finite atoms' coordinates may be wrapped already).
    #[allow(clippy::too_many_arguments)]
    pub fn build(
        &mut self, module: &KernelModule, x: &impl DeviceMemory<Float3>, types: &DeviceBuffer<u32>, n: usize, box_size: [f32; 3], wrap: bool,
        stream: &CudaStream,
    ) -> Result<GridInfo> {
        self.held = None;
        self.built = None;
        let bad = |m: String| Err(HaloError::InvalidInput(format!("GPU cluster grid: {m}")));
        if x.len() < n || types.len() < n {
            return bad(format!("{n} atoms, but the coordinates hold {} and the types {}", x.len(), types.len()));
        }
        if !box_size.iter().all(|l| l.is_finite() && *l > 0.0) {
            return bad(format!("box {box_size:?} must have positive finite edges"));
        }
        if n >= u32::MAX as usize {
            return bad(format!("{n} atoms, more than a u32 index holds"));
        }
        let extent = BBox { lo: [0.0; 3], hi: box_size };
        let mut info = GridInfo { atoms: n, superclusters: 0, clusters: 0, columns: [0; 2], cell: [0.0; 2], extent, box_size, max_type: 0 };
        if n == 0 {
            self.held = Some(Held { superclusters: 0, zones: 0, periodic: [true; 3], box_size, uploaded: false });
            self.built = Some(info);
            return Ok(info);
        }
        let (columns, cell) = column_shape(&extent, n);
        let ncol = columns[0] * columns[1];
        // At most one partly filled supercluster per column.
        let most = n.div_ceil(SS) + ncol;
        grow(module, &mut self.atom_index, most * SS)?;
        grow(module, &mut self.atom_type, most * SS)?;
        grow(module, &mut self.cluster_bbox, most * SC)?;
        grow(module, &mut self.super_bbox, most)?;
        grow(module, &mut self.super_zone, most)?;
        grow(module, &mut self.zones, 1)?;
        grow(module, &mut self.column_start, ncol + 1)?;
        let s = &mut self.scratch;
        grow(module, &mut s.atom_column, n)?;
        grow(module, &mut s.counts, ncol)?;
        grow(module, &mut s.atom_start, ncol + 1)?;
        grow(module, &mut s.cursor, ncol)?;
        grow(module, &mut s.keys, n)?;
        grow(module, &mut s.sorted, n)?;
        s.counts.zero_range_async(0, ncol, stream)?;
        s.info.fill_bytes_async(0xff, stream)?;
        s.info.zero_range_async(abi::NBNXM_GRID_INFO_MAX_TYPE, 1, stream)?;

        let (mut px, mut nn, [mut bx, mut by, mut bz]) = (x.device_ptr(), n as u32, box_size);
        let (mut wr, [mut cx, mut cy], [mut nx, mut ny]) = (u32::from(wrap), cell, [columns[0] as u32, columns[1] as u32]);
        let (mut col, mut counts, mut info_p, mut ty) = (s.atom_column.device_ptr(), s.counts.device_ptr(), s.info.device_ptr(), types.device_ptr());
        let per_atom =
            LaunchShape { grid: (n.div_ceil(abi::NBNXM_GRID_THREADS as usize) as u32, 1), block: abi::NBNXM_GRID_THREADS, shared_bytes: 0 };
        let mut args = kernel_args![px, nn, bx, by, bz, wr, cx, cy, nx, ny, col, counts, info_p, ty];
        // SAFETY: arguments match `nbnxm_grid_bin`; `x` and `types` hold `n` atoms (checked), the
        // column array `n`, the counts `nx ny` (zeroed above), the info words 3; cells positive
        // (`column_shape` of a positive box), at least one column each way.
        unsafe { module.launch(abi::NBNXM_GRID_BIN, per_atom, stream, &mut args)? };

        let (mut nc, mut start, mut cursor, mut cs, mut zone) =
            (ncol as u32, s.atom_start.device_ptr(), s.cursor.device_ptr(), self.column_start.device_ptr(), self.zones.device_ptr());
        let one = LaunchShape { grid: (1, 1), block: abi::NBNXM_GRID_SCAN_THREADS, shared_bytes: abi::NBNXM_GRID_SCAN_SHARED_BYTES };
        let mut args = kernel_args![counts, nc, start, cursor, cs, zone, bx, by, bz, cx, cy, nx, ny, info_p];
        // SAFETY: arguments match `nbnxm_grid_columns`: counts and cursor of `ncol` columns, starts
        // of `ncol + 1`, one zone, one block with its shared sums.
        unsafe { module.launch(abi::NBNXM_GRID_COLUMNS, one, stream, &mut args)? };

        let mut keys = s.keys.device_ptr();
        let mut args = kernel_args![px, nn, col, cursor, keys];
        // SAFETY: arguments match `nbnxm_grid_scatter`: each column's cursor starts at its first
        // place and moves once per atom the first pass counted in it, so every key lands in `keys`.
        unsafe { module.launch(abi::NBNXM_GRID_SCATTER, per_atom, stream, &mut args)? };

        let mut sorted = s.sorted.device_ptr();
        let per_column = LaunchShape { grid: (ncol as u32, 1), block: abi::NBNXM_GRID_SORT_THREADS, shared_bytes: abi::NBNXM_GRID_SORT_SHARED_BYTES };
        let mut args = kernel_args![start, keys, sorted];
        // SAFETY: arguments match `nbnxm_grid_sort`: one block per column, its places inside `n`.
        unsafe { module.launch(abi::NBNXM_GRID_SORT, per_column, stream, &mut args)? };

        let (mut ai, mut at, mut cb, mut sb, mut sz) = (
            self.atom_index.device_ptr(),
            self.atom_type.device_ptr(),
            self.cluster_bbox.device_ptr(),
            self.super_bbox.device_ptr(),
            self.super_zone.device_ptr(),
        );
        let per_super = LaunchShape {
            grid: (most.div_ceil(abi::NBNXM_GRID_FILL_WARPS as usize) as u32, 1),
            block: abi::NBNXM_GRID_FILL_WARPS * 32,
            shared_bytes: abi::NBNXM_GRID_FILL_SHARED_BYTES,
        };
        let mut args = kernel_args![px, ty, sorted, start, cs, nc, info_p, ai, at, cb, sb, sz];
        // SAFETY: arguments match `nbnxm_grid_fill`: warps for `most` superclusters, at least the
        // total the scan found (each column adds `ceil(count / 64)`, at most one more than its
        // share of `n / 64`); the outputs hold `most` superclusters.
        unsafe { module.launch(abi::NBNXM_GRID_FILL, per_super, stream, &mut args)? };
        stream.synchronize().during("waiting for the GPU cluster grid")?;

        let words = s.info.to_host()?;
        if let Some(atom) = Some(words[abi::NBNXM_GRID_INFO_BAD_ATOM] as usize).filter(|&a| a < n) {
            let p = x.to_host()?.get(atom).copied().unwrap_or_default();
            let (d, value) = [p.x, p.y, p.z].into_iter().enumerate().find(|(_, v)| !v.is_finite()).unwrap_or((0, p.x));
            let e = NbnxmError::NonFinite { atom, dim: super::DIMS[d], value };
            return Err(HaloError::InvalidInput(e.to_string()));
        }
        let superclusters = words[abi::NBNXM_GRID_INFO_SUPERCLUSTERS] as usize;
        let max_clusters = 1usize << (32 - NBNXM_MASK_BITS);
        if superclusters * SC > max_clusters {
            let e = NbnxmError::TooManyClusters { clusters: superclusters * SC, max: max_clusters };
            return Err(HaloError::InvalidInput(e.to_string()));
        }
        info = GridInfo { superclusters, clusters: superclusters * SC, columns, cell, max_type: words[abi::NBNXM_GRID_INFO_MAX_TYPE], ..info };
        self.held = Some(Held { superclusters, zones: 1, periodic: [true; 3], box_size, uploaded: false });
        self.built = Some(info);
        Ok(info)
    }

    /// The grid of the last [`Self::build`] read back, as the host's [`ClusterGrid`] with `ntypes`
    /// atom types (synchronous; for checks). An error when the buffers hold no GPU-built grid.
    pub fn to_host(&self, ntypes: usize) -> Result<ClusterGrid> {
        let info = self.built.ok_or_else(|| HaloError::InvalidInput("the device grid holds no GPU-built grid".into()))?;
        let s = info.superclusters;
        let read = |v: Vec<u32>, len: usize| v[..len].to_vec();
        let boxes = |v: Vec<NbnxmBox>, len: usize| v[..len].iter().map(|b| BBox { lo: b.lo, hi: b.hi }).collect::<Vec<_>>();
        let zones = if info.atoms == 0 {
            Vec::new()
        } else {
            let ncol = info.columns[0] * info.columns[1];
            vec![ZoneGrid {
                zone: 0,
                extent: info.extent,
                columns: info.columns,
                cell: info.cell,
                column_start: read(self.column_start.to_host()?, ncol + 1),
            }]
        };
        Ok(ClusterGrid {
            atom_index: read(self.atom_index.to_host()?, s * SS),
            atom_type: read(self.atom_type.to_host()?, s * SS),
            cluster_bbox: boxes(self.cluster_bbox.to_host()?, s * SC),
            super_bbox: boxes(self.super_bbox.to_host()?, s),
            super_zone: self.super_zone.to_host()?[..s].iter().map(|&z| z as u8).collect(),
            zones,
            box_size: info.box_size,
            periodic: [true; 3],
            atoms: info.atoms,
            home_atoms: info.atoms,
            ntypes,
        })
    }

    /// Sets every byte of every buffer to 0xff, synchronously (for checks: poison before a build,
    /// which must write every element of the grid it reports).
    pub fn poison(&self) -> Result<()> {
        self.atom_index.fill_bytes(0xff)?;
        self.atom_type.fill_bytes(0xff)?;
        self.cluster_bbox.fill_bytes(0xff)?;
        self.super_bbox.fill_bytes(0xff)?;
        self.super_zone.fill_bytes(0xff)?;
        self.zones.fill_bytes(0xff)?;
        self.column_start.fill_bytes(0xff)?;
        let s = &self.scratch;
        for b in [&s.atom_column, &s.counts, &s.atom_start, &s.cursor, &s.info] {
            b.fill_bytes(0xff)?;
        }
        s.keys.fill_bytes(0xff)?;
        s.sorted.fill_bytes(0xff)
    }

    /// The zone the last [`Self::build`] wrote, read back (for checks).
    pub fn zone(&self) -> Result<NbnxmZone> {
        Ok(self.zones.to_host()?[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decomp::wrap_position;
    use crate::nbnxm::LocalAtoms;
    use crate::nbnxm::grid::{column_of, key};
    use crate::system::MolecularSystem;
    use abi::{NBNXM_FILLER, nbnxm_cluster_atoms};
    use rand::{Rng, SeedableRng};

    /// The GPU passes run on the CPU, step for step as the kernels take them (columns counted and
    /// scanned, keys scattered in an order unrelated to the atoms', ranked within each column, each
    /// chunk's halves, quarters and clusters by rank): the grid of wrapped `atoms`.
    fn passes(a: &LocalAtoms) -> ClusterGrid {
        let n = a.len();
        let extent = BBox { lo: [0.0; 3], hi: a.box_size };
        let (columns, cell) = column_shape(&extent, n);
        let ncol = columns[0] * columns[1];
        let col: Vec<usize> =
            a.positions.iter().map(|p| column_of(p.x, 0.0, cell[0], columns[0]) + columns[0] * column_of(p.y, 0.0, cell[1], columns[1])).collect();
        let mut counts = vec![0u32; ncol];
        col.iter().for_each(|&c| counts[c] += 1);
        let (mut atom_start, mut column_start) = (vec![0u32; ncol + 1], vec![0u32; ncol + 1]);
        for c in 0..ncol {
            atom_start[c + 1] = atom_start[c] + counts[c];
            column_start[c + 1] = column_start[c] + counts[c].div_ceil(SS as u32);
        }
        let mut cursor = atom_start.clone();
        let mut keys = vec![0u64; n];
        for i in (0..n).rev() {
            keys[cursor[col[i]] as usize] = key(a.positions[i].z, i as u32);
            cursor[col[i]] += 1;
        }
        let mut sorted = vec![0u64; n];
        for c in 0..ncol {
            let k = &keys[atom_start[c] as usize..atom_start[c + 1] as usize];
            for &mine in k {
                sorted[atom_start[c] as usize + k.iter().filter(|&&o| o < mine).count()] = mine;
            }
        }
        let total = column_start[ncol] as usize;
        let mut g = ClusterGrid {
            atom_index: vec![0xdead; total * SS],
            atom_type: vec![0xdead; total * SS],
            cluster_bbox: vec![BBox { lo: [f32::NAN; 3], hi: [f32::NAN; 3] }; total * SC],
            super_bbox: vec![BBox { lo: [f32::NAN; 3], hi: [f32::NAN; 3] }; total],
            super_zone: vec![0; total],
            zones: vec![ZoneGrid { zone: 0, extent, columns, cell, column_start: column_start.clone() }],
            box_size: a.box_size,
            periodic: [true; 3],
            atoms: n,
            home_atoms: n,
            ntypes: a.ntypes,
        };
        for s in 0..total as u32 {
            let c = column_start.partition_point(|&v| v <= s) - 1;
            let first = atom_start[c] + SS as u32 * (s - column_start[c]);
            let len = (atom_start[c + 1] - first).min(SS as u32);
            let atom = |t: u32| sorted[(first + t) as usize] as u32;
            let coords = |t: u32| a.positions[atom(t) as usize];
            let ky: Vec<u64> = (0..SS as u32).map(|t| if t < len { key(coords(t).y, atom(t)) } else { u64::MAX }).collect();
            let kx: Vec<u64> = (0..SS as u32).map(|t| if t < len { key(coords(t).x, atom(t)) } else { u64::MAX }).collect();
            let half = |t: usize| (t / 32) * 32..(t / 32) * 32 + 32;
            let upper: Vec<bool> = (0..SS).map(|t| half(t).filter(|&u| ky[u] < ky[t]).count() >= 16).collect();
            let mut pos = [[0.0f32; 3]; SS];
            let out = s as usize * SS;
            for t in 0..SS {
                if (t as u32) < len {
                    let rank = half(t).filter(|&u| upper[u] == upper[t] && kx[u] < kx[t]).count();
                    let xh = usize::from(rank >= CL_);
                    let slot = (4 * (t / 32) + 2 * usize::from(upper[t]) + xh) * CL_ + rank - CL_ * xh;
                    g.atom_index[out + slot] = atom(t as u32);
                    g.atom_type[out + slot] = a.types[atom(t as u32) as usize];
                    let p = coords(t as u32);
                    pos[slot] = [p.x, p.y, p.z];
                }
                if t as u32 % CL_ as u32 >= nbnxm_cluster_atoms(t as u32 / CL_ as u32, len) {
                    g.atom_index[out + t] = NBNXM_FILLER;
                    g.atom_type[out + t] = 0;
                }
            }
            let mut sb = BBox::EMPTY;
            for k in 0..SC {
                let mut b = BBox::EMPTY;
                (0..nbnxm_cluster_atoms(k as u32, len) as usize).for_each(|j| b.include(pos[k * CL_ + j]));
                g.cluster_bbox[s as usize * SC + k] = b;
                sb.union(&b);
            }
            g.super_bbox[s as usize] = sb;
        }
        if n == 0 {
            g.zones.clear();
        }
        g
    }

    const CL_: usize = abi::NBNXM_CLUSTER_SIZE as usize;

    fn check(what: &str, positions: &[Float3], box_size: [f32; 3]) {
        let types: Vec<u32> = (0..positions.len()).map(|i| (i * 7 % 3) as u32).collect();
        let a = LocalAtoms::single_rank(positions, &types, 3, box_size).unwrap();
        let want = ClusterGrid::build(&a).unwrap();
        assert_eq!(passes(&a), want, "{what}");
    }

    #[test]
    fn the_passes_give_the_host_grid() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for (n, seed) in [(0, 1), (1, 1), (63, 2), (64, 3), (65, 4), (1000, 5), (6000, 6)] {
            let s = MolecularSystem::generate(n.max(1), seed).unwrap();
            let mut x = s.positions[..n].to_vec();
            // Shuffled, some moved outside the box by whole and odd amounts.
            for i in (1..x.len()).rev() {
                x.swap(i, rng.random_range(0..=i));
            }
            for p in x.iter_mut().step_by(7) {
                p.x += s.box_size[0] * rng.random_range(-3..4) as f32 + 0.37;
                p.z -= 2.5 * s.box_size[2];
            }
            check(&format!("{n} atoms"), &x, s.box_size);
        }
        // On the box's edges: 0 and just below the edge; many equal coordinates.
        let b = [3.0f32, 2.5, 4.0];
        let edges: Vec<Float3> = (0..500)
            .map(|i| {
                let e = |d: usize, k: usize| [0.0, b[d].next_down(), b[d] * 0.5][k % 3];
                Float3::new(e(0, i), e(1, i / 3), e(2, i / 9))
            })
            .collect();
        check("edges", &edges, b);
        // A dense blob: one column holds most atoms.
        let blob: Vec<Float3> =
            (0..3000).map(|_| Float3::new(rng.random_range(1.0..1.01), rng.random_range(1.0..1.01), rng.random::<f32>() * b[2])).collect();
        check("blob", &blob, b);
        // The wrap the passes read is the host's.
        let far = Float3::new(-1e7, 3.0, 7.0 * b[2]);
        assert_eq!(wrap_position(far, b), LocalAtoms::single_rank(&[far], &[0], 1, b).unwrap().positions[0]);
    }

    #[test]
    fn cluster_sizes_follow_the_halves_quarters_and_eighths() {
        for len in 0..=64u32 {
            let sizes: Vec<u32> = (0..8).map(|k| nbnxm_cluster_atoms(k, len)).collect();
            assert_eq!(sizes.iter().sum::<u32>(), len);
            let half = |zh: usize| sizes[4 * zh..4 * zh + 4].iter().sum::<u32>();
            assert_eq!(half(0), len.min(32));
            assert!(sizes.iter().all(|&s| s <= 8));
            // Lower pieces fill first.
            for k in [0usize, 2, 4, 6] {
                assert!(sizes[k + 1] == 0 || sizes[k] == 8);
            }
            assert!(sizes[2] + sizes[3] == 0 || sizes[0] + sizes[1] == 16);
        }
    }
}
