//! Every GPU intrinsic and inline-PTX wrapper the kernels use, and nothing else.
//!
//! Names follow Rust-CUDA's `cuda_std` (`thread::thread_idx_x`, `sync_threads`, `warp::lane_id`,
//! ...) so that moving to another device backend is a change in this one module. Each wrapper
//! states its contract: who may call it, at which scope it orders memory, and what it lowers to.
//! The PTX tests (`host/tests/ptx_instructions.rs`) check that each one still lowers to the
//! instruction named here, so a silent change of memory ordering fails the build.
//!
//! Memory-ordering vocabulary (PTX ISA, "Memory Consistency Model"): `relaxed` orders nothing
//! but is a strong (non-torn, eventually visible) access; `release` makes this thread's earlier
//! writes (and those it has observed) visible before the store; `acquire` makes later reads see
//! what the matching release published. Scope `gpu` covers this device, `sys` covers peer GPUs
//! and the host.

use core::arch::asm;

/// Thread, block and grid indices (`%tid`, `%ctaid`, `%ntid`, `%nctaid`).
pub mod thread {
    use core::arch::nvptx;

    /// `threadIdx.x`. Any thread.
    #[inline(always)]
    pub fn thread_idx_x() -> u32 {
        // SAFETY: reads a special register; no memory effects.
        unsafe { nvptx::_thread_idx_x() }
    }
    /// `blockIdx.x`. Any thread.
    #[inline(always)]
    pub fn block_idx_x() -> u32 {
        // SAFETY: reads a special register.
        unsafe { nvptx::_block_idx_x() }
    }
    /// `blockIdx.y`. Any thread.
    #[inline(always)]
    pub fn block_idx_y() -> u32 {
        // SAFETY: reads a special register.
        unsafe { nvptx::_block_idx_y() }
    }
    /// `blockDim.x`. Any thread.
    #[inline(always)]
    pub fn block_dim_x() -> u32 {
        // SAFETY: reads a special register.
        unsafe { nvptx::_block_dim_x() }
    }
    /// `gridDim.x`. Any thread.
    #[inline(always)]
    pub fn grid_dim_x() -> u32 {
        // SAFETY: reads a special register.
        unsafe { nvptx::_grid_dim_x() }
    }
    /// `blockIdx.x * blockDim.x + threadIdx.x`: this thread's index along x of the grid.
    #[inline(always)]
    pub fn index_1d() -> u32 {
        block_idx_x() * block_dim_x() + thread_idx_x()
    }
    /// Threads along x of the whole grid: the stride of a grid-stride loop.
    #[inline(always)]
    pub fn grid_stride_x() -> u32 {
        grid_dim_x() * block_dim_x()
    }
}

/// Block-wide barrier (`bar.sync 0`, via LLVM's convergent intrinsic, never raw asm: a raw-asm
/// barrier is not marked convergent and may be duplicated into divergent paths).
///
/// # Safety
/// Every thread of the block must reach the same call (no divergent call sites), or the block hangs.
#[inline(always)]
pub unsafe fn sync_threads() {
    // SAFETY: forwarded to the caller's contract.
    unsafe { core::arch::nvptx::_syncthreads() }
}

unsafe extern "C" {
    #[link_name = "llvm.nvvm.barrier0.or"]
    fn barrier0_or(predicate: i32) -> i32;
    #[link_name = "llvm.nvvm.vote.any.sync"]
    fn vote_any_sync(mask: u32, predicate: bool) -> bool;
    #[link_name = "llvm.nvvm.vote.ballot.sync"]
    fn vote_ballot_sync(mask: u32, predicate: bool) -> u32;
    #[link_name = "llvm.nvvm.bar.warp.sync"]
    fn bar_warp_sync(mask: u32);
    #[link_name = "llvm.nvvm.shfl.sync.bfly.f32"]
    fn shfl_sync_bfly_f32(mask: u32, value: f32, lane_mask: u32, clamp: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.bfly.i32"]
    fn shfl_sync_bfly_i32(mask: u32, value: u32, lane_mask: u32, clamp: u32) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.idx.i32"]
    fn shfl_sync_idx_i32(mask: u32, value: u32, src_lane: u32, clamp: u32) -> u32;
    #[link_name = "llvm.nvvm.redux.sync.or"]
    fn redux_sync_or(value: u32, mask: u32) -> u32;
    #[link_name = "llvm.nvvm.match.any.sync.i32"]
    fn match_any_sync_i32(mask: u32, value: u32) -> u32;
}

/// Block-wide barrier that also returns whether any thread's `predicate` was true
/// (`bar.red.or.pred`, CUDA's `__syncthreads_or`).
///
/// # Safety
/// Same as [`sync_threads`]: every thread of the block must make the same call.
#[inline(always)]
pub unsafe fn sync_threads_or(predicate: bool) -> bool {
    // SAFETY: forwarded to the caller's contract; the intrinsic is convergent.
    unsafe { barrier0_or(predicate as i32) != 0 }
}

/// Warp-level functions. All lanes named in `mask` must call them together (convergent).
pub mod warp {
    /// Lanes per warp on every NVIDIA GPU so far.
    pub const WARP_SIZE: u32 = 32;
    /// All 32 lanes.
    pub const FULL_MASK: u32 = u32::MAX;

    /// This thread's lane in its warp (`%laneid`). Any thread.
    #[inline(always)]
    pub fn lane_id() -> u32 {
        let lane: u32;
        // SAFETY: reads a special register; no memory effects.
        unsafe { core::arch::asm!("mov.u32 {l}, %laneid;", l = out(reg32) lane, options(pure, nomem, nostack)) };
        lane
    }

    /// This thread's warp within its block.
    #[inline(always)]
    pub fn warp_id() -> u32 {
        super::thread::thread_idx_x() / WARP_SIZE
    }

    /// True if any lane in `mask` passes a true `predicate` (`vote.sync.any.pred`).
    ///
    /// # Safety
    /// Every lane in `mask` must execute this same call, and the calling lane must be in `mask`.
    #[inline(always)]
    pub unsafe fn warp_vote_any(mask: u32, predicate: bool) -> bool {
        // SAFETY: forwarded to the caller's contract.
        unsafe { super::vote_any_sync(mask, predicate) }
    }

    /// Bit `l` set when lane `l` of `mask` passes a true `predicate` (`vote.sync.ballot.b32`); the
    /// same word on every lane: the lanes' predicates as a word, for ordered compaction
    /// (`popc(ballot & lanes below)`).
    ///
    /// # Safety
    /// Every lane in `mask` must execute this same call, and the calling lane must be in `mask`.
    #[inline(always)]
    pub unsafe fn ballot(mask: u32, predicate: bool) -> u32 {
        // SAFETY: forwarded to the caller's contract.
        unsafe { super::vote_ballot_sync(mask, predicate) }
    }

    /// The `value` of lane `src_lane` (`shfl.sync.idx.b32`): a broadcast when every lane asks for
    /// the same lane. Registers only, no memory.
    ///
    /// # Safety
    /// Every lane in `mask` must execute this same call, the calling lane and `src_lane` must be
    /// in `mask`, and `src_lane < 32`.
    #[inline(always)]
    pub unsafe fn shfl_idx_u32(mask: u32, value: u32, src_lane: u32) -> u32 {
        // SAFETY: forwarded to the caller's contract; clamp 0x1f spans the whole warp.
        unsafe { super::shfl_sync_idx_i32(mask, value, src_lane, 0x1f) }
    }

    /// Bitwise OR of `value` over the lanes of `mask` (`redux.sync.or.b32`, sm_80 and newer): one
    /// instruction instead of five butterfly steps; the same word on every lane.
    ///
    /// # Safety
    /// Every lane in `mask` must execute this same call, and the calling lane must be in `mask`.
    #[inline(always)]
    pub unsafe fn reduce_or_u32(mask: u32, value: u32) -> u32 {
        // SAFETY: forwarded to the caller's contract.
        unsafe { super::redux_sync_or(value, mask) }
    }

    /// The lanes of `mask` whose `value` equals this lane's (`match.any.sync.b32`, sm_70 and
    /// newer): a bit per lane, this lane's own included. With `popc(peers & lanes below)` it
    /// ranks a lane among the warp's lanes of the same value, in lane order (a stable counting
    /// sort's rank without atomics). Registers only, no memory.
    ///
    /// # Safety
    /// Every lane in `mask` must execute this same call, and the calling lane must be in `mask`.
    #[inline(always)]
    pub unsafe fn match_any_u32(mask: u32, value: u32) -> u32 {
        // SAFETY: forwarded to the caller's contract.
        unsafe { super::match_any_sync_i32(mask, value) }
    }

    /// Reconverge the lanes in `mask` and order their memory accesses (`bar.warp.sync`):
    /// shared-memory writes before it are visible to the mask's lanes after it.
    ///
    /// # Safety
    /// Every lane in `mask` must execute this same call, and the calling lane must be in `mask`.
    #[inline(always)]
    pub unsafe fn sync_warp(mask: u32) {
        // SAFETY: forwarded to the caller's contract.
        unsafe { super::bar_warp_sync(mask) }
    }

    /// The `value` of lane `lane_id() ^ lane_mask` (`shfl.sync.bfly.b32`, through LLVM's
    /// convergent intrinsic): the butterfly step of a warp reduction. Registers only, no memory.
    ///
    /// # Safety
    /// Every lane in `mask` must execute this same call, the calling lane must be in `mask`, and
    /// the partner lane must be in `mask` too.
    #[inline(always)]
    pub unsafe fn shfl_xor_f32(mask: u32, value: f32, lane_mask: u32) -> f32 {
        // SAFETY: forwarded to the caller's contract; clamp 0x1f spans the whole warp.
        unsafe { super::shfl_sync_bfly_f32(mask, value, lane_mask, 0x1f) }
    }

    /// [`shfl_xor_f32`] of a 32-bit word (`shfl.sync.bfly.b32`): the word of lane
    /// `lane_id() ^ lane_mask`, bits as they are. Registers only, no memory.
    ///
    /// # Safety
    /// As [`shfl_xor_f32`]: every lane in `mask` executes this same call, the calling lane and its
    /// partner are in `mask`.
    #[inline(always)]
    pub unsafe fn shfl_xor_u32(mask: u32, value: u32, lane_mask: u32) -> u32 {
        // SAFETY: forwarded to the caller's contract; clamp 0x1f spans the whole warp.
        unsafe { super::shfl_sync_bfly_i32(mask, value, lane_mask, 0x1f) }
    }

    /// The wrapping sum of `value` over the 32 lanes, on every lane: five butterfly steps, each
    /// moving the two 32-bit halves ([`shfl_xor_u32`] twice). Registers only, no memory.
    ///
    /// # Safety
    /// All 32 lanes of the warp execute this same call.
    #[inline(always)]
    pub unsafe fn sum_u64(value: u64) -> u64 {
        /// One butterfly step: this lane's value plus its partner's, both halves moved.
        #[inline(always)]
        unsafe fn step(v: u64, lane_mask: u32) -> u64 {
            // SAFETY: all lanes together, full mask (`sum_u64`'s contract).
            let (lo, hi) = unsafe { (shfl_xor_u32(FULL_MASK, v as u32, lane_mask), shfl_xor_u32(FULL_MASK, (v >> 32) as u32, lane_mask)) };
            v.wrapping_add((u64::from(hi) << 32) | u64::from(lo))
        }
        // Written out: a loop over an array of offsets lands in local memory.
        // SAFETY: all lanes together (the caller's contract).
        unsafe { step(step(step(step(step(value, 16), 8), 4), 2), 1) }
    }
}

/// Fast arithmetic with stated accuracy.
pub mod math {
    /// `fma.rn.f32`: `a * b + c` with one rounding. Written out because LLVM's NVPTX backend emits
    /// `mul.rn` and `add.rn` for plain Rust arithmetic, which ptxas never contracts. Any thread.
    #[inline(always)]
    pub fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
        core::intrinsics::fmaf32(a, b, c)
    }

    /// `cvt.rmi.f32.f32`: the largest integer not above `x` (exact, like the host's `f32::floor`).
    /// Any thread; no memory effects.
    #[inline(always)]
    pub fn floor_f32(x: f32) -> f32 {
        core::intrinsics::floorf32(x)
    }

    /// `rcp.approx.ftz.f32`: `1 / x` to within 1 ulp (subnormals flushed to zero), one MUFU
    /// instruction instead of the dozen of an IEEE division. Any thread; no memory effects.
    #[inline(always)]
    pub fn rcp_approx_f32(x: f32) -> f32 {
        let r: f32;
        // SAFETY: pure arithmetic on registers.
        unsafe { core::arch::asm!("rcp.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack)) };
        r
    }
}

/// `%globaltimer`: nanoseconds, the same clock on every SM (updated about every microsecond).
/// Used for the deadlines of bounded spin-waits. Any thread.
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let t: u64;
    // SAFETY: reads a special register; not `pure`, since consecutive reads must not be merged.
    unsafe { asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nomem, nostack)) };
    t
}

/// The timeline probe's one store (`kernels::timeline`): `red.relaxed.gpu.global.max.u64 [slot],
/// t`, or `.min` when `earliest`, so a word that many blocks stamp keeps the latest (earliest)
/// time. Fire and forget, no ordering: the host reads the stamps after the kernel. Only the
/// instrumented kernels contain it (the PTX tests check that the exchange's own kernels do not).
///
/// # Safety
/// `slot` must be a valid, 8-byte-aligned global address on this device.
#[inline(always)]
pub unsafe fn stamp_time(slot: *mut u64, t: u64, earliest: bool) {
    // SAFETY: the caller guarantees `slot`.
    unsafe {
        if earliest {
            asm!("red.relaxed.gpu.global.min.u64 [{p}], {t};", p = in(reg64) slot, t = in(reg64) t, options(nostack));
        } else {
            asm!("red.relaxed.gpu.global.max.u64 [{p}], {t};", p = in(reg64) slot, t = in(reg64) t, options(nostack));
        }
    }
}

/// `ld.relaxed.sys.global.u64`: a strong load that sees stores from any GPU or the host
/// eventually, ordering nothing. The spin of a signal wait; the data behind the signal is ordered
/// by one [`load_acquire_sys_u64`] of the same slot once the spin has seen the value.
///
/// # Safety
/// `ptr` must be a valid, 8-byte-aligned global address (local or a peer's mapped memory).
#[inline(always)]
pub unsafe fn load_relaxed_sys_u64(ptr: *const u64) -> u64 {
    let v: u64;
    // SAFETY: the caller guarantees `ptr`; no `nomem`: the compiler must not move accesses across.
    unsafe { asm!("ld.relaxed.sys.global.u64 {v}, [{p}];", v = out(reg64) v, p = in(reg64) ptr, options(nostack)) };
    v
}

/// `ld.acquire.sys.global.u64`: pairs with a release (or a release pattern) at system scope by any
/// GPU or the host that wrote the value read, or a later value of the same location: every read
/// this thread makes after it sees what that writer published. The end of a signal wait: one
/// re-read of the slot the relaxed spin saw set (coherence makes it read that value or a later
/// one, and every writer of a slot releases), instead of a full `fence.acq_rel.sys`.
///
/// # Safety
/// `ptr` must be a valid, 8-byte-aligned global address (local or a peer's mapped memory).
#[inline(always)]
pub unsafe fn load_acquire_sys_u64(ptr: *const u64) -> u64 {
    let v: u64;
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("ld.acquire.sys.global.u64 {v}, [{p}];", v = out(reg64) v, p = in(reg64) ptr, options(nostack)) };
    v
}

/// `ld.relaxed.gpu.global.u32`: a strong load of a counter or flag that other blocks of this
/// device update, ordering nothing. The spin of a wait on local blocks, and the cheap look at the
/// timeout flag inside every bounded wait.
///
/// # Safety
/// `ptr` must be a valid, 4-byte-aligned global address on this device.
#[inline(always)]
pub unsafe fn load_relaxed_gpu_u32(ptr: *const u32) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("ld.relaxed.gpu.global.u32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) ptr, options(nostack)) };
    v
}

/// `ld.acquire.gpu.global.u32`: pairs with a release at GPU scope by another block of this device
/// (here: the acq-rel arrivals on a completion counter). The end of a wait on local blocks.
///
/// # Safety
/// `ptr` must be a valid, 4-byte-aligned global address on this device.
#[inline(always)]
pub unsafe fn load_acquire_gpu_u32(ptr: *const u32) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("ld.acquire.gpu.global.u32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) ptr, options(nostack)) };
    v
}

/// `st.release.sys.global.u64`: publishes this thread's earlier writes, and those it observed
/// (cumulativity), to any GPU that acquires the value. The signal of a GPU-initiated exchange.
///
/// # Safety
/// `ptr` must be a valid, 8-byte-aligned global address (local or a peer's mapped memory).
#[inline(always)]
pub unsafe fn store_release_sys_u64(ptr: *mut u64, value: u64) {
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("st.release.sys.global.u64 [{p}], {v};", p = in(reg64) ptr, v = in(reg64) value, options(nostack)) };
}

/// `st.relaxed.sys.global.u64`: a strong 8-byte store, single-copy atomic and ordering nothing.
/// The store of a low-latency word (a 4-byte value beside its 4-byte step flag, [`crate::abi::ll`]):
/// a reader that sees the flag of its step in the word sees the value stored with it, so no fence
/// and no signal follow the data (the receiver polls the words themselves).
///
/// # Safety
/// `ptr` must be a valid, 8-byte-aligned global address (local or a peer's mapped memory).
#[inline(always)]
pub unsafe fn store_relaxed_sys_u64(ptr: *mut u64, value: u64) {
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("st.relaxed.sys.global.u64 [{p}], {v};", p = in(reg64) ptr, v = in(reg64) value, options(nostack)) };
}

/// `ld.relaxed.sys.global.u64`, tagged `// ll word` in the PTX: the load of a low-latency word
/// ([`crate::abi::ll`]), the same instruction and contract as [`load_relaxed_sys_u64`] (a strong
/// load, single-copy atomic with the `st.relaxed.sys` that stored the word, ordering nothing). The
/// value and its step flag come in one load, so no acquire follows. Its own wrapper so the PTX
/// tests can find the word path's loads (a signal wait's spin lowers to the same instruction).
///
/// # Safety
/// `ptr` must be a valid, 8-byte-aligned global address (local or a peer's mapped memory).
#[inline(always)]
pub unsafe fn load_word_relaxed_sys_u64(ptr: *const u64) -> u64 {
    let v: u64;
    // SAFETY: the caller guarantees `ptr`; no `nomem`: the compiler must not move accesses across.
    unsafe { asm!("ld.relaxed.sys.global.u64 {v}, [{p}]; // ll word", v = out(reg64) v, p = in(reg64) ptr, options(nostack)) };
    v
}

/// `fence.acq_rel.sys`: a fence at system scope. Together with a later store by this thread (any
/// kind, a peer's memory or an NVSHMEM put's), it forms a release pattern: every memory access
/// this thread made before the fence, and every write it observed (cumulativity), is ordered
/// before that store for any thread, on any GPU or the host, that observes the store and then
/// acquires. Used before a credit that goes by NVSHMEM put: `nvshmem_fence` (a `membar.sys` in
/// 3.4.5) is only specified to order puts to one PE, not the reads of the data the credit releases.
/// Off the fast path: only the put-path credit pays it.
#[inline(always)]
pub fn fence_acq_rel_sys() {
    // SAFETY: no operands; ordering memory is its purpose (no `nomem`).
    unsafe { asm!("fence.acq_rel.sys;", options(nostack)) };
}

/// `griddepcontrol.wait`: blocks until the kernel this one was launched to overlap (programmatic
/// dependent launch, `halo::gpu::KernelModule::launch_overlapping`) has completed and its memory
/// operations are visible; returns at once for a kernel launched plainly. Every kernel that may
/// be launched overlapping calls it before it touches memory an earlier kernel writes.
#[inline(always)]
pub fn wait_for_previous_kernel() {
    // SAFETY: no operands; ordering memory is its purpose (no `nomem`).
    unsafe { asm!("griddepcontrol.wait;", options(nostack)) };
}

/// `griddepcontrol.launch_dependents`: lets the next kernel on the stream, when it was launched to
/// overlap this one, start its blocks once every block of this kernel has said so (or ended);
/// they then wait in [`wait_for_previous_kernel`] for this kernel's completion. Called once every
/// block of a spinning kernel is resident, so the early blocks can never starve it.
#[inline(always)]
pub fn allow_next_kernel() {
    // SAFETY: no operands; a scheduling hint with no memory effect of its own.
    unsafe { asm!("griddepcontrol.launch_dependents;", options(nostack)) };
}

/// `atom.acq_rel.gpu.global.inc.u32`: returns the old value and stores
/// `old >= limit ? 0 : old + 1`, so with `limit = n - 1` the counter wraps to 0 by itself after
/// `n` calls. Acquire-release at GPU scope: the caller that sees `old == limit` (the last block)
/// also sees every write the other callers made before their increment.
///
/// # Safety
/// `ptr` must be a valid, 4-byte-aligned global address on this device.
#[inline(always)]
pub unsafe fn atomic_inc_acq_rel_gpu(ptr: *mut u32, limit: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("atom.acq_rel.gpu.global.inc.u32 {o}, [{p}], {l};", o = out(reg32) old, p = in(reg64) ptr, l = in(reg32) limit, options(nostack)) };
    old
}

/// `atom.acq_rel.gpu.global.add.u32`: arrive on a device-wide counter, publishing this thread's
/// (and its block's, after a block barrier) earlier writes, and seeing those of earlier arrivals.
///
/// # Safety
/// `ptr` must be a valid, 4-byte-aligned global address on this device.
#[inline(always)]
pub unsafe fn atomic_add_acq_rel_gpu_u32(ptr: *mut u32, value: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("atom.acq_rel.gpu.global.add.u32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) ptr, v = in(reg32) value, options(nostack)) };
    old
}

/// `atom.relaxed.gpu.global.cas.b32`: compare-and-swap, returns the old value. Used to claim a
/// one-time slot (the first timeout report).
///
/// # Safety
/// `ptr` must be a valid, 4-byte-aligned global address.
#[inline(always)]
pub unsafe fn atomic_cas_relaxed_gpu_u32(ptr: *mut u32, compare: u32, value: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees `ptr`.
    unsafe {
        asm!("atom.relaxed.gpu.global.cas.b32 {o}, [{p}], {c}, {v};", o = out(reg32) old, p = in(reg64) ptr, c = in(reg32) compare, v = in(reg32) value, options(nostack))
    };
    old
}

/// `red.relaxed.gpu.global.add.f32`: `*ptr += value` atomically, no return value, no ordering.
/// Accumulates forces when several pulses (or repeated map entries) hit one atom.
///
/// # Safety
/// `ptr` must be a valid, 4-byte-aligned global address on this device.
#[inline(always)]
pub unsafe fn atomic_add_relaxed_gpu_f32(ptr: *mut f32, value: f32) {
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("red.relaxed.gpu.global.add.f32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack)) };
}

/// `red.relaxed.gpu.global.add.f64`: `*ptr += value` atomically, no return value, no ordering
/// (native on sm_60 and newer).
///
/// # Safety
/// `ptr` must be a valid, 8-byte-aligned global address on this device.
#[inline(always)]
pub unsafe fn atomic_add_relaxed_gpu_f64(ptr: *mut f64, value: f64) {
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("red.relaxed.gpu.global.add.f64 [{p}], {v};", p = in(reg64) ptr, v = in(reg64) value, options(nostack)) };
}

/// `red.relaxed.gpu.global.add.u32`: `*ptr += value` atomically, no return value, no ordering.
///
/// # Safety
/// `ptr` must be a valid, 4-byte-aligned global address on this device.
#[inline(always)]
pub unsafe fn atomic_add_relaxed_gpu_u32(ptr: *mut u32, value: u32) {
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("red.relaxed.gpu.global.add.u32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack)) };
}

/// `atom.relaxed.gpu.global.add.u32`: `*ptr += value` atomically, returns the old value, no
/// ordering. Claims places in a shared array (a cursor).
///
/// # Safety
/// `ptr` must be a valid, 4-byte-aligned global address on this device.
#[inline(always)]
pub unsafe fn atomic_fetch_add_relaxed_gpu_u32(ptr: *mut u32, value: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("atom.relaxed.gpu.global.add.u32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) ptr, v = in(reg32) value, options(nostack)) };
    old
}

/// `red.relaxed.gpu.global.min.u32`: `*ptr = min(*ptr, value)` atomically, no return value, no
/// ordering. Keeps the first (lowest) index of something found by many threads.
///
/// # Safety
/// `ptr` must be a valid, 4-byte-aligned global address on this device.
#[inline(always)]
pub unsafe fn atomic_min_relaxed_gpu_u32(ptr: *mut u32, value: u32) {
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("red.relaxed.gpu.global.min.u32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack)) };
}

/// `red.relaxed.gpu.global.max.u32`: `*ptr = max(*ptr, value)` atomically, no return value, no
/// ordering.
///
/// # Safety
/// `ptr` must be a valid, 4-byte-aligned global address on this device.
#[inline(always)]
pub unsafe fn atomic_max_relaxed_gpu_u32(ptr: *mut u32, value: u32) {
    // SAFETY: the caller guarantees `ptr`.
    unsafe { asm!("red.relaxed.gpu.global.max.u32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack)) };
}

/// `st.global.v4.b32`: one 16-byte store of four words, no ordering (a weak store, like any
/// plain store of data; the signal that follows publishes it). Used to push a contiguous range
/// (forces) into a peer's receive slot with the widest store NVLink carries per instruction.
///
/// # Safety
/// `ptr` must be a valid, 16-byte-aligned global address (local or a peer's mapped memory).
#[inline(always)]
pub unsafe fn store_global_v4_b32(ptr: *mut [u32; 4], v: [u32; 4]) {
    // SAFETY: the caller guarantees `ptr`.
    unsafe {
        asm!("st.global.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};", p = in(reg64) ptr, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3], options(nostack))
    };
}

/// `atom.acq_rel.cta.shared::cta.add.u32`: arrive on a counter in this block's shared memory,
/// publishing this thread's earlier writes (and those it observed, e.g. its warp's after a warp
/// barrier) to the block, and seeing those of earlier arrivals. Returns the old value. Lets the
/// warps of one block aggregate their arrival before one GPU-scope arrival for the block.
///
/// # Safety
/// `shared_window_addr` must be the shared-window address ([`shared::to_shared_window`]) of a
/// 4-byte-aligned `u32` in this block's shared memory.
#[inline(always)]
pub unsafe fn atomic_add_acq_rel_cta_shared_u32(shared_window_addr: u64, value: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("atom.acq_rel.cta.shared::cta.add.u32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) shared_window_addr, v = in(reg32) value, options(nostack))
    };
    old
}

/// Dynamic shared memory, aligned to 16 bytes (what `cp.async.bulk` needs).
pub mod shared {
    /// A 16-byte unit of shared memory; its alignment is what the launch-sized region promises.
    #[repr(C, align(16))]
    pub struct Align16(pub [u8; 16]);

    /// Base of this block's dynamic shared memory (size chosen at launch). All threads of the block
    /// get the same pointer.
    ///
    /// # Safety
    /// Only the first `shared_mem_bytes` (the launch parameter) bytes may be accessed, and accesses
    /// from different threads must be ordered by [`super::sync_threads`] or
    /// [`super::warp::sync_warp`] like any shared memory.
    #[inline(always)]
    pub unsafe fn dynamic_shared_mem() -> *mut Align16 {
        core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<Align16>()
    }

    /// The shared-window address (`cvta.to.shared.u64`) of a generic pointer into shared memory,
    /// as `cp.async.bulk` wants its shared operand.
    ///
    /// # Safety
    /// `ptr` must point into this block's shared memory.
    #[inline(always)]
    pub unsafe fn to_shared_window(ptr: *const u8) -> u64 {
        let s: u64;
        // SAFETY: address arithmetic only; the caller guarantees `ptr` is a shared address.
        unsafe { core::arch::asm!("cvta.to.shared.u64 {s}, {p};", s = out(reg64) s, p = in(reg64) ptr, options(pure, nomem, nostack)) };
        s
    }
}

/// Bulk asynchronous copies (Hopper's copy engine, `cp.async.bulk`), shared -> global.
pub mod bulk {
    use core::arch::asm;

    /// `fence.proxy.async.shared::cta`: make this thread's generic-proxy writes to shared memory
    /// visible to the async proxy. Every thread that wrote a bulk copy's source calls it before the
    /// warp barrier that precedes the copy.
    #[inline(always)]
    pub fn fence_proxy_async_shared_cta() {
        // SAFETY: a fence; no operands.
        unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
    }

    /// `cp.async.bulk.global.shared::cta.bulk_group [dst], [src], bytes`: copy `bytes` from this
    /// block's shared memory to global memory (local or a peer's) without using registers.
    ///
    /// # Safety
    /// `dst` and `src_shared` (a shared-window address) 16-byte aligned, `bytes` a nonzero
    /// multiple of 16, both ranges valid; the source must not be written until
    /// [`wait_group_read_all`] returns. One thread issues it.
    #[inline(always)]
    pub unsafe fn copy_shared_to_global(dst: *mut u8, src_shared: u64, bytes: u32) {
        // SAFETY: the caller guarantees the operands.
        unsafe {
            asm!("cp.async.bulk.global.shared::cta.bulk_group [{d}], [{s}], {n};", d = in(reg64) dst, s = in(reg64) src_shared, n = in(reg32) bytes, options(nostack))
        };
    }

    /// `cp.async.bulk.commit_group`: close the bulk copies this thread issued into one group.
    #[inline(always)]
    pub fn commit_group() {
        // SAFETY: no operands.
        unsafe { asm!("cp.async.bulk.commit_group;", options(nostack)) };
    }

    /// `cp.async.bulk.wait_group 0`: wait until every committed group of this thread has completed,
    /// its writes performed, so a following release can publish them.
    #[inline(always)]
    pub fn wait_group_all() {
        // SAFETY: no operands.
        unsafe { asm!("cp.async.bulk.wait_group 0;", options(nostack)) };
    }

    /// `cp.async.bulk.wait_group.read 0`: wait only until the sources have been read, so shared
    /// memory can be reused.
    #[inline(always)]
    pub fn wait_group_read_all() {
        // SAFETY: no operands.
        unsafe { asm!("cp.async.bulk.wait_group.read 0;", options(nostack)) };
    }
}

/// NVSHMEM device functions, resolved when the PTX build links `libnvshmem_device.bc` (3.4.5:
/// every name below is defined there). Callable only from a module registered with
/// `nvshmemx_cumodule_init` on an initialised PE.
pub mod nvshmem {
    unsafe extern "C" {
        /// Every thread of the block calls it with the same arguments: copy `bytes` from local
        /// `src` to `dest` on `pe`, then apply `op(signal)` to `sig_addr` on `pe` after the data.
        /// Non-blocking: returns before completion; the receiver's signal wait provides ordering.
        /// Over a proxy transport the signal is a remote atomic (`NVSHMEM_SIGNAL_SET` included).
        pub fn nvshmemx_putmem_signal_nbi_block(
            dest: *mut core::ffi::c_void,
            src: *const core::ffi::c_void,
            bytes: usize,
            sig_addr: *mut u64,
            signal: u64,
            sig_op: i32,
            pe: i32,
        );
        /// Every thread of the block calls it with the same arguments: copy `bytes` from local
        /// `src` to `dest` on `pe`, non-blocking, no signal. A remote transport carries it as an
        /// RMA write (no atomic).
        pub fn nvshmemx_putmem_nbi_block(dest: *mut core::ffi::c_void, src: *const core::ffi::c_void, bytes: usize, pe: i32);
        /// Orders delivery: puts this PE issued to one target PE before the fence are delivered
        /// there before any it issues after. Lowers to `membar.sys` (plus a proxy fence request when
        /// a proxy transport is in use), so it also orders this thread's own stores system-wide.
        pub fn nvshmem_fence();
        /// One 8-byte put of `value` to `dest` on `pe`: a plain store where `pe` is mapped, an RMA
        /// write carried inline by the proxy otherwise (no remote atomic). One thread calls it.
        pub fn nvshmem_uint64_p(dest: *mut u64, value: u64, pe: i32);
    }
}
