//! Page-locked staging for host-to-device uploads that are enqueued on a stream, not waited for.
//!
//! A synchronous copy from ordinary (pageable) memory blocks the host for the whole transfer and
//! still may return before its DMA lands. A search step uploads several arrays per rank (home
//! coordinates, velocities, masses, types, the exchange's index maps and metadata): through a
//! [`Staging`] each is one host `memcpy` into page-locked memory that is kept between searches and
//! one asynchronous copy in the stream's order, so the host waits at most once, where ordering is
//! actually needed (the caller's synchronisation or event).
//!
//! The memory is cudarc's [`PinnedHostSlice`] (the mechanism of the MD's page-locked home
//! read-back, `halo_md::gather`), allocated portable. An event of the staging's own marks the last
//! copy out of it: [`Staging::upload`] records it after each copy ([`Staging::upload_parts`] after
//! the last copy of its batch), and the next upload (or the drop, or a growth) waits for it before
//! the host writes or frees the memory again, so a staged upload never reads data of a later one. (Not the slice's built-in event: cudarc records that
//! only in contexts that track events, and halo's contexts do not, `gpu::open`; waiting on it
//! would wait for nothing.)

use crate::error::{CudaContextExt, HaloError, Result};
use bytemuck::Pod;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, PinnedHostSlice, result, sys};
use std::marker::PhantomData;
use std::sync::Arc;

use super::DeviceMemory;

/// The byte capacity a staging buffer of `capacity` bytes needs for an upload of `need` bytes:
/// `None` when it holds them already, otherwise `need` with a quarter of headroom (as the device
/// buffers a search refits grow), so that the slowly changing home counts of later searches fit.
pub fn grown_capacity(capacity: usize, need: usize) -> Option<usize> {
    (need > capacity).then(|| need.saturating_add(need / 4))
}

/// Page-locked host memory, kept and reused, through which uploads of `T`s are enqueued on a
/// stream ([`Self::upload`]). Empty until the first upload; grown (never shrunk) when an upload
/// needs more. One staging serves one stream's uploads of one array at a time, or one batch of
/// several ([`Self::upload_parts`]): the next upload waits until the previous copies out of it
/// have landed (usually long done), so use one per array, or per batch, uploaded in the same step.
pub struct Staging<T: Pod> {
    host: Option<Held>,
    _marker: PhantomData<T>,
}

/// The page-locked memory and the event recorded after the last copy out of it.
struct Held {
    /// Freed by hand in the drop (never while the context is stuck).
    mem: std::mem::ManuallyDrop<PinnedHostSlice<u8>>,
    copied: CudaEvent,
}

impl Held {
    /// Waits until the last copy out of the memory has run (at once when none was enqueued).
    fn wait(&self) -> Result<()> {
        self.copied.synchronize().during("waiting for the last upload out of the staging memory")
    }
}

impl Drop for Held {
    /// Frees the memory only after the last copy out of it ran (a failed wait cannot be reported
    /// here; the context is then broken anyway). While the context is stuck
    /// ([`crate::gpu::stuck`]) it is leaked instead: the wait and the free (`cuMemFreeHost`
    /// waits for the whole device) would wait for a kernel that never ends.
    fn drop(&mut self) {
        if crate::gpu::stuck::context_stuck(self.mem.context()) {
            return;
        }
        let _ = self.copied.synchronize();
        // SAFETY: dropped once, here; the field is not used after.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.mem) };
    }
}

impl<T: Pod> Default for Staging<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Pod> std::fmt::Debug for Staging<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging").field("capacity", &self.capacity()).finish()
    }
}

impl<T: Pod> Staging<T> {
    /// An empty staging (allocates nothing until the first upload).
    pub fn new() -> Self {
        Self { host: None, _marker: PhantomData }
    }

    /// Elements it holds without growing.
    pub fn capacity(&self) -> usize {
        self.host.as_ref().map_or(0, |h| h.mem.len() / size_of::<T>().max(1))
    }

    /// Enqueues on `stream` the copy of `data` into elements `0..data.len()` of `dst`, through this
    /// page-locked memory, and returns without waiting for it: [`Self::upload_at`] at element 0.
    pub fn upload(&mut self, data: &[T], dst: &(impl DeviceMemory<T> + ?Sized), stream: &CudaStream) -> Result<()> {
        self.upload_at(data, dst, 0, stream)
    }

    /// Enqueues on `stream` the copy of `data` into elements `at..at + data.len()` of `dst`, through
    /// this page-locked memory, and returns without waiting for it. The host waits only for the
    /// previous copy out of this staging (before overwriting it) and when the memory must grow.
    /// Elements of `dst` outside that range are not written.
    ///
    /// Ordering is the caller's: the copy runs in `stream`'s order, so work later on `stream` sees
    /// the data, and work on any other stream (or the legacy default stream) must be ordered after
    /// it by an event recorded on `stream` or a synchronisation. `dst` must stay allocated until the
    /// copy has run (free it only after `stream` is idle). `stream` must belong to `dst`'s context.
    /// Errors (nothing enqueued): a range past `dst`'s end, or a stream of another context.
    pub fn upload_at(&mut self, data: &[T], dst: &(impl DeviceMemory<T> + ?Sized), at: usize, stream: &CudaStream) -> Result<()> {
        self.upload_parts(&[StagedPart::new(data, dst, at)?], stream)
    }

    /// Enqueues on `stream` every upload of `parts`, through this page-locked memory, and returns
    /// without waiting for them: [`Self::upload_at`] of each part, with one wait for the last copy
    /// out of this memory before any is written and one event recorded after the last (two driver
    /// calls for the batch where separate stagings make two per upload). Each part starts at a
    /// 16-byte boundary of the memory. Ordering and lifetimes as [`Self::upload_at`]: every part's
    /// buffer must stay allocated until `stream` has run the copies and belong to `stream`'s
    /// context (checked first, unless there is nothing to copy: nothing is enqueued then). A
    /// failure to enqueue one part leaves the earlier ones enqueued, and the event is recorded
    /// after them all the same.
    pub fn upload_parts(&mut self, parts: &[StagedPart<'_>], stream: &CudaStream) -> Result<()> {
        let (offsets, total) = part_offsets(parts.iter().map(|p| p.bytes.len()));
        if total == 0 {
            return Ok(());
        }
        let ctx = stream.context();
        if let Some(p) = parts.iter().find(|p| p.cu_ctx != ctx.cu_ctx()) {
            return Err(HaloError::InvalidInput(format!("staged upload into GPU {}'s memory on a stream of GPU {}", p.ordinal, ctx.ordinal())));
        }
        ctx.bind_to_thread().during("binding the context")?;
        let held = self.reserve(ctx, total)?;
        held.wait()?;
        let room = held.mem.as_mut_slice().during("reaching the staging memory")?;
        let mut enqueued = Ok(());
        for (p, &at) in parts.iter().zip(&offsets) {
            let src = &mut room[at..at + p.bytes.len()];
            src.copy_from_slice(p.bytes);
            if src.is_empty() {
                continue;
            }
            // SAFETY: `p.dst` holds `p.bytes.len()` bytes (checked by `StagedPart::new`) and, by
            // this method's contract, stays allocated until `stream` has run the copy. The source
            // is this staging's page-locked memory, which outlives the copy: every later write, a
            // growth and the drop wait for the event recorded below, after every enqueued copy.
            enqueued = unsafe { result::memcpy_htod_async(p.dst, &*src, stream.cu_stream()) }.during("enqueuing a staged upload to the GPU");
            if enqueued.is_err() {
                break;
            }
        }
        let recorded = held.copied.record(stream).during("recording the staged upload's event");
        enqueued.and(recorded)
    }

    /// The page-locked memory, holding at least `bytes` and of `ctx` (its event is recorded on
    /// `ctx`'s streams): reallocated when too small or of another context, after the copies out of
    /// the old memory have landed.
    fn reserve(&mut self, ctx: &Arc<CudaContext>, bytes: usize) -> Result<&mut Held> {
        let have = self.host.as_ref().filter(|h| h.mem.context().cu_ctx() == ctx.cu_ctx()).map_or(0, |h| h.mem.len());
        if let Some(len) = grown_capacity(have, bytes) {
            if let Some(old) = self.host.take() {
                // Its drop would wait too, but could not report a failure.
                old.wait()?;
            }
            // SAFETY: the contents are written (by `upload`) before any copy reads them.
            let mem = unsafe { ctx.alloc_pinned_with_flags::<u8>(len, sys::CU_MEMHOSTALLOC_PORTABLE) }
                .during_with(|| format!("allocating {len} bytes of page-locked staging memory"))?;
            let copied = ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)).during("creating the staging's event")?;
            self.host = Some(Held { mem: std::mem::ManuallyDrop::new(mem), copied });
        }
        self.host.as_mut().ok_or_else(|| HaloError::InvalidInput("no staging memory after reserving it".into()))
    }
}

/// One upload of a batch ([`Staging::upload_parts`]): host data and the device range it goes to.
pub struct StagedPart<'a> {
    bytes: &'a [u8],
    dst: sys::CUdeviceptr,
    cu_ctx: sys::CUcontext,
    ordinal: usize,
}

impl<'a> StagedPart<'a> {
    /// `data` into elements `at..at + data.len()` of `dst`: an error when the range runs past
    /// `dst`'s end. `dst` must stay allocated until the batch's copies have run.
    pub fn new<T: Pod>(data: &'a [T], dst: &(impl DeviceMemory<T> + ?Sized), at: usize) -> Result<Self> {
        if at.checked_add(data.len()).is_none_or(|end| end > dst.len()) {
            return Err(HaloError::InvalidInput(format!("staged upload of {} elements at element {at} of a buffer of {}", data.len(), dst.len())));
        }
        let ctx = dst.context();
        Ok(Self { bytes: bytemuck::cast_slice(data), dst: dst.device_ptr_at(at), cu_ctx: ctx.cu_ctx(), ordinal: ctx.ordinal() })
    }
}

/// Where each of parts of `lens` bytes starts in one staging memory (each at a 16-byte boundary,
/// in order), and the bytes they span.
fn part_offsets(lens: impl Iterator<Item = usize>) -> (Vec<usize>, usize) {
    let mut end = 0usize;
    let offsets = lens
        .map(|len| {
            let at = end.next_multiple_of(16);
            end = at + len;
            at
        })
        .collect();
    (offsets, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_grows_with_a_quarter_of_headroom_only_when_an_upload_needs_more() {
        assert_eq!(grown_capacity(0, 0), None, "nothing to stage allocates nothing");
        assert_eq!(grown_capacity(0, 1), Some(1));
        assert_eq!(grown_capacity(0, 270_000), Some(337_500));
        assert_eq!(grown_capacity(337_500, 270_000), None, "a later, smaller search reuses the memory");
        assert_eq!(grown_capacity(337_500, 337_500), None);
        assert_eq!(grown_capacity(337_500, 337_501), Some(421_876));
        assert_eq!(grown_capacity(10, usize::MAX), Some(usize::MAX), "saturates instead of overflowing");
        // A home count that drifts by a few percent between searches allocates once.
        let mut cap = 0;
        let mut allocations = 0;
        for need in [270_000usize, 275_000, 262_000, 280_000, 300_000, 290_000, 310_000] {
            if let Some(c) = grown_capacity(cap, need) {
                cap = c;
                allocations += 1;
            }
            assert!(cap >= need);
        }
        assert_eq!(allocations, 1);
    }

    #[test]
    fn parts_start_at_16_byte_boundaries_in_order_and_never_overlap() {
        assert_eq!(part_offsets([].into_iter()), (vec![], 0));
        assert_eq!(part_offsets([12, 1, 0, 16, 3].into_iter()), (vec![0, 16, 32, 32, 48], 51));
        assert_eq!(part_offsets([0, 0].into_iter()), (vec![0, 0], 0), "nothing to stage spans nothing");
        for lens in [vec![7usize, 9, 1000, 13], vec![16, 16, 16], vec![1; 9]] {
            let (at, end) = part_offsets(lens.iter().copied());
            for (k, (&a, &l)) in at.iter().zip(&lens).enumerate() {
                assert_eq!(a % 16, 0);
                assert!(a + l <= end);
                if let Some(&next) = at.get(k + 1) {
                    assert!(a + l <= next, "{lens:?}: part {k} overlaps the next");
                }
            }
        }
    }

    #[test]
    fn an_empty_staging_holds_nothing_and_allocates_nothing() {
        let s = Staging::<[f32; 3]>::new();
        assert_eq!(s.capacity(), 0);
        assert_eq!(format!("{s:?}"), "Staging { capacity: 0 }");
        assert_eq!(Staging::<u32>::default().capacity(), 0);
    }
}
