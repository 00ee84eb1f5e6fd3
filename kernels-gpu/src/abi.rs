//! The binary interface between host and device: every type that crosses the launch boundary is
//! defined here once, `#[repr(C)]`, with its size and alignment asserted at compile time.
//!
//! On the host these types are `bytemuck::Pod`, so they can be copied to device memory as bytes.
//! Device pointers inside them are `u64` (a `CUdeviceptr`), which keeps the types `Pod` and makes
//! the 64-bit width explicit on both sides.

/// Bumped whenever a kernel signature or a type below changes. The PTX build embeds it as the
/// device global [`ABI_VERSION_SYMBOL`]; the host refuses a module whose value differs, so stale
/// PTX fails loudly at load time instead of corrupting memory at launch time.
pub const ABI_VERSION: u32 = 20;

/// Name of the device global that carries [`ABI_VERSION`] inside the PTX.
pub const ABI_VERSION_SYMBOL: &str = "HALO_ABI_VERSION";

/// Writes [`KERNEL_ENTRIES`]: the generic halo kernels once per element type (the `Float3` entry
/// keeps the plain name, the others get [`HaloElement::SUFFIX`]), then the type-specific kernels.
macro_rules! kernel_entries {
    (generic: [$($base:literal),* $(,)?], specific: [$($name:literal),* $(,)?] $(,)?) => {
        /// Every kernel entry point the PTX must export, in one list that the build (to keep them
        /// public), the host (to load them) and the tests (to find them in the PTX) all read.
        pub const KERNEL_ENTRIES: &[&str] = &[
            $($base,)*
            $(concat!($base, "_f32"),)*
            $(concat!($base, "_f64"),)*
            $(concat!($base, "_f32x4"),)*
            $($name,)*
        ];

        /// The kernels instantiated for every [`HaloElement`] type.
        pub const GENERIC_KERNELS: &[&str] = &[$($base,)*];
    };
}

kernel_entries! {
    generic: [
        "pack_coords",
        "unpack_store",
        "unpack_accumulate",
        "pulse_pack_store_signal",
        "pulse_pack_put_signal",
        "fused_coords",
        "fused_coords_tma",
        "fused_forces",
    ],
    specific: [
        "pack_subset",
        "signal_ping_pong",
        "leapfrog",
        "leapfrog_energy",
        "inverse_masses",
        "types_by_id",
        "jacobi7",
        "nbnxm_forces_ind",
        "nbnxm_forces_energy_ind",
        "nbnxm_prune_ind",
        "nbnxm_forces_pf",
        "nbnxm_forces_energy_pf",
        "nbnxm_prune_pf",
        "nbnxm_forces_pfw",
        "nbnxm_forces_energy_pfw",
        "spin_delay",
        "fused_coords_timeline",
        "fused_forces_timeline",
        "globaltimer_resolution",
        "nbnxm_search_count",
        "nbnxm_search_write",
        "nbnxm_grid_bin",
        "nbnxm_grid_columns",
        "nbnxm_grid_scatter",
        "nbnxm_grid_sort",
        "nbnxm_grid_fill",
        "nbnxm_layout_tiles",
        "nbnxm_layout_scan",
        "nbnxm_layout_write",
        "nbnxm_order_tiles",
        "nbnxm_order_scan",
        "nbnxm_order_write",
        "migrate_count",
        "migrate_scan",
        "migrate_scatter",
        "migrate_merge",
        "select_count",
        "select_scan",
        "select_scatter",
        "position_extent",
        "home_id_facts",
    ],
}

pub mod timeline;

/// A value the halo kernels can move: coordinates and forces (`Float3`), or any user field of
/// `f32`, `f64` or `[f32; 4]`. The device crate instantiates every generic kernel for each type
/// (entry name = base name + [`Self::SUFFIX`]).
pub trait HaloElement: Copy + Default + PartialEq + core::fmt::Debug + 'static {
    /// Appended to a generic kernel's name for this type (`""` for `Float3`).
    const SUFFIX: &'static str;
    /// The value moved across a periodic boundary: coordinates add the box row, other values
    /// are unchanged.
    fn shifted(self, shift: Float3) -> Self;
    /// `self + other`, component-wise (what the reverse exchange accumulates).
    fn add(self, other: Self) -> Self;
    /// The bits of 4-byte word `k` (`k < size_of::<Self>() / 4`; every element is a whole number
    /// of 4-byte words): how low-latency words ([`ll`]) carry it, field by field, in registers.
    fn word(self, k: usize) -> u32;
    /// The value with word `k` set to `bits` (the inverse of [`Self::word`]).
    fn with_word(self, k: usize, bits: u32) -> Self;
}

impl HaloElement for Float3 {
    const SUFFIX: &'static str = "";
    #[inline(always)]
    fn shifted(self, shift: Float3) -> Self {
        self + shift
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self + other
    }
    #[inline(always)]
    fn word(self, k: usize) -> u32 {
        match k {
            0 => self.x.to_bits(),
            1 => self.y.to_bits(),
            _ => self.z.to_bits(),
        }
    }
    #[inline(always)]
    fn with_word(mut self, k: usize, bits: u32) -> Self {
        let v = f32::from_bits(bits);
        match k {
            0 => self.x = v,
            1 => self.y = v,
            _ => self.z = v,
        }
        self
    }
}

impl HaloElement for f32 {
    const SUFFIX: &'static str = "_f32";
    #[inline(always)]
    fn shifted(self, _: Float3) -> Self {
        self
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self + other
    }
    #[inline(always)]
    fn word(self, _: usize) -> u32 {
        self.to_bits()
    }
    #[inline(always)]
    fn with_word(self, _: usize, bits: u32) -> Self {
        f32::from_bits(bits)
    }
}

impl HaloElement for f64 {
    const SUFFIX: &'static str = "_f64";
    #[inline(always)]
    fn shifted(self, _: Float3) -> Self {
        self
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self + other
    }
    /// Word 0 holds the low 32 bits (little-endian, as the value lies in memory).
    #[inline(always)]
    fn word(self, k: usize) -> u32 {
        (self.to_bits() >> (32 * (k & 1))) as u32
    }
    #[inline(always)]
    fn with_word(self, k: usize, bits: u32) -> Self {
        let shift = 32 * (k & 1);
        f64::from_bits((self.to_bits() & !(0xFFFF_FFFFu64 << shift)) | ((bits as u64) << shift))
    }
}

impl HaloElement for [f32; 4] {
    const SUFFIX: &'static str = "_f32x4";
    #[inline(always)]
    fn shifted(self, _: Float3) -> Self {
        self
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        [self[0] + o[0], self[1] + o[1], self[2] + o[2], self[3] + o[3]]
    }
    #[inline(always)]
    fn word(self, k: usize) -> u32 {
        self[k & 3].to_bits()
    }
    #[inline(always)]
    fn with_word(mut self, k: usize, bits: u32) -> Self {
        self[k & 3] = f32::from_bits(bits);
        self
    }
}

/// `pack_coords(x, map, n, out, sx, sy, sz, use_shift)`: `out[i] = x[map[i]] (+ shift)`.
pub const PACK_COORDS: &str = "pack_coords";
/// `unpack_store(buf, map, n, dst)`: `dst[map[i]] = buf[i]`.
pub const UNPACK_STORE: &str = "unpack_store";
/// `unpack_accumulate(buf, map, n, dst)`: `dst[map[i]] += buf[i]` (atomic: repeated targets are fine).
pub const UNPACK_ACCUMULATE: &str = "unpack_accumulate";
/// `pack_subset(x, map, n, out, sx, sy, sz, use_shift, mode, threshold, deferred)`: pack the
/// entries selected by [`PackMode`], count the others into `*deferred`.
pub const PACK_SUBSET: &str = "pack_subset";
/// Per-pulse coordinate kernel, direct-store variant (peer reachable by loads and stores).
pub const PULSE_PACK_STORE_SIGNAL: &str = "pulse_pack_store_signal";
/// Per-pulse coordinate kernel, NVSHMEM `put_signal_nbi_block` variant.
pub const PULSE_PACK_PUT_SIGNAL: &str = "pulse_pack_put_signal";
/// All coordinate pulses in one launch (grid.y = pulse), dependency-aware, last-block signalling.
pub const FUSED_COORDS: &str = "fused_coords";
/// All coordinate pulses in one launch, per-warp bulk copies (`cp.async.bulk`) to the peer.
pub const FUSED_COORDS_TMA: &str = "fused_coords_tma";
/// All force pulses in one launch, last pulse first, accumulating into the force array.
pub const FUSED_FORCES: &str = "fused_forces";

/// `signal_ping_pong(own_flag, peer_flag, rounds, initiator, timeout_ns, status)`: the latency probe.
pub const SIGNAL_PING_PONG: &str = "signal_ping_pong";

/// `leapfrog(x, v, f, inv_mass, n, dt, clear_from, clear_n)`: `v += f / m * dt; x += v * dt`, then
/// `f = 0` (ready for the next step's forces), for `n` home atoms; and `f = 0` for the `clear_n`
/// forces from `clear_from` on (the halo atoms' forces, when the force halo was their last reader:
/// `Transport::halo_forces_read_by_peer` on the host), in the same launch. The ranges must not
/// overlap; items `0..n + clear_n` share one grid-stride loop (`n + clear_n` must fit in `u32`).
pub const LEAPFROG: &str = "leapfrog";
/// `leapfrog_energy(x, v, f, inv_mass, n, dt, clear_from, clear_n, kinetic)`: [`LEAPFROG`] that also
/// adds the kinetic energy of the `n` atoms at the force's time, `sum m (|v_old|² + |v_new|²) / 4`
/// (the average of the two half-step kinetic energies), to the `f64` at `kinetic` (one atomic per
/// warp).
pub const LEAPFROG_ENERGY: &str = "leapfrog_energy";
/// `inverse_masses(types, n, inv_by_type, ntypes, inv_mass)`: `inv_mass[i] = inv_by_type[types[i]]`
/// for the `n` home atoms (grid-stride), NaN for a type at or past `ntypes` (a search refuses such
/// a type before any step reads the masses). The MD step's `1 / m` per home atom, made on the GPU
/// from the types a search on the GPU copied there, instead of gathered and uploaded by the host.
pub const INVERSE_MASSES: &str = "inverse_masses";
/// `types_by_id(ids, n, by_id, atoms, types)`: `types[i] = by_id[ids[i]]` for the `n` home atoms
/// (grid-stride), `u32::MAX` for an id at or past `atoms` (a redecomposition refuses such an id
/// before any search builds a grid from its home atoms). The home atoms' types of a search whose
/// home atoms were merged on the GPU, made there from their ids and the system's types by global
/// id (uploaded once), instead of gathered and uploaded by the host at every search.
pub const TYPES_BY_ID: &str = "types_by_id";

/// The nbnxm kernels, one triple per design: `[forces, forces + energy, prune]`, `_ind` reading
/// j-atoms through the slot index, `_pf` the same with the next j-cluster's loads issued early,
/// `_pfw` `_pf` with each warp adding its i-forces and energy itself (no block barrier before
/// them; its prune is `_pf`'s).
///
/// - forces: `(x, atom_index, atom_type, entries, order, n_entries, j_list, lj, ntypes, f, energy,
///   box_x, box_y, box_z, rc2, sh6, sh12)`: Lennard-Jones forces of a cluster-pair list, added to
///   `f` (`energy` is not touched);
/// - forces + energy: the same arguments, and the potential-shifted LJ energy of the list added
///   to the `f64` at `energy` (one atomic per block; one per warp with `_pfw`);
/// - prune: `(x, atom_index, entries, order, n_entries, j_outer, j_inner, box_x, box_y, box_z,
///   rlist2)`: the inner (pruned) j-list from the outer one and the current coordinates.
///
/// Launch: one block per [`NbnxmEntry`] (`grid.x = n_entries`), `32 W` threads for `W` warps per
/// entry (1 to [`NBNXM_MAX_WARPS_PER_ENTRY`]; warp `w` takes the entry's j-list words
/// `j_start + w`, `j_start + w + W`, ...), and [`nbnxm_force_shared_bytes`]`(ntypes, W)` (forces)
/// or [`NBNXM_PRUNE_SHARED_BYTES`] (prune) of dynamic shared memory. Block `b` runs entry
/// `entries[order[b]]`: `order` is a permutation of `0..n_entries` (the launch order, longest
/// entries first: [`NBNXM_ORDER_TILES`]), so the blocks that start last are short ones.
pub const NBNXM_KERNELS: [[&str; 3]; 3] = [
    ["nbnxm_forces_ind", "nbnxm_forces_energy_ind", "nbnxm_prune_ind"],
    ["nbnxm_forces_pf", "nbnxm_forces_energy_pf", "nbnxm_prune_pf"],
    ["nbnxm_forces_pfw", "nbnxm_forces_energy_pfw", "nbnxm_prune_pf"],
];
/// Most atom types the nbnxm kernels take (their LJ table lives in shared memory).
pub const NBNXM_MAX_TYPES: u32 = 32;
/// Most warps per list entry (block size 512: the force kernels' registers fit twice over).
pub const NBNXM_MAX_WARPS_PER_ENTRY: u32 = 16;

/// Bytes of the staged i-atoms at the start of an nbnxm block's dynamic shared memory:
/// `[x, y, z, bits(type row)]` per slot of the supercluster.
pub const NBNXM_STAGED_BYTES: u32 = NBNXM_SUPER_SIZE * 16;
/// Dynamic shared memory of a prune block: the staged i-atoms only.
pub const NBNXM_PRUNE_SHARED_BYTES: u32 = NBNXM_STAGED_BYTES;
/// Where a force block's LJ table starts: after the staged i-atoms and their 64 atom indices.
pub const NBNXM_TABLE_OFFSET: u32 = NBNXM_STAGED_BYTES + NBNXM_SUPER_SIZE * 4;
/// Floats per force component in one warp's partial i-forces: 64 slots and 8 of padding, so that
/// the 24 lanes writing one i-cluster's 8 atoms x 3 components hit 24 different banks.
pub const NBNXM_PARTIAL_STRIDE: u32 = NBNXM_SUPER_SIZE + 8;
/// Floats of one warp's partials: 3 components, then the warp's energy, padded to 16 bytes.
pub const NBNXM_PARTIAL_FLOATS: u32 = (3 * NBNXM_PARTIAL_STRIDE + 1).div_ceil(4) * 4;

/// Bytes of the force kernels' LJ table for `ntypes` atom types (`ntypes²` entries of 8 bytes,
/// rounded up to 16).
pub const fn nbnxm_table_bytes(ntypes: u32) -> u32 {
    (ntypes * ntypes * 8).div_ceil(16) * 16
}

/// Where a force block's per-warp partial i-forces start, for `ntypes` atom types.
pub const fn nbnxm_partials_offset(ntypes: u32) -> u32 {
    NBNXM_TABLE_OFFSET + nbnxm_table_bytes(ntypes)
}

/// Dynamic shared memory of a force block for `ntypes` atom types and `warps` warps per entry:
/// staged i-atoms, their atom indices, the LJ table, and each warp's partial i-forces and energy.
pub const fn nbnxm_force_shared_bytes(ntypes: u32, warps: u32) -> u32 {
    nbnxm_partials_offset(ntypes) + warps * NBNXM_PARTIAL_FLOATS * 4
}

/// `spin_delay(ns)`, one thread: holds its stream for `ns` nanoseconds of `%globaltimer` and does
/// nothing else. The GPU half of the exchange's jitter (`halo::exchange::perturb`): enqueued before
/// a rank's launch, it skews that rank's GPU timeline against its peers'.
pub const SPIN_DELAY: &str = "spin_delay";
/// `nbnxm_search_count(super_bbox, cluster_bbox, super_zone, zones, n_zones, column_start, shifts,
/// n_shifts, n_super, info, rl, rl2, counts)`: the cluster-pair search on the GPU, first pass. One
/// warp per (i-supercluster, shift) item `sci * n_shifts + s` for `n_super * n_shifts` items:
/// `n_super` is an upper bound on the grid's superclusters the host knows without reading the
/// device (a GPU build's plan bound, or the count of an uploaded grid), the grid's own count is
/// `info[`[`NBNXM_GRID_INFO_SUPERCLUSTERS`]`]` on the device ([`nbnxm_search_superclusters`] of
/// both). Writes the item's number of j-list words of the home–home list to `counts[2 item]` and
/// of the list with halo clusters to `counts[2 item + 1]`; an item of a supercluster at or above
/// the grid's count has none (its two counts are 0, and it reads nothing of the grid). The rule
/// is the host search's (`host/md/src/nbnxm/pairlist.rs`), in the same `f32` arithmetic, so both
/// find the same words.
pub const NBNXM_SEARCH_COUNT: &str = "nbnxm_search_count";
/// `nbnxm_search_write(super_bbox, cluster_bbox, super_zone, zones, n_zones, column_start, shifts,
/// n_shifts, n_super, info, rl, rl2, offsets, j_local, j_nonlocal)`: the second pass, same items
/// (same `n_super` and `info` as the count pass): writes each item's words, in the host search's
/// order, to `j_local[offsets[2 item] ..]` and `j_nonlocal[offsets[2 item + 1] ..]`; an item of a
/// supercluster at or above the grid's count writes nothing.
pub const NBNXM_SEARCH_WRITE: &str = "nbnxm_search_write";

/// The superclusters the search passes take, from the launch's bound `n_super` and the grid's
/// count `info[`[`NBNXM_GRID_INFO_SUPERCLUSTERS`]`]` on the device: the count, never above the
/// bound (the bound sizes the items, their counts and offsets, so no item beyond it is read
/// whatever the device word says). Items of superclusters at or above it produce nothing.
pub const fn nbnxm_search_superclusters(n_super: u32, info_count: u32) -> u32 {
    if info_count < n_super { info_count } else { n_super }
}

/// `nbnxm_layout_tiles(counts, n_items, max_j, tile_sums)`: the lists' layout on the GPU, first
/// pass (`host/md/src/nbnxm/gpu_search.rs`). One block of [`NBNXM_LAYOUT_THREADS`] threads,
/// [`NBNXM_LAYOUT_SHARED_BYTES`] of dynamic shared memory, per tile of [`NBNXM_LAYOUT_TILE`] items
/// (`grid.x = ceil(n_items / NBNXM_LAYOUT_TILE)`): the tile's [`NBNXM_LAYOUT_SUMS`] sums (words of
/// the home–home list, words of the list with halo clusters, then their entries,
/// [`nbnxm_entry_split`] of each count) to `tile_sums[4 tile ..]` as `u64` (no sum can wrap).
pub const NBNXM_LAYOUT_TILES: &str = "nbnxm_layout_tiles";
/// `nbnxm_layout_scan(tile_sums, n_tiles, totals)`: one block of [`NBNXM_LAYOUT_THREADS`] threads,
/// [`NBNXM_LAYOUT_SHARED_BYTES`]: each tile's sums become in place the sums of the tiles before it
/// (an exclusive scan per sum), and the [`NBNXM_LAYOUT_SUMS`] totals go to `totals` (`u64`: the
/// host reads them back and refuses lists of more words than a `u32` addresses).
pub const NBNXM_LAYOUT_SCAN: &str = "nbnxm_layout_scan";
/// `nbnxm_layout_write(counts, n_items, max_j, shifts, n_shifts, tile_starts, offsets,
/// entries_local, entries_nonlocal)`: same tiles and blocks as [`NBNXM_LAYOUT_TILES`], after
/// [`NBNXM_LAYOUT_SCAN`] (`tile_starts`) and only for totals below `2^32`: item `i`'s first word
/// of list `kind` to `offsets[2 i + kind]` (the words of the items before it), and its entries
/// (supercluster `i / n_shifts`, shift `shifts[i % n_shifts].index`, [`nbnxm_entry_split`] of its
/// count) to the list's entries after those of the items before it: the host's
/// `pairlist::split_entries`, entry for entry.
pub const NBNXM_LAYOUT_WRITE: &str = "nbnxm_layout_write";
/// Threads per block of the layout passes.
pub const NBNXM_LAYOUT_THREADS: u32 = 256;
/// Consecutive items of one thread in [`NBNXM_LAYOUT_TILES`] and [`NBNXM_LAYOUT_WRITE`].
pub const NBNXM_LAYOUT_ITEMS_PER_THREAD: u32 = 4;
/// Items per block of [`NBNXM_LAYOUT_TILES`] and [`NBNXM_LAYOUT_WRITE`].
pub const NBNXM_LAYOUT_TILE: u32 = NBNXM_LAYOUT_THREADS * NBNXM_LAYOUT_ITEMS_PER_THREAD;
/// Sums per tile: words of list 0 and 1, entries of list 0 and 1.
pub const NBNXM_LAYOUT_SUMS: usize = 4;
/// Dynamic shared memory of a layout block: [`NBNXM_LAYOUT_SUMS`] `u64` running sums per thread.
pub const NBNXM_LAYOUT_SHARED_BYTES: u32 = NBNXM_LAYOUT_THREADS * NBNXM_LAYOUT_SUMS as u32 * 8;

/// `nbnxm_order_tiles(entries, n_entries, max_j, tile_counts)`: the launch order of a list on the
/// GPU (`host/md/src/nbnxm/order.rs`), first pass: a stable counting sort of the entries by length,
/// longest first (key [`nbnxm_order_key`]). One block of [`NBNXM_ORDER_TILE`] threads, one entry
/// each, [`NBNXM_ORDER_SHARED_BYTES`] of dynamic shared memory, per tile of [`NBNXM_ORDER_TILE`]
/// entries (`grid.x = n_tiles = ceil(n_entries / NBNXM_ORDER_TILE)`): the tile's number of
/// entries of each key `k <= max_j` to `tile_counts[k n_tiles + tile]`. `max_j` at most
/// [`NBNXM_ORDER_MAX_J`] (a larger one is read as that).
pub const NBNXM_ORDER_TILES: &str = "nbnxm_order_tiles";
/// `nbnxm_order_scan(tile_counts, n)`: one block of [`NBNXM_ORDER_SCAN_THREADS`] threads,
/// [`NBNXM_ORDER_SCAN_SHARED_BYTES`]: the `n = (max_j + 1) n_tiles` counts become in place their
/// exclusive scan (key by key, tile by tile within a key): where each tile's entries of each key
/// start in the order.
pub const NBNXM_ORDER_SCAN: &str = "nbnxm_order_scan";
/// `nbnxm_order_write(entries, n_entries, max_j, tile_starts, order)`: same tiles and blocks as
/// [`NBNXM_ORDER_TILES`], after [`NBNXM_ORDER_SCAN`] (`tile_starts`): entry `e` of key `k` to
/// `order[tile_starts[k n_tiles + tile] + r]`, `r` the entries of its tile with key `k` before it.
/// Deterministic (no atomics): the order is the stable sort of the entries by length, longest
/// first, entry for entry the host's `entry_order`.
pub const NBNXM_ORDER_WRITE: &str = "nbnxm_order_write";
/// Entries per tile of the order passes, and threads per block (one entry each).
pub const NBNXM_ORDER_TILE: u32 = 1024;
/// Warps per block of [`NBNXM_ORDER_TILES`] and [`NBNXM_ORDER_WRITE`].
pub const NBNXM_ORDER_WARPS: u32 = NBNXM_ORDER_TILE / 32;
/// The longest entry (`max_j`) the GPU's launch order sorts: keys `0..=NBNXM_ORDER_MAX_J` (the
/// search splits entries at 32 words).
pub const NBNXM_ORDER_MAX_J: u32 = 64;
/// Keys of the order's counting sort, at most.
pub const NBNXM_ORDER_KEYS: u32 = NBNXM_ORDER_MAX_J + 1;
/// Dynamic shared memory of an [`NBNXM_ORDER_TILES`] or [`NBNXM_ORDER_WRITE`] block: per warp and
/// key a `u32` count.
pub const NBNXM_ORDER_SHARED_BYTES: u32 = NBNXM_ORDER_WARPS * NBNXM_ORDER_KEYS * 4;
/// Threads of the one block of [`NBNXM_ORDER_SCAN`].
pub const NBNXM_ORDER_SCAN_THREADS: u32 = 1024;
/// Dynamic shared memory of the [`NBNXM_ORDER_SCAN`] block: one running sum per thread.
pub const NBNXM_ORDER_SCAN_SHARED_BYTES: u32 = NBNXM_ORDER_SCAN_THREADS * 4;

/// The order's sort key of an entry of `len` words for entries of at most `max_j` words:
/// `max_j - len`, so ascending keys are descending lengths (a length above `max_j` counts as
/// `max_j`).
pub const fn nbnxm_order_key(len: u32, max_j: u32) -> u32 {
    max_j - if len < max_j { len } else { max_j }
}

/// How a list splits one item's `count` words into entries of at most `max_j` words (0 counts as
/// 1), evenly: `[entries, words of each entry]` (the last entry takes what is left); no entry for
/// no words. Shared by the host's search (`pairlist::split_entries`) and the GPU's layout.
pub const fn nbnxm_entry_split(count: u32, max_j: u32) -> [u32; 2] {
    let max_j = if max_j == 0 { 1 } else { max_j };
    let parts = count.div_ceil(max_j);
    let parts = if parts == 0 { 1 } else { parts };
    let size = count.div_ceil(parts);
    let size = if size == 0 { 1 } else { size };
    [count.div_ceil(size), size]
}

/// `nbnxm_grid_bin(x, n, box_x, box_y, box_z, wrap, zone_ids, zone_mask, zones, atom_column,
/// counts, info, types)`: the first pass of the cluster grid on the GPU (any rank's local atoms;
/// `host/md/src/nbnxm/gpu_grid.rs`). `zones` describes the zones with atoms, ascending (bit `k` of
/// `zone_mask` set for each zone `k` present), with their extents, column shapes and
/// `column_base`s (zone by zone, `columns_x * columns_y + 1` columns each, the last one empty).
/// One thread per atom `i < n`: with `wrap != 0`, `x[i]` wrapped into the box in place (the host's
/// `decomp::wrap_position`, bit for bit); its zone `zone_ids[i]` (0 when `zone_ids` is null), its
/// column in that zone's grid, `column_base + cx + columns_x * cy`, to `atom_column[i]` and one
/// count to `counts[column]`; `types[i]` into the largest type
/// `info[`[`NBNXM_GRID_INFO_MAX_TYPE`]`]`. An atom with a non-finite coordinate is left as it is,
/// gets column `u32::MAX` and lowers `info[`[`NBNXM_GRID_INFO_BAD_ATOM`]`]` to its index.
/// [`NBNXM_GRID_THREADS`] threads per block.
pub const NBNXM_GRID_BIN: &str = "nbnxm_grid_bin";
/// `nbnxm_grid_columns(counts, n_columns, atom_start, cursor, column_start, zones, n_zones,
/// info)`: one block of [`NBNXM_GRID_SCAN_THREADS`] threads, [`NBNXM_GRID_SCAN_SHARED_BYTES`] of
/// dynamic shared memory. Column `c`'s atoms go to places `atom_start[c] .. atom_start[c + 1]` (an
/// exclusive scan of the counts; `cursor` gets a copy of the starts), its superclusters
/// (`ceil(count / 64)`) are `column_start[c] .. column_start[c + 1]`; the total superclusters go
/// to `info[`[`NBNXM_GRID_INFO_SUPERCLUSTERS`]`]`, and each of the `n_zones` (at most
/// [`NBNXM_GRID_SCAN_THREADS`]) zones' `sc_end` is set to the start of its last, empty column.
pub const NBNXM_GRID_COLUMNS: &str = "nbnxm_grid_columns";
/// `nbnxm_grid_scatter(x, n, atom_column, cursor, keys)`: one thread per atom with a column: its
/// sort key `(z, atom)` (see the host's `grid.rs`) to a place of its column claimed from `cursor`
/// (in no particular order). [`NBNXM_GRID_THREADS`] threads per block.
pub const NBNXM_GRID_SCATTER: &str = "nbnxm_grid_scatter";
/// `nbnxm_grid_sort(atom_start, keys, sorted)`: one block of [`NBNXM_GRID_SORT_THREADS`] threads
/// per column, [`NBNXM_GRID_SORT_SHARED_BYTES`] of dynamic shared memory: each key of the column
/// goes to `sorted[atom_start[c] + rank]`, its rank the number of the column's keys below it.
pub const NBNXM_GRID_SORT: &str = "nbnxm_grid_sort";
/// `nbnxm_grid_fill(x, types, zone_ids, sorted, atom_start, column_start, n_columns, info,
/// atom_index, atom_type, cluster_bbox, super_bbox, super_zone)`: one warp per supercluster (those
/// at or above `info[`[`NBNXM_GRID_INFO_SUPERCLUSTERS`]`]` do nothing), [`NBNXM_GRID_FILL_WARPS`]
/// warps per block, [`NBNXM_GRID_FILL_SHARED_BYTES`] of dynamic shared memory: the supercluster's
/// 64 slots (atom and type, padding `NBNXM_FILLER` and 0), its 8 cluster boxes, its box and zone
/// (its atoms' `zone_ids` entry, 0 when `zone_ids` is null), as the host's `ClusterGrid::build`
/// fills them.
pub const NBNXM_GRID_FILL: &str = "nbnxm_grid_fill";
/// Threads per block of [`NBNXM_GRID_BIN`] and [`NBNXM_GRID_SCATTER`].
pub const NBNXM_GRID_THREADS: u32 = 256;
/// Threads of the one block of [`NBNXM_GRID_COLUMNS`].
pub const NBNXM_GRID_SCAN_THREADS: u32 = 1024;
/// Dynamic shared memory of the [`NBNXM_GRID_COLUMNS`] block: two running sums per thread.
pub const NBNXM_GRID_SCAN_SHARED_BYTES: u32 = NBNXM_GRID_SCAN_THREADS * 8;
/// Threads per block of [`NBNXM_GRID_SORT`].
pub const NBNXM_GRID_SORT_THREADS: u32 = 256;
/// Dynamic shared memory of a [`NBNXM_GRID_SORT`] block: one tile of keys.
pub const NBNXM_GRID_SORT_SHARED_BYTES: u32 = NBNXM_GRID_SORT_THREADS * 8;
/// Warps per block of [`NBNXM_GRID_FILL`] (one supercluster each).
pub const NBNXM_GRID_FILL_WARPS: u32 = 4;
/// Shared bytes of one [`NBNXM_GRID_FILL`] warp: the chunk's 64 y keys and 64 x keys, 64 quarter
/// flags, the 64 slots' coordinates and the 8 cluster boxes.
pub const NBNXM_GRID_FILL_WARP_BYTES: u32 = NBNXM_SUPER_SIZE * (8 + 8 + 4 + 12) + NBNXM_CLUSTERS_PER_SUPER * 24;
/// Dynamic shared memory of a [`NBNXM_GRID_FILL`] block.
pub const NBNXM_GRID_FILL_SHARED_BYTES: u32 = NBNXM_GRID_FILL_WARPS * NBNXM_GRID_FILL_WARP_BYTES;
/// Atoms of cluster `k` (`4 zh + 2 yh + xh`) of a supercluster cut from a chunk of `len <= 64`
/// keys: half `zh` takes 32 keys and the rest, quarter `yh` of a half 16 and the rest, eighth `xh`
/// of a quarter 8 and the rest (the cluster grid's rule, `host/md/src/nbnxm/grid.rs`); the
/// cluster's other slots are padding.
pub const fn nbnxm_cluster_atoms(k: u32, len: u32) -> u32 {
    let (zh, yh, xh) = (k / 4, (k / 2) % 2, k % 2);
    let rest = len.saturating_sub(32 * zh);
    let half = if rest < 32 { rest } else { 32 };
    let q0 = if half < 16 { half } else { 16 };
    let quarter = if yh == 0 { q0 } else { half - q0 };
    let c0 = if quarter < NBNXM_CLUSTER_SIZE { quarter } else { NBNXM_CLUSTER_SIZE };
    if xh == 0 { c0 } else { quarter - c0 }
}
/// Words of the grid passes' `info` array.
pub const NBNXM_GRID_INFO_WORDS: usize = 3;
/// `info` word: the lowest atom with a non-finite coordinate (`u32::MAX`, as the host sets it
/// before the passes, when none has).
pub const NBNXM_GRID_INFO_BAD_ATOM: usize = 0;
/// `info` word: superclusters of the grid.
pub const NBNXM_GRID_INFO_SUPERCLUSTERS: usize = 1;
/// `info` word: the largest atom type (0 as the host sets it before the passes).
pub const NBNXM_GRID_INFO_MAX_TYPE: usize = 2;

/// `migrate_count(x, n, geo, block_counts, info)`: the first pass of the home atoms' migration on
/// the GPU (`kernels/migrate.rs`; host: `halo::decomp::GpuMigrate`). One thread per atom, blocks of
/// [`MIGRATE_THREADS`] threads with [`MIGRATE_SHARED_BYTES`] of dynamic shared memory,
/// `grid.x = `[`migrate_blocks`]`(n)`: each atom's position wrapped into the box (the host's
/// `decomp::wrap_position`, operation for operation) and its owner (the host's `CellEdges::rank_of`:
/// per decomposed dimension the thresholds at or below the coordinate, times the stride); the
/// block's stayers (owner == `geo.rank`) at `block_counts[2 block]`, its leavers at
/// `block_counts[2 block + 1]`. An atom with a non-finite coordinate is neither: the lowest such
/// index goes to `info[`[`MIGRATE_INFO_BAD_ATOM`]`]` (the host sets it to `u32::MAX` first).
pub const MIGRATE_COUNT: &str = "migrate_count";
/// `migrate_scan(block_counts, n_blocks, info)`: one block of [`MIGRATE_SCAN_THREADS`] threads with
/// [`MIGRATE_SCAN_SHARED_BYTES`]: the exclusive scan of the blocks' stayers and leavers, in place
/// (where each block's stayers and leavers start), and the totals to
/// `info[`[`MIGRATE_INFO_STAYERS`]`]` and `info[`[`MIGRATE_INFO_LEAVERS`]`]`.
pub const MIGRATE_SCAN: &str = "migrate_scan";
/// `migrate_scatter(x, v, ids, n, geo, block_starts, x_out, v_out, ids_out, leavers)`: the last
/// pass, same launch as [`MIGRATE_COUNT`]: each stayer's wrapped position, velocity and id to its
/// place among the stayers (input order), each leaver to its place in `leavers` (input order) as a
/// [`MigrateLeaver`]. Non-finite atoms are written nowhere.
pub const MIGRATE_SCATTER: &str = "migrate_scatter";
/// Threads per block of [`MIGRATE_COUNT`] and [`MIGRATE_SCATTER`] (whole warps).
pub const MIGRATE_THREADS: u32 = 256;
/// Dynamic shared memory of a count or scatter block: two counts per warp.
pub const MIGRATE_SHARED_BYTES: u32 = (MIGRATE_THREADS / 32) * 2 * 4;
/// Threads of the one [`MIGRATE_SCAN`] block (a power of two).
pub const MIGRATE_SCAN_THREADS: u32 = 1024;
/// Dynamic shared memory of the [`MIGRATE_SCAN`] block: two running sums per thread.
pub const MIGRATE_SCAN_SHARED_BYTES: u32 = MIGRATE_SCAN_THREADS * 2 * 4;
/// Most cell thresholds per dimension [`MigrateGeometry`] holds (17 ranks along a dimension).
pub const MIGRATE_MAX_EDGES: usize = 16;
/// `info` word of the migration: the stayers.
pub const MIGRATE_INFO_STAYERS: usize = 0;
/// `info` word of the migration: the leavers.
pub const MIGRATE_INFO_LEAVERS: usize = 1;
/// `info` word of the migration: the lowest index of an atom with a non-finite coordinate
/// (`u32::MAX`: none).
pub const MIGRATE_INFO_BAD_ATOM: usize = 2;
/// `info` words of the migration (padded to 16 bytes).
pub const MIGRATE_INFO_WORDS: usize = 4;

/// Blocks of [`MIGRATE_COUNT`] and [`MIGRATE_SCATTER`] for `n` atoms (at least one, so the passes
/// write their counts for `n = 0` too).
pub const fn migrate_blocks(n: u32) -> u32 {
    let b = n.div_ceil(MIGRATE_THREADS);
    if b == 0 { 1 } else { b }
}

/// `migrate_merge(stay_ids, stay_x, stay_v, n_stay, arrivals, n_arrivals, ids_out, x_out, v_out, info)`:
/// the second step of the home atoms' migration on the GPU (`kernels/migrate_merge.rs`; host:
/// `halo::decomp::GpuMerge`): a rank's stayers (ids ascending, wrapped positions, velocities, as
/// [`MIGRATE_SCATTER`] leaves them from an input in id order) and its arrivals ([`MigrateLeaver`]s
/// sorted by id; `owner` unread) merged into its new home atoms in id order, the host's
/// `Working::new`. One thread per output atom, blocks of [`MIGRATE_MERGE_THREADS`], no shared
/// memory, `grid.x = `[`migrate_merge_blocks`]`(n_stay + n_arrivals)`: stayer `i` goes to `i` plus
/// the arrivals of smaller id, arrival `j` to `j` plus the stayers of smaller id (binary searches;
/// no atomics). Order violations set `info` words to 1 (the host zeroes them first):
/// [`MIGRATE_MERGE_INFO_STAYERS`], [`MIGRATE_MERGE_INFO_ARRIVALS`], [`MIGRATE_MERGE_INFO_REPEATED`];
/// the outputs are then unspecified (every write stays inside `0..n_stay + n_arrivals`).
pub const MIGRATE_MERGE: &str = "migrate_merge";
/// Threads per block of [`MIGRATE_MERGE`] (whole warps).
pub const MIGRATE_MERGE_THREADS: u32 = 256;
/// `info` word of the merge: 1 when two neighbouring stayers' ids do not ascend strictly.
pub const MIGRATE_MERGE_INFO_STAYERS: usize = 0;
/// `info` word of the merge: 1 when two neighbouring arrivals' ids do not ascend strictly.
pub const MIGRATE_MERGE_INFO_ARRIVALS: usize = 1;
/// `info` word of the merge: 1 when an arrival's id is also a stayer's.
pub const MIGRATE_MERGE_INFO_REPEATED: usize = 2;
/// `info` words of the merge (padded to 16 bytes).
pub const MIGRATE_MERGE_INFO_WORDS: usize = 4;

/// Blocks of [`MIGRATE_MERGE`] for `n` merged atoms (at least one).
pub const fn migrate_merge_blocks(n: u32) -> u32 {
    let b = n.div_ceil(MIGRATE_MERGE_THREADS);
    if b == 0 { 1 } else { b }
}

/// The number of `ids[0..n]` below `key` (`n` when all are): a lower bound by halving, in as many
/// steps as `n` has bits, as [`MIGRATE_MERGE`] places each atom (and as the host's model of it
/// replays). Ascending `ids` assumed; any `ids` gives a count in `0..=n`, and `ids` is called only
/// below `n`.
#[inline(always)]
pub fn ids_below(n: u32, key: u32, ids: impl Fn(u32) -> u32) -> u32 {
    let (mut lo, mut len) = (0u32, n);
    while len > 0 {
        let half = len / 2;
        // `lo + half < lo + len <= n`.
        if ids(lo + half) < key {
            lo += half + 1;
            len -= half + 1;
        } else {
            len = half;
        }
    }
    lo
}

/// The geometry the migration kernels read (one small device buffer, uploaded once per
/// decomposition and rank): the box, this rank, and per dimension the rank stride and the cell
/// thresholds (`Decomposition::cell_threshold(d, 1..n)`; none along a dimension of one rank).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct MigrateGeometry {
    /// Box edges (nm).
    pub box_size: [f32; 3],
    /// The rank whose home atoms these are (owner == rank: a stayer).
    pub rank: u32,
    /// Rank stride per dimension (`1, A, A B`).
    pub stride: [u32; 3],
    /// Thresholds used per dimension (at most [`MIGRATE_MAX_EDGES`]).
    pub n_edges: [u32; 3],
    /// Per dimension, the thresholds `0..n_edges[d]` (ascending; the rest unused).
    pub edges: [[f32; MIGRATE_MAX_EDGES]; 3],
}

/// One atom leaving this rank, as [`MIGRATE_SCATTER`] writes it, and one arriving at its new
/// owner, as [`MIGRATE_MERGE`] reads it (`owner` unread there): 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct MigrateLeaver {
    /// Global atom id.
    pub id: u32,
    /// Its position wrapped into the box.
    pub x: Float3,
    /// Its velocity, unchanged.
    pub v: Float3,
    /// The rank that owns it now.
    pub owner: u32,
}

/// `select_count(x, n, geo, block_counts)`: the first pass of the home atoms' first-pulse
/// selection on the GPU (`kernels/select.rs`; host: `halo::decomp::GpuSelect`). One thread per
/// atom, blocks of [`SELECT_THREADS`] threads with [`SELECT_SHARED_BYTES`] of dynamic shared
/// memory, `grid.x = `[`select_blocks`]`(n)`: for each wrapped position `x[i]` and each slot `s`
/// of `geo` (a decomposed dimension, [`SelectGeometry`]), whether the host's exact test
/// (`decomp::plan`'s `sent` over `excess2`, in the same `f64` operations) sends the atom in
/// pulse 0 along that dimension; the block's count per slot at `block_counts[SELECT_SLOTS block + s]`
/// (0 for the slots at or above `geo.n_dims`).
pub const SELECT_COUNT: &str = "select_count";
/// `select_scan(block_counts, n_blocks, info)`: one block of [`SELECT_SCAN_THREADS`] threads with
/// [`SELECT_SCAN_SHARED_BYTES`]: where each block's selected atoms of each slot start, in place,
/// in one output array of every slot after another (slot `s` starts after the atoms of the slots
/// below it), and each slot's count to `info[s]` (`s < `[`SELECT_SLOTS`]).
pub const SELECT_SCAN: &str = "select_scan";
/// `select_scatter(x, ids, n, geo, block_starts, map, atoms)`: the last pass, same launch as
/// [`SELECT_COUNT`]: each atom selected in slot `s` written to its place (index order within the
/// slot): its index `i` to `map`, its id and wrapped position to `atoms` as a [`SelectedAtom`].
/// `map` and `atoms` hold the slots' atoms one slot after another (at most `n` per slot).
pub const SELECT_SCATTER: &str = "select_scatter";
/// Threads per block of [`SELECT_COUNT`] and [`SELECT_SCATTER`] (whole warps).
pub const SELECT_THREADS: u32 = 256;
/// Slots of a [`SelectGeometry`]: at most three decomposed dimensions, each a pulse's selection.
pub const SELECT_SLOTS: usize = 3;
/// Dynamic shared memory of a count or scatter block: one count per warp and slot.
pub const SELECT_SHARED_BYTES: u32 = (SELECT_THREADS / 32) * SELECT_SLOTS as u32 * 4;
/// Threads of the one [`SELECT_SCAN`] block (a power of two).
pub const SELECT_SCAN_THREADS: u32 = 1024;
/// Dynamic shared memory of the [`SELECT_SCAN`] block: one running sum per thread and slot.
pub const SELECT_SCAN_SHARED_BYTES: u32 = SELECT_SCAN_THREADS * SELECT_SLOTS as u32 * 4;
/// `info` words of the selection: the count of each slot, padded to 16 bytes.
pub const SELECT_INFO_WORDS: usize = 4;

/// Blocks of [`SELECT_COUNT`] and [`SELECT_SCATTER`] for `n` atoms (at least one, so the passes
/// write their counts for `n = 0` too).
pub const fn select_blocks(n: u32) -> u32 {
    let b = n.div_ceil(SELECT_THREADS);
    if b == 0 { 1 } else { b }
}

/// What the selection kernels read (one small device buffer, uploaded once per decomposition and
/// rank): the decomposed dimensions, and per slot `s` (pulse 0 along `dims[s]`) the bounds of the
/// receiver's cell in this rank's frame along each decomposed dimension, and the squared range.
/// An atom at wrapped `w` is selected in slot `s` when, from `0.0`, the sum over `e < n_dims` (in
/// that order) of `x * x`, `x = max(lo[s][e] - v, v - hi[s][e], 0)`, `v = f64(w[dims[e]])`, is
/// below `rc2` (the host's `sent`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SelectGeometry {
    /// Decomposed dimensions (1 to [`SELECT_SLOTS`]); the slots used.
    pub n_dims: u32,
    /// The decomposed dimensions, ascending (0 = x, 1 = y, 2 = z); the rest unused.
    pub dims: [u32; 3],
    /// The squared distance below which an atom is sent (the host's `send_range2(cutoff)`).
    pub rc2: f64,
    /// `lo[s][e]`: lower bound along `dims[e]` of the cell slot `s` sends to.
    pub lo: [[f64; 3]; 3],
    /// `hi[s][e]`: upper bound along `dims[e]` of the cell slot `s` sends to.
    pub hi: [[f64; 3]; 3],
}

/// One selected atom as [`SELECT_SCATTER`] packs it for the read-back: 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SelectedAtom {
    /// Global atom id.
    pub id: u32,
    /// Its wrapped position.
    pub x: Float3,
}

/// `position_extent(x, n, parts)`: the extent of `n` positions (`kernels/extent.rs`; host:
/// `halo::decomp::GpuExtent`), [`EXTENT_BLOCKS`] blocks of [`EXTENT_THREADS`] threads,
/// grid-strided, no shared memory: each warp's lowest and highest coordinate per dimension over
/// its share of the positions and whether one of them is NaN, written by its lane 0 to
/// `parts[warp]` ([`EXTENT_PARTS`] in all, every one written, `inf` / `-inf` for a warp without
/// positions). The host folds the parts (`halo::decomp::fold_extent`).
pub const POSITION_EXTENT: &str = "position_extent";
/// Blocks of [`POSITION_EXTENT`].
pub const EXTENT_BLOCKS: u32 = 16;
/// Threads per block of [`POSITION_EXTENT`] (whole warps).
pub const EXTENT_THREADS: u32 = 256;
/// Parts [`POSITION_EXTENT`] writes: one per warp of its launch.
pub const EXTENT_PARTS: usize = (EXTENT_BLOCKS * EXTENT_THREADS / 32) as usize;

/// One warp's share of a [`POSITION_EXTENT`]: 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct ExtentPart {
    /// The lowest coordinate per dimension (`v < m` keeps `v`: NaN never; `inf` without positions).
    pub lo: [f32; 3],
    /// The highest (`v > m`; `-inf` without positions).
    pub hi: [f32; 3],
    /// 1 when a coordinate was NaN, else 0.
    pub nan: u32,
    /// Padding to 32 bytes.
    pub pad: u32,
}

/// A global atom id scrambled: a bijection of `0..2^31` (halo's systems have fewer atoms), so that
/// ids in arithmetic patterns give sums in none. Multiplications by odd constants modulo 2^31 and
/// xor-shifts right, each invertible on 31-bit words; neither kind alone would do (each is linear
/// in its own arithmetic). The home check's sums (`halo::decomp`'s `home_check`) are over these,
/// made on the host or by [`HOME_ID_FACTS`] with this one function.
#[inline(always)]
pub fn scramble_id(id: u32) -> u32 {
    const LOW31: u32 = 0x7fff_ffff;
    let mut y = id.wrapping_mul(0x2c1b_3c6d) & LOW31;
    y ^= y >> 15;
    y = y.wrapping_mul(0x297a_2d39) & LOW31;
    y ^ (y >> 16)
}

/// `home_id_facts(ids, n, parts)`: what the home check needs of a rank's `n` home ids where they
/// are (`kernels/home_ids.rs`; host: `halo::decomp::GpuIdFacts`), [`ID_FACTS_BLOCKS`] blocks of
/// [`ID_FACTS_THREADS`] threads, grid-strided, no shared memory: each warp's sums over its share
/// of the ids of [`scramble_id`]`(id)` and of its square (both wrapping in 64 bits) and whether
/// one of its ids is not above the id before it, written by its lane 0 to `parts[warp]`
/// ([`ID_FACTS_PARTS`] in all, every one written, zeros for a warp without ids). The host adds the
/// parts up (`halo::decomp::fold_id_facts`).
pub const HOME_ID_FACTS: &str = "home_id_facts";
/// Blocks of [`HOME_ID_FACTS`].
pub const ID_FACTS_BLOCKS: u32 = 16;
/// Threads per block of [`HOME_ID_FACTS`] (whole warps).
pub const ID_FACTS_THREADS: u32 = 256;
/// Parts [`HOME_ID_FACTS`] writes: one per warp of its launch.
pub const ID_FACTS_PARTS: usize = (ID_FACTS_BLOCKS * ID_FACTS_THREADS / 32) as usize;

/// One warp's share of a [`HOME_ID_FACTS`]: 24 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct IdFactsPart {
    /// `Σ scramble_id(id)` over the warp's ids (wrapping).
    pub first: u64,
    /// `Σ scramble_id(id)²` (wrapping).
    pub second: u64,
    /// 1 when one of the warp's ids is not above the id before it in the array, else 0.
    pub unordered: u32,
    /// Padding to 24 bytes.
    pub pad: u32,
}

/// `jacobi7(u_in, u_out, neighbours, n, alpha)`: one Jacobi step of the 7-point stencil over a
/// neighbour table (`examples/stencil3d`).
pub const JACOBI7: &str = "jacobi7";

/// Threads per block of every halo kernel. 512 like GROMACS's fused kernels: few blocks per
/// pulse keep all pulses' blocks co-resident, which the spin-waits rely on.
pub const BLOCK_SIZE: u32 = 512;
/// Atoms one thread moves per launch in the fused kernels (GROMACS uses 4). One: a thread's
/// loads (map, then `x`) and the receiver's polls of low-latency words are serial, so every atom
/// a thread holds adds their latency (on an H200, 4 per thread took 2.2 µs to pack and 3.5 µs
/// to take in 6,254 atoms); the extra blocks are cheap below the residency cap.
pub const ATOMS_PER_THREAD: u32 = 1;
/// Bytes one warp moves with one bulk copy in the TMA kernel: 1.5 KB, the size from which a bulk
/// copy over NVLink pays for its setup (32-atom chunks of 384 bytes did not). A multiple of 16
/// (what `cp.async.bulk` requires) and of every element size, and 32 lanes times a whole number
/// of elements for every element type (4 `Float3`, 12 `f32`, 6 `f64` or 3 `[f32; 4]` per lane).
pub const TMA_CHUNK_BYTES: u32 = 1536;

/// Elements of `elem_bytes` bytes in one TMA chunk ([`TMA_CHUNK_BYTES`]).
pub const fn tma_chunk_atoms(elem_bytes: u32) -> u32 {
    TMA_CHUNK_BYTES / elem_bytes
}

/// Dynamic shared memory of one TMA block: a chunk per warp, then the block's arrival counter
/// (16 bytes, keeping the size a multiple of 16).
pub const TMA_SHARED_BYTES: u32 = (BLOCK_SIZE / 32) * TMA_CHUNK_BYTES + 16;

/// The value every signal slot holds before its first use. Step counters start at 1 and waits
/// compare `seen >= expected`, so an unset slot is below every counter.
pub const SIGNAL_UNSET: u64 = 0;

/// NVSHMEM's `NVSHMEM_SIGNAL_SET`. Passing 0 instead compiles and silently hangs the waiter.
pub const NVSHMEM_SIGNAL_SET: i32 = 9;

/// The four kinds of signal slot a rank holds, `num_pulses` of each, in this order: the slot of
/// pulse `p` and kind `k` is `signals[k * num_pulses + p]` ([`signal_index`]).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalSlot {
    /// "The coordinates of pulse `p` have arrived here" (SET by `recv_pe`).
    CoordData = 0,
    /// "The forces of pulse `p` are in my receive slot" (SET by `send_pe`).
    ForceData = 1,
    /// "`send_pe` has finished reading the coordinates I sent it in pulse `p`" (credit, SET by
    /// `send_pe`; see docs/protocol.md, "Reuse of buffers across steps").
    CoordCredit = 2,
    /// "`recv_pe` has accumulated the forces I pushed to it in pulse `p`" (credit, SET by `recv_pe`).
    ForceCredit = 3,
}

/// Signal slots per pulse (one of each [`SignalSlot`]).
pub const SIGNAL_SLOTS_PER_PULSE: usize = 4;

/// Index of slot `kind` of pulse `pulse` in a rank's signal array of `num_pulses` pulses.
#[inline(always)]
pub const fn signal_index(kind: SignalSlot, pulse: u32, num_pulses: u32) -> usize {
    kind as usize * num_pulses as usize + pulse as usize
}

/// Per-pulse device counters a rank holds, `num_pulses` of each, in this order: coordinate block
/// arrivals (wrap to 0 by themselves), force push arrivals (wrap), force blocks done (reset by the
/// last block of each force launch).
pub const COUNTERS_PER_PULSE: usize = 3;

/// Bits of [`PulseMeta::flags`]: which consumption credits this pulse waits for and sends. The host
/// sets them only where the step's own signals do not already bound a fast sender
/// (`halo::exchange::credits`).
pub mod pulse_flags {
    /// Before writing this pulse's coordinates into `send_pe`, wait (when the previous launch of
    /// this exchange was also a coordinate halo) until `send_pe` finished reading the last ones.
    pub const WAIT_COORD_CREDIT: u32 = 1;
    /// At the end of the coordinate halo, tell `recv_pe` this rank finished reading its pulse.
    pub const SEND_COORD_CREDIT: u32 = 2;
    /// Before pushing this pulse's forces into `recv_pe`, wait (when the previous launch was also
    /// a force halo) until `recv_pe` accumulated the last ones.
    pub const WAIT_FORCE_CREDIT: u32 = 4;
    /// After accumulating this pulse's forces, tell `send_pe` its receive slot is free.
    pub const SEND_FORCE_CREDIT: u32 = 8;
    /// In the fused coordinate kernel, `recv_pe` stores this pulse's coordinates as low-latency
    /// words ([`super::ll`]) into [`super::PulseMeta::x_recv_slots`], and this rank unpacks them
    /// into `x`; otherwise they land in `x` behind a signal (puts, bulk copies, other kernels).
    pub const RECV_X_LL: u32 = 16;
    /// `send_pe` pushes this pulse's forces as low-latency words into
    /// [`super::PulseMeta::recv_slots`]; otherwise it puts them there and signals.
    pub const RECV_F_LL: u32 = 32;
}

/// Low-latency ("LL") words: how a pulse travels between mapped peers without a signal. Each
/// 4-byte word of an element goes out in one 8-byte `st.relaxed.sys` store beside a 4-byte flag
/// that names the step ([`ll::flag`]); the receiver polls the words themselves and takes a value once
/// its flag is the step's. Single-copy atomicity of the 8-byte store makes value and flag arrive
/// together, so the sender needs no fence and no release (the 1.4 µs a release store waits for the
/// remote stores before it) and the receiver no acquire (docs/protocol.md, "Low-latency words").
/// A slot pair is double-buffered by step parity, so a slot holds step `e` or `e - 2`, whose flags
/// always differ, and never 0 (the zeroed slots' flag).
pub mod ll {
    /// The flag of step `epoch`: its low 32 bits with bit 0 set (never 0; steps 2 apart differ).
    #[inline(always)]
    pub const fn flag(epoch: u64) -> u32 {
        (epoch as u32) | 1
    }

    /// The step whose words carry `flag`, read in a slot of `epoch`'s parity while waiting for step
    /// `epoch`: the step nearest `epoch` (within 2^31) of that parity whose flag is `flag`, or 0 when
    /// `flag` is 0 (nothing stored since the slot was zeroed). A word timeout records it as the step
    /// seen (and `epoch` as the step expected), so the host reports steps, not flags.
    #[inline(always)]
    pub const fn step_of_flag(flag: u32, epoch: u64) -> u64 {
        if flag == 0 {
            return 0;
        }
        // A slot of parity `epoch & 1` only ever holds steps of that parity: bit 0 comes from it.
        let low = (flag & !1) | (epoch as u32 & 1);
        let delta = low.wrapping_sub(epoch as u32) as i32 as i64;
        let step = epoch as i64 + delta;
        if step < 0 { 0 } else { step as u64 }
    }

    /// The 8-byte word carrying `value` (4 bytes of an element) for the step of `flag`.
    #[inline(always)]
    pub const fn word(value: u32, flag: u32) -> u64 {
        ((flag as u64) << 32) | value as u64
    }

    /// The value of `word` when it carries `flag`, else `None` (an older step, or nothing yet).
    #[inline(always)]
    pub const fn value(word: u64, flag: u32) -> Option<u32> {
        if (word >> 32) as u32 == flag { Some(word as u32) } else { None }
    }

    /// Bytes of one element of `elem_bytes` as low-latency words: twice its size.
    #[inline(always)]
    pub const fn bytes(elem_bytes: usize) -> usize {
        2 * elem_bytes
    }
}

/// How a pulse on the NVSHMEM put path signals its peer ([`PulseMeta::signal_mode`]).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalMode {
    /// `putmem_signal_nbi_block` with `NVSHMEM_SIGNAL_SET`: the signal is a remote atomic on a
    /// proxy transport.
    PutSignal = 0,
    /// `putmem_nbi_block`, `nvshmem_fence`, then an 8-byte `nvshmem_uint64_p` of the counter into
    /// the slot: no remote atomic, for transports that have none (UCX without GDRCopy). Valid
    /// because slots only grow and waiters compare `>=`.
    FencedPut = 1,
}

impl SignalMode {
    /// The mode for a raw [`PulseMeta::signal_mode`]; unknown values use `PutSignal`.
    #[inline(always)]
    pub const fn from_u32(v: u32) -> Self {
        match v {
            1 => Self::FencedPut,
            _ => Self::PutSignal,
        }
    }
}

/// How the fused coordinate kernel moves one pulse ([`PulseMeta::path`]), chosen per pulse by the
/// host from the router's transport for the pulse's `send_pe`. The kernel branches on it per
/// block (a block serves one pulse), so the choice is block-uniform.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordPath {
    /// The threads store low-latency words ([`ll`]) into the peer's coordinate receive slots
    /// (`remote_x_slots != 0`), which the peer unpacks into its `x`: no fence, no signal.
    Store = 0,
    /// Per-warp bulk copies (`cp.async.bulk`) into the peer's mapped memory: needs
    /// `remote_x != 0` and the launch's [`TMA_SHARED_BYTES`] of dynamic shared memory.
    Bulk = 1,
    /// NVSHMEM put + signal (`remote_x == 0`).
    Put = 2,
}

impl CoordPath {
    /// The path for a raw [`PulseMeta::path`]; unknown values are [`CoordPath::Store`] (the
    /// kernel still puts whenever `remote_x == 0`).
    #[inline(always)]
    pub const fn from_u32(v: u32) -> Self {
        match v {
            1 => Self::Bulk,
            2 => Self::Put,
            _ => Self::Store,
        }
    }
}

/// Which halo a rank launched last ([`ProtocolState::last_direction`]).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Nothing since the exchange was installed or reset.
    None = 0,
    /// The coordinate (forward) halo.
    Coordinates = 1,
    /// The force (reverse) halo.
    Forces = 2,
}

/// One rank's protocol state, resident on its GPU: the step counters that signals are compared
/// against. Each kernel reads it at its start and the last block of the launch advances it, so a
/// captured step replays any number of times with no host work (docs/protocol.md, "Graphs").
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct ProtocolState {
    /// Coordinate halos completed: the next one signals and waits for `x_epoch + 1`.
    pub x_epoch: u64,
    /// Force halos completed: the next one signals and waits for `f_epoch + 1`.
    pub f_epoch: u64,
    /// A [`Direction`]: which halo completed last.
    pub last_direction: u32,
    /// Arrivals in the running coordinate launch: of pulses (TMA and per-pulse kernels) or of
    /// blocks (fused kernel); wraps to 0 after the last.
    pub x_finished: u32,
    /// Blocks of the running force launch that have pushed (wraps to 0 after the last).
    pub f_finished: u32,
    /// Zero (keeps the size a multiple of 8).
    pub reserved: u32,
}

/// A coordinate or force: three `f32`, 12 bytes, no padding (GROMACS's `float3`/`rvec`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Float3 {
    /// x component
    pub x: f32,
    /// y component
    pub y: f32,
    /// z component
    pub z: f32,
}

impl Float3 {
    /// A vector from its components.
    pub const fn new(x: f32, y: f32, z: f32) -> Self {
        Self { x, y, z }
    }
}

impl core::ops::Add for Float3 {
    type Output = Self;
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Self::new(self.x + o.x, self.y + o.y, self.z + o.z)
    }
}

/// Which entries of an index map [`PACK_SUBSET`] packs, relative to a threshold (the number of
/// home atoms: entries below it are independent of earlier pulses, the rest were received in them).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackMode {
    /// Every entry.
    All = 0,
    /// Entries whose atom index is below the threshold (independent atoms).
    BelowThreshold = 1,
    /// Entries whose atom index is at or above the threshold (dependent atoms).
    AtOrAboveThreshold = 2,
}

impl PackMode {
    /// The mode for a raw kernel argument; unknown values pack nothing.
    #[inline(always)]
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::All),
            1 => Some(Self::BelowThreshold),
            2 => Some(Self::AtOrAboveThreshold),
            _ => None,
        }
    }

    /// Whether an atom index is packed in this mode.
    #[inline(always)]
    pub const fn selects(self, atom: u32, threshold: u32) -> bool {
        match self {
            Self::All => true,
            Self::BelowThreshold => atom < threshold,
            Self::AtOrAboveThreshold => atom >= threshold,
        }
    }
}

/// One pulse of the halo, as the fused and per-pulse kernels read it (GROMACS's
/// `HaloExchangeData`). Built by the host from the halo plan; one array per rank, dim-major order.
///
/// Coordinates of pulse `p` go to `send_pe` and come from `recv_pe`; forces travel the other way.
/// Slot pairs hold two slots (staging: `slot_bytes` apart; receive: `recv_slot_bytes` apart), used
/// by step parity (`epoch & 1`): a fast sender writes the other one while the receiver still reads
/// this one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct PulseMeta {
    /// `*const u32`: `send_size` local atom indices to send.
    pub index_map: u64,
    /// Put path: this pulse's pair of coordinate staging slots in the local (symmetric) send buffer.
    pub x_stage: u64,
    /// Put path: this pulse's pair of force staging slots in the local (symmetric) buffer.
    pub f_stage: u64,
    /// This pulse's pair of local force receive slots (symmetric: the same offset on every PE),
    /// [`Self::recv_slot_bytes`] apart: low-latency words pushed by `send_pe`
    /// ([`pulse_flags::RECV_F_LL`]), or plain forces it put.
    pub recv_slots: u64,
    /// `send_pe`'s coordinate array at its `atom_offset` for this pulse, when it is reachable by
    /// stores; 0 selects the put path.
    pub remote_x: u64,
    /// `send_pe`'s coordinate-data slot for this pulse (direct path only).
    pub remote_x_signal: u64,
    /// `recv_pe`'s pair of force receive slots for this pulse, when reachable by stores (forces
    /// are pushed there); 0 selects the put path for forces.
    pub remote_recv_slots: u64,
    /// `recv_pe`'s force-data slot for this pulse (direct path only).
    pub remote_f_signal: u64,
    /// `recv_pe`'s coordinate-credit slot for this pulse (direct; 0: NVSHMEM put).
    pub remote_x_credit: u64,
    /// `send_pe`'s force-credit slot for this pulse (direct; 0: NVSHMEM put).
    pub remote_f_credit: u64,
    /// Periodic shift added to packed coordinates when `use_shift` is set (a box row).
    pub shift: Float3,
    /// Atoms sent (coordinates) and received back (forces).
    pub send_size: u32,
    /// Atoms received (coordinates) and sent back (forces).
    pub recv_size: u32,
    /// Where this pulse's received atoms start in the local arrays.
    pub atom_offset: u32,
    /// `send_pe`'s `atom_offset` for this pulse: where the sent atoms land there.
    pub peer_atom_offset: u32,
    /// PE that receives this pulse's coordinates.
    pub send_pe: i32,
    /// PE that sends this pulse's coordinates.
    pub recv_pe: i32,
    /// Nonzero: add `shift` when packing (the pulse crosses the periodic boundary).
    pub use_shift: u32,
    /// Bytes between the two slots of every staging pair (a multiple of 16).
    pub slot_bytes: u32,
    /// [`pulse_flags`] bits.
    pub flags: u32,
    /// A [`SignalMode`]: how the put path signals.
    pub signal_mode: u32,
    /// A [`CoordPath`]: how the fused coordinate kernel moves this pulse (one launch may mix
    /// them: pulses whose peers differ take different paths).
    pub path: u32,
    /// Bytes between the two slots of a receive pair ([`Self::recv_slots`], [`Self::x_recv_slots`]):
    /// room for a pulse as low-latency words ([`ll::bytes`]), a multiple of 16.
    pub recv_slot_bytes: u32,
    /// Zero (keeps the pointers below 8-byte aligned).
    pub reserved: u32,
    /// This pulse's pair of local coordinate receive slots (symmetric), where `recv_pe` stores
    /// low-latency words when [`pulse_flags::RECV_X_LL`] is set.
    pub x_recv_slots: u64,
    /// `send_pe`'s pair of coordinate receive slots for this pulse when reachable by stores (the
    /// fused kernel's [`CoordPath::Store`] stores low-latency words there); 0 otherwise.
    pub remote_x_slots: u64,
}

impl PulseMeta {
    /// Whether `flag` ([`pulse_flags`]) is set.
    #[inline(always)]
    pub const fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    /// Whether the fused coordinate kernel moves this pulse with bulk copies: asked for, and the
    /// peer mapped (a bulk copy needs an address to copy to; otherwise the pulse puts).
    #[inline(always)]
    pub const fn bulk(&self) -> bool {
        self.path == CoordPath::Bulk as u32 && self.remote_x != 0
    }
}

/// What a kernel writes when a bounded spin-wait expires, so the host can name the missing
/// signal instead of hanging. The first waiter to time out fills it (`timed_out` goes 0 -> 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct WaitStatus {
    /// 0 while nothing timed out, 1 once a wait expired.
    pub timed_out: u32,
    /// Flat pulse index of the wait that expired.
    pub pulse: u32,
    /// What was awaited, a [`WaitKind`] value.
    pub kind: u32,
    /// The PE whose signal never came (-1 for a wait on local blocks).
    pub peer: i32,
    /// The value the wait needed.
    pub expected: u64,
    /// The value it last read.
    pub seen: u64,
    /// How long it waited, in nanoseconds of `%globaltimer`.
    pub waited_ns: u64,
}

/// What a timed-out spin-wait was waiting for.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitKind {
    /// Coordinates of a pulse from `recv_pe`.
    CoordSignal = 0,
    /// Forces of a pulse from `send_pe`.
    ForceSignal = 1,
    /// Other blocks of the same launch (a device-wide barrier or a later pulse's unpack).
    LocalBlocks = 2,
    /// `send_pe` finishing its reading of this pulse's previous coordinates (a credit).
    CoordCredit = 3,
    /// `recv_pe` finishing its accumulation of this pulse's previous forces (a credit).
    ForceCredit = 4,
}

impl WaitKind {
    /// The kind for a raw [`WaitStatus::kind`].
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::CoordSignal),
            1 => Some(Self::ForceSignal),
            2 => Some(Self::LocalBlocks),
            3 => Some(Self::CoordCredit),
            4 => Some(Self::ForceCredit),
            _ => None,
        }
    }
}

/// Atoms per cluster of the nbnxm kernels (GROMACS's GPU layout uses 8 as well).
pub const NBNXM_CLUSTER_SIZE: u32 = 8;
/// Clusters per i-supercluster: one warp computes the interactions of up to this many i-clusters
/// with each j-cluster of its list, so every j-cluster it loads is used several times.
pub const NBNXM_CLUSTERS_PER_SUPER: u32 = 8;
/// Atom slots per i-supercluster.
pub const NBNXM_SUPER_SIZE: u32 = NBNXM_CLUSTER_SIZE * NBNXM_CLUSTERS_PER_SUPER;
/// `atom_index` of a padding slot (a cluster with fewer than 8 atoms).
pub const NBNXM_FILLER: u32 = u32::MAX;
/// Low bits of a j-list word: which i-clusters of the entry's supercluster (bit `k` = cluster `k`)
/// interact with the j-cluster; the j-cluster index sits above them (`word >> NBNXM_MASK_BITS`).
pub const NBNXM_MASK_BITS: u32 = NBNXM_CLUSTERS_PER_SUPER;
/// The shift index of "no periodic shift". A shift index is `(sx + 1) + 3 (sy + 1) + 9 (sz + 1)`
/// for `sx, sy, sz` in `{-1, 0, 1}`; the entry's i-coordinates are moved by `(sx Lx, sy Ly, sz Lz)`.
pub const NBNXM_CENTRAL_SHIFT: u32 = 13;
/// Number of shift indices.
pub const NBNXM_NUM_SHIFTS: u32 = 27;

/// Warps per block of the GPU cluster-pair search (one warp per item).
pub const NBNXM_SEARCH_WARPS_PER_BLOCK: u32 = 4;
/// Dynamic shared memory of one search block: the 8 shifted i-cluster boxes of each warp.
pub const NBNXM_SEARCH_SHARED_BYTES: u32 = NBNXM_SEARCH_WARPS_PER_BLOCK * NBNXM_CLUSTERS_PER_SUPER * 24;

/// An axis-aligned box of the cluster grid (nm); an empty cluster has `lo = +inf`, `hi = -inf`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct NbnxmBox {
    /// Lower corner.
    pub lo: [f32; 3],
    /// Upper corner.
    pub hi: [f32; 3],
}

/// The column grid of one zone for the GPU search: its atoms' extent, `columns[0] x columns[1]`
/// columns of `cell` (nm) in x-y, whose superclusters are
/// `column_start[column_base + c] .. column_start[column_base + c + 1]` (ascending z).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct NbnxmZone {
    /// Extent of the zone's atoms (the whole box along periodic dimensions).
    pub extent: NbnxmBox,
    /// Column widths along x and y.
    pub cell: [f32; 2],
    /// Columns along x and y.
    pub columns: [u32; 2],
    /// Where this zone's column starts sit in `column_start`.
    pub column_base: u32,
    /// One past the zone's last supercluster.
    pub sc_end: u32,
    /// The zone (bit `d`: above this rank's cell along dimension `d`).
    pub zone: u32,
    /// Padding.
    pub reserved: u32,
}

/// One periodic shift of the GPU search: its index (see [`NBNXM_CENTRAL_SHIFT`]) and vector.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct NbnxmShift {
    /// The shift vector (nm).
    pub v: [f32; 3],
    /// Shift index.
    pub index: u32,
}

/// One i-entry of a cluster-pair list: an i-supercluster under one periodic shift, and its range
/// of j-list words. Long j-lists are split over several entries of the same supercluster and shift
/// (every force is added atomically, so the split changes nothing but the load balance).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "nvptx64"), derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct NbnxmEntry {
    /// The i-supercluster: its slots are `sci * NBNXM_SUPER_SIZE ..` and its clusters
    /// `sci * NBNXM_CLUSTERS_PER_SUPER ..`.
    pub sci: u32,
    /// Shift index (see [`NBNXM_CENTRAL_SHIFT`]).
    pub shift: u32,
    /// First j-list word.
    pub j_start: u32,
    /// One past the last j-list word.
    pub j_end: u32,
}

// Host and device must agree on these layouts byte for byte.
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Float3>() == 12 && align_of::<Float3>() == 4);
    assert!(size_of::<PulseMeta>() == 160 && align_of::<PulseMeta>() == 8);
    assert!(offset_of!(PulseMeta, remote_f_credit) == 72);
    assert!(offset_of!(PulseMeta, shift) == 80);
    assert!(offset_of!(PulseMeta, send_size) == 92);
    assert!(offset_of!(PulseMeta, send_pe) == 108);
    assert!(offset_of!(PulseMeta, path) == 132);
    assert!(offset_of!(PulseMeta, x_recv_slots) == 144);
    assert!(size_of::<WaitStatus>() == 40 && align_of::<WaitStatus>() == 8);
    assert!(offset_of!(WaitStatus, expected) == 16);
    assert!(size_of::<ProtocolState>() == 32 && align_of::<ProtocolState>() == 8);
    assert!(offset_of!(ProtocolState, last_direction) == 16);
    // Bulk copies move whole chunks: a multiple of 16 bytes, 32 lanes x whole elements.
    assert!(TMA_CHUNK_BYTES.is_multiple_of(16));
    assert!(TMA_CHUNK_BYTES.is_multiple_of(32 * 4) && TMA_CHUNK_BYTES.is_multiple_of(32 * 8));
    assert!(TMA_CHUNK_BYTES.is_multiple_of(32 * 12) && TMA_CHUNK_BYTES.is_multiple_of(32 * 16));
    assert!(TMA_SHARED_BYTES.is_multiple_of(16));
    assert!(BLOCK_SIZE.is_multiple_of(32));
    assert!(size_of::<NbnxmEntry>() == 16 && align_of::<NbnxmEntry>() == 4);
    // One warp covers the i-cluster atoms x 4 j-lanes; the mask fits the low bits of a j word.
    assert!(NBNXM_CLUSTER_SIZE * 4 == 32 && NBNXM_MASK_BITS <= 8);
    assert!(NBNXM_SUPER_SIZE == 64);
    assert!(size_of::<NbnxmBox>() == 24 && size_of::<NbnxmZone>() == 56 && size_of::<NbnxmShift>() == 16);
    assert!(offset_of!(NbnxmZone, column_base) == 40 && offset_of!(NbnxmZone, zone) == 48);
    // The table starts 8-byte aligned, each warp's partials 16-byte aligned, and the largest force
    // block fits the 48 KiB of dynamic shared memory a launch gets without opting in.
    assert!(NBNXM_TABLE_OFFSET.is_multiple_of(16) && NBNXM_PARTIAL_FLOATS.is_multiple_of(4));
    assert!(nbnxm_force_shared_bytes(NBNXM_MAX_TYPES, NBNXM_MAX_WARPS_PER_ENTRY) <= 48 * 1024);
    // The grid's fill blocks: 8-byte keys first in each warp's region, every region 16-byte aligned.
    assert!(NBNXM_GRID_FILL_WARP_BYTES.is_multiple_of(16) && NBNXM_GRID_FILL_SHARED_BYTES <= 48 * 1024);
    assert!(NBNXM_GRID_SCAN_THREADS.is_power_of_two() && NBNXM_GRID_SORT_THREADS.is_multiple_of(32));
    // The layout passes scan with one block (a power of two of threads, whole warps).
    assert!(NBNXM_LAYOUT_THREADS.is_power_of_two() && NBNXM_LAYOUT_THREADS >= 32 && NBNXM_LAYOUT_SHARED_BYTES <= 48 * 1024);
    // The order passes: one entry per thread, whole warps, blocks a launch can take; the scan with one block.
    assert!(NBNXM_ORDER_TILE.is_multiple_of(32) && NBNXM_ORDER_TILE <= 1024 && NBNXM_ORDER_SHARED_BYTES <= 48 * 1024);
    assert!(NBNXM_ORDER_SCAN_THREADS.is_power_of_two() && NBNXM_ORDER_SCAN_THREADS <= 1024);
    // The migration: whole warps (ballots), a one-block scan, the geometry and leavers' layouts.
    assert!(MIGRATE_THREADS.is_multiple_of(32) && MIGRATE_THREADS <= 1024);
    assert!(MIGRATE_SCAN_THREADS.is_power_of_two() && MIGRATE_SCAN_THREADS <= 1024 && MIGRATE_SCAN_SHARED_BYTES <= 48 * 1024);
    assert!(size_of::<MigrateLeaver>() == 32 && align_of::<MigrateLeaver>() == 4);
    assert!(MIGRATE_MERGE_THREADS.is_multiple_of(32) && MIGRATE_MERGE_THREADS <= 1024);
    assert!(MIGRATE_MERGE_INFO_REPEATED < MIGRATE_MERGE_INFO_WORDS && MIGRATE_MERGE_INFO_WORDS.is_multiple_of(4));
    assert!(size_of::<MigrateGeometry>() == 40 + 12 * MIGRATE_MAX_EDGES && offset_of!(MigrateGeometry, edges) == 40);
    // The selection: whole warps (ballots), a one-block scan, the geometry and packed atoms' layouts.
    assert!(SELECT_THREADS.is_multiple_of(32) && SELECT_THREADS <= 1024 && SELECT_SLOTS <= SELECT_INFO_WORDS);
    assert!(SELECT_SCAN_THREADS.is_power_of_two() && SELECT_SCAN_THREADS <= 1024 && SELECT_SCAN_SHARED_BYTES <= 48 * 1024);
    assert!(size_of::<SelectGeometry>() == 168 && align_of::<SelectGeometry>() == 8 && offset_of!(SelectGeometry, lo) == 24);
    assert!(size_of::<SelectedAtom>() == 16 && align_of::<SelectedAtom>() == 4);
    // The home ids' facts: whole warps (each lane 0 writes its warp's part), 24-byte parts.
    assert!(ID_FACTS_THREADS.is_multiple_of(32) && ID_FACTS_THREADS <= 1024);
    assert!(size_of::<IdFactsPart>() == 24 && align_of::<IdFactsPart>() == 8);
};

#[cfg(test)]
mod tests {
    use super::ll;

    /// A word timeout reports steps: the flag a slot held, read back as the step that stored it.
    #[test]
    fn a_words_flag_reads_back_as_its_step() {
        // Nothing stored yet (a zeroed slot).
        assert_eq!(ll::step_of_flag(0, 1), 0);
        assert_eq!(ll::step_of_flag(0, 2), 0);
        // Waiting for step 3 or 4, the slot still holds step 1 or 2 (two steps back): odd and even
        // steps share a flag (2 and 3 both have flag 3), the slot's parity tells them apart.
        assert_eq!(ll::step_of_flag(ll::flag(1), 3), 1);
        assert_eq!(ll::step_of_flag(ll::flag(2), 4), 2);
        assert_eq!(ll::step_of_flag(ll::flag(2), 2), 2);
        assert_eq!(ll::step_of_flag(ll::flag(3), 3), 3);
        // Every step, near the 32-bit wrap of the flag and far past it, two back and two ahead.
        for epoch in [2u64, 3, 9, 10, (1 << 32) - 2, (1 << 32) - 1, 1 << 32, (1 << 32) + 1, (5 << 32) + 6, (5 << 32) + 7] {
            for other in [epoch - 2, epoch, epoch + 2] {
                assert_eq!(ll::step_of_flag(ll::flag(other), epoch), other, "flag of step {other} read while waiting for step {epoch}");
            }
        }
    }
}
