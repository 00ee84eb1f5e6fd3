//! The merge of a rank's arrivals into its stayers on the GPU: the second phase of a
//! redecomposition ([`super::redecompose_with`]'s `Working::new`, which builds a rank's new home
//! atoms in global-id order) for stayers held on the device, by the `migrate_merge` kernel
//! (`kernels-gpu/src/kernels/migrate_merge.rs`). The stayers are those [`super::GpuMigrate`] leaves
//! on the device (ids ascending when its input came from the last plan, wrapped positions,
//! velocities); the arrivals are the other ranks' leavers that this rank now owns, a few hundred,
//! uploaded from the host. Each atom's place in the merged order is its index in its own array plus
//! the number of the other array's ids below its own (a binary search), so the result is the
//! host's, bit for bit.
//!
//! The merge relies on the stayers' ids ascending strictly and on no id being held twice; the
//! kernel checks both on the way and one small read-back tells the host
//! ([`PlanError::GpuMergeOrder`]: the caller then redecomposes on the host, [`super::redecompose`],
//! which takes any order). An input that did not come from the last plan (rare) fails so.
//!
//! This is the second block of the GPU redecomposition (docs/nbnxm.md, "Search step cost"), which
//! [`super::GpuHome`] runs for the MD step. `tests/gpu_merge.rs` checks it against
//! [`merge_reference`] (tied to the host's `Working::new` by the unit tests) and, chained after
//! [`super::GpuMigrate`] on every rank of a grid, against [`super::redecompose`]'s home atoms.
//!
//! | item | what it is |
//! |---|---|
//! | [`GpuMerge`] | the device buffers of one rank's merge; [`GpuMerge::enqueue`] and [`GpuMerge::check`], or [`GpuMerge::run`] |
//! | [`MergeArrays`] | the stayers on the device and where the merged home atoms go |
//! | [`merge_reference`] | the same merge on the CPU, with the same order checks |

use super::PlanError;
use super::gpu_checks::{check_disjoint, check_lengths};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape, Staging, grown_capacity};
use cudarc::driver::{CudaContext, CudaEvent, PinnedHostSlice, result, sys};
use kernels_gpu::abi::{self, Float3, MigrateLeaver};
use std::sync::Arc;

/// One rank's new home atoms in id order, as [`merge_reference`] merges them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MergeReference {
    /// Ids, ascending.
    pub ids: Vec<u32>,
    /// Wrapped positions.
    pub positions: Vec<Float3>,
    /// Velocities.
    pub velocities: Vec<Float3>,
}

/// The number of `ids[..n]` below `key`, by the kernel's own halving ([`abi::ids_below`], the same
/// steps, so the same answer for ids in any order, which the order checks read).
pub(super) fn below(n: usize, key: u32, ids: impl Fn(usize) -> u32) -> usize {
    // The merge refuses more than `u32::MAX` atoms before it runs.
    abi::ids_below(u32::try_from(n).unwrap_or(u32::MAX), key, |k| ids(k as usize)) as usize
}

/// `arrivals` sorted by id (stably), unless they are in strict id order already (`None`).
fn sorted(arrivals: &[MigrateLeaver]) -> Option<Vec<MigrateLeaver>> {
    if arrivals.windows(2).all(|w| w[0].id < w[1].id) {
        return None;
    }
    let mut s = arrivals.to_vec();
    s.sort_by_key(|a| a.id);
    Some(s)
}

/// The order checks of the merge of `arrivals` (sorted by id) into stayers of ids `stay_ids`, as
/// the kernel makes them: `(stayers unordered, arrivals unordered, an arrival's id a stayer's)`.
pub(super) fn order_flags(stay_ids: &[u32], arrivals: &[MigrateLeaver]) -> (bool, bool, bool) {
    let stayers = stay_ids.windows(2).any(|w| w[1] <= w[0]);
    let arrivals_unordered = arrivals.windows(2).any(|w| w[1].id <= w[0].id);
    let repeated = arrivals.iter().any(|a| {
        let k = below(stay_ids.len(), a.id, |k| stay_ids[k]);
        stay_ids.get(k) == Some(&a.id)
    });
    (stayers, arrivals_unordered, repeated)
}

/// The merge on the CPU: the stayers (ids ascending, wrapped positions, velocities) and the
/// `arrivals` (any order; sorted by id here, their `owner` unread) as one array in id order, what
/// [`GpuMerge::run`] must give bit for bit and what the host's redecomposition builds for `rank`.
/// Errors: stayer arrays of different lengths ([`PlanError::HomeArrays`]), and the order problems
/// [`GpuMerge::check`] reports, the same ([`PlanError::GpuMergeOrder`]).
pub fn merge_reference(
    stay_ids: &[u32],
    stay_x: &[Float3],
    stay_v: &[Float3],
    arrivals: &[MigrateLeaver],
    rank: usize,
) -> std::result::Result<MergeReference, PlanError> {
    let ns = stay_ids.len();
    if stay_x.len() != ns || stay_v.len() != ns {
        return Err(PlanError::HomeArrays { rank, ids: ns, positions: stay_x.len(), velocities: stay_v.len() });
    }
    let sorted = sorted(arrivals);
    let arrivals = sorted.as_deref().unwrap_or(arrivals);
    let (stayers_unordered, arrivals_unordered, repeated) = order_flags(stay_ids, arrivals);
    if stayers_unordered || arrivals_unordered || repeated {
        return Err(PlanError::GpuMergeOrder { rank, stayers: ns, arrivals: arrivals.len(), stayers_unordered, arrivals_unordered, repeated });
    }
    // An ordinary two-way merge (not the kernel's rule, which the unit tests replay apart).
    let n = ns + arrivals.len();
    let mut out = MergeReference { ids: Vec::with_capacity(n), positions: Vec::with_capacity(n), velocities: Vec::with_capacity(n) };
    let (mut i, mut j) = (0, 0);
    while i < ns || j < arrivals.len() {
        if j == arrivals.len() || (i < ns && stay_ids[i] < arrivals[j].id) {
            out.ids.push(stay_ids[i]);
            out.positions.push(stay_x[i]);
            out.velocities.push(stay_v[i]);
            i += 1;
        } else {
            let a = &arrivals[j];
            out.ids.push(a.id);
            out.positions.push(a.x);
            out.velocities.push(a.v);
            j += 1;
        }
    }
    Ok(out)
}

/// The pass's name in errors.
const PASS: &str = "GPU merge";

/// The device arrays of one merge: the stayers (`ids` ascending, `x` wrapped, `v`: what
/// [`super::GpuMigrate`] writes to its outputs) and where the merged home atoms go (`ids_out`,
/// `x_out`, `v_out`). The stayers' arrays hold at least the call's stayers, the outputs the
/// stayers and arrivals together; no output may overlap an input or another output (checked).
pub struct MergeArrays<'a> {
    /// The stayers' ids (ascending).
    pub ids: &'a dyn DeviceMemory<u32>,
    /// The stayers' wrapped positions.
    pub x: &'a dyn DeviceMemory<Float3>,
    /// The stayers' velocities.
    pub v: &'a dyn DeviceMemory<Float3>,
    /// The merged ids.
    pub ids_out: &'a dyn DeviceMemory<u32>,
    /// The merged wrapped positions.
    pub x_out: &'a dyn DeviceMemory<Float3>,
    /// The merged velocities.
    pub v_out: &'a dyn DeviceMemory<Float3>,
}

impl MergeArrays<'_> {
    /// An error unless the stayers' arrays hold `stayers` atoms and the outputs `total`, apart.
    fn check(&self, stayers: usize, total: usize) -> Result<()> {
        check_lengths(PASS, stayers, &[("ids", self.ids.len()), ("x", self.x.len()), ("v", self.v.len())])?;
        check_lengths(PASS, total, &[("ids_out", self.ids_out.len()), ("x_out", self.x_out.len()), ("v_out", self.v_out.len())])?;
        let f3 = |b: &dyn DeviceMemory<Float3>, n: usize| (b.device_ptr(), (n * size_of::<Float3>()) as u64);
        let inputs = [("ids", (self.ids.device_ptr(), (stayers * 4) as u64)), ("x", f3(self.x, stayers)), ("v", f3(self.v, stayers))];
        let outputs =
            [("ids_out", (self.ids_out.device_ptr(), (total * 4) as u64)), ("x_out", f3(self.x_out, total)), ("v_out", f3(self.v_out, total))];
        check_disjoint(PASS, "the merged home atoms", &inputs, &outputs)
    }
}

/// A merge enqueued and not yet checked.
#[derive(Clone, Copy, Debug)]
struct Pending {
    stayers: usize,
    arrivals: usize,
}

/// One rank's merge on the GPU: the arrivals' device buffer and their page-locked staging, the
/// order flags on the device and their page-locked copy, kept and grown between calls.
pub struct GpuMerge {
    rank: usize,
    arrivals: DeviceBuffer<MigrateLeaver>,
    staging: Staging<MigrateLeaver>,
    info: DeviceBuffer<u32>,
    /// The flags as the last merge left them (copied back in its stream's order).
    info_host: PinnedHostSlice<u32>,
    /// Recorded after that copy.
    copied: CudaEvent,
    pending: Option<Pending>,
}

impl GpuMerge {
    /// The merge of `rank`'s arrivals on `ctx`'s GPU (`rank` names it in errors).
    pub fn new(ctx: &Arc<CudaContext>, rank: usize) -> Result<Self> {
        // SAFETY: the contents are written by the copy back before they are read (`check` reads
        // them only after `copied`, recorded after that copy, has passed).
        let info_host =
            unsafe { ctx.alloc_pinned_with_flags::<u32>(abi::MIGRATE_MERGE_INFO_WORDS, 0) }.during("allocating the merge's page-locked flags")?;
        Ok(Self {
            rank,
            arrivals: DeviceBuffer::uninit(ctx, 0)?,
            staging: Staging::new(),
            info: DeviceBuffer::uninit(ctx, abi::MIGRATE_MERGE_INFO_WORDS)?,
            info_host,
            copied: ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)).during("creating the merge's event")?,
            pending: None,
        })
    }

    /// Merges on `stream`, waits for the flags and checks them ([`Self::enqueue`], then
    /// [`Self::check`]): the home atoms in id order at `a.ids_out[..n]` (and `x_out`, `v_out`),
    /// where `n`, returned, is `stayers + arrivals.len()`.
    pub fn run(
        &mut self,
        module: &KernelModule,
        stream: &CudaStream,
        a: &MergeArrays<'_>,
        stayers: usize,
        arrivals: &[MigrateLeaver],
    ) -> Result<usize> {
        self.enqueue(module, stream, a, stayers, arrivals)?;
        self.check()
    }

    /// Enqueues on `stream` the merge of the `stayers` stayers of `a` and `arrivals` into
    /// `a.ids_out[..n]` (and `x_out`, `v_out`) in id order, and the copy back of its order flags;
    /// returns `n = stayers + arrivals.len()` without waiting. The arrivals are the atoms other
    /// ranks' migrations sent to this rank: any order (sorted by id on the host first when their
    /// ids do not ascend), `owner` unread; they are staged in page-locked memory, so `arrivals` may
    /// change once this returns. Work enqueued on `stream` later may read the outputs, but they are
    /// this rank's home atoms only once [`Self::check`] says so.
    ///
    /// The caller's arrays must stay allocated, and the stayers unwritten, until `stream` has run
    /// the merge. `stream` must be of the context this merge was made on. Enqueuing again waits
    /// for the previous merge's flags (a merge not checked is dropped). Errors, before anything is
    /// enqueued: arrays too short or overlapping, more than `u32::MAX` atoms; then a CUDA failure.
    pub fn enqueue(
        &mut self,
        module: &KernelModule,
        stream: &CudaStream,
        a: &MergeArrays<'_>,
        stayers: usize,
        arrivals: &[MigrateLeaver],
    ) -> Result<usize> {
        let total = stayers.saturating_add(arrivals.len());
        a.check(stayers, total)?;
        let n32 = u32::try_from(total).map_err(|_| HaloError::Plan(PlanError::TooManyAtoms { atoms: total }))?;
        let ctx = stream.context();
        if ctx.cu_ctx() != self.info.context().cu_ctx() {
            return Err(HaloError::InvalidInput(format!(
                "the GPU merge of rank {} was made on GPU {} and enqueued on a stream of GPU {}",
                self.rank,
                self.info.context().ordinal(),
                ctx.ordinal()
            )));
        }
        ctx.bind_to_thread().during("binding the context")?;
        // The previous merge may still read the arrivals' buffer and write the flags (at once
        // when it was checked).
        self.pending = None;
        self.copied.synchronize().during("waiting for the previous GPU merge")?;
        let sorted = sorted(arrivals);
        let arrivals = sorted.as_deref().unwrap_or(arrivals);
        if let Some(cap) = grown_capacity(self.arrivals.len(), arrivals.len()) {
            self.arrivals = DeviceBuffer::uninit(ctx, cap)?;
        }
        self.info.fill_bytes_async(0, stream)?;
        self.staging.upload(arrivals, &self.arrivals, stream)?;
        let shape = LaunchShape { grid: (abi::migrate_merge_blocks(n32), 1), block: abi::MIGRATE_MERGE_THREADS, shared_bytes: 0 };
        let (mut ids, mut x, mut v, mut ns) = (a.ids.device_ptr(), a.x.device_ptr(), a.v.device_ptr(), stayers as u32);
        let (mut arr, mut na, mut info) = (self.arrivals.device_ptr(), arrivals.len() as u32, self.info.device_ptr());
        let (mut io, mut xo, mut vo) = (a.ids_out.device_ptr(), a.x_out.device_ptr(), a.v_out.device_ptr());
        // SAFETY: the arguments match the kernel's parameters (abi::MIGRATE_MERGE); the stayers'
        // arrays hold `stayers` atoms, the outputs `total` (checked, apart), the arrivals' buffer
        // `arrivals.len()`, the info its words; ours outlive the launch (`self`, and the wait above
        // before a later call replaces them), the caller's by this method's contract.
        unsafe { module.launch(abi::MIGRATE_MERGE, shape, stream, &mut crate::kernel_args![ids, x, v, ns, arr, na, io, xo, vo, info])? };
        let host = self.info_host.as_mut_slice().during("reaching the merge's flags")?;
        // SAFETY: `host` is page-locked memory of the info's size, owned by `self`, read only after
        // `copied` (recorded next) has passed; the device range is the whole info buffer.
        unsafe { result::memcpy_dtoh_async(host, self.info.device_ptr(), stream.cu_stream()) }.during("copying the merge's flags back")?;
        self.copied.record(stream).during("recording the merge's event")?;
        self.pending = Some(Pending { stayers, arrivals: arrivals.len() });
        Ok(total)
    }

    /// Waits for the flags of the merge [`Self::enqueue`] enqueued (only for the merge and its
    /// copy back, not for later work on its stream) and returns its atom count, or
    /// [`PlanError::GpuMergeOrder`] when the stayers' ids do not ascend strictly or an id is held
    /// twice: the outputs are then unspecified (nothing was written outside them), and the caller
    /// redecomposes on the host instead. An error too when nothing is enqueued.
    pub fn check(&mut self) -> Result<usize> {
        let Some(p) = self.pending.take() else {
            return Err(HaloError::InvalidInput(format!("the GPU merge of rank {} has no merge enqueued to check", self.rank)));
        };
        self.copied.synchronize().during("waiting for the GPU merge")?;
        let info = self.info_host.as_slice().during("reading the merge's flags")?;
        let flag = |w: usize| info[w] != 0;
        let (stayers_unordered, arrivals_unordered, repeated) =
            (flag(abi::MIGRATE_MERGE_INFO_STAYERS), flag(abi::MIGRATE_MERGE_INFO_ARRIVALS), flag(abi::MIGRATE_MERGE_INFO_REPEATED));
        if stayers_unordered || arrivals_unordered || repeated {
            let (rank, stayers, arrivals) = (self.rank, p.stayers, p.arrivals);
            return Err(PlanError::GpuMergeOrder { rank, stayers, arrivals, stayers_unordered, arrivals_unordered, repeated }.into());
        }
        Ok(p.stayers + p.arrivals)
    }
}

impl Drop for GpuMerge {
    /// Frees the arrivals' buffer and the flags only after the last merge and its copy back ran (a
    /// failed wait cannot be reported here; the context is then broken anyway).
    fn drop(&mut self) {
        let _ = self.copied.synchronize();
    }
}
