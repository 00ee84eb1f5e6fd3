//! GPU contexts with work that does not end: a host wait that found a stream stuck marks the work
//! enqueued on it so far ([`mark`]); until that work ends (an event recorded after it completes),
//! device memory and modules dropped on its context are leaked instead of freed, because freeing
//! waits for the device and would block for as long as the work runs, maybe forever.

use crate::gpu::{CudaContext, CudaStream};
use cudarc::driver::sys;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether any context was marked stuck (the fast path of [`context_stuck`]: one load).
static ANY_STUCK: AtomicBool = AtomicBool::new(false);
/// The work found stuck: its context and an event recorded after it on its stream.
static STUCK: Mutex<Vec<StuckWork>> = Mutex::new(Vec::new());

struct StuckWork {
    /// The context (`CUcontext` address).
    ctx: usize,
    /// Completes when the work enqueued before it ends; null if it could not be recorded (then the
    /// context stays stuck).
    done: sys::CUevent,
}

// SAFETY: an event handle may be queried and destroyed from any thread.
unsafe impl Send for StuckWork {}

/// Marks the work enqueued on `stream` so far as stuck: its context counts as stuck
/// ([`context_stuck`]) until that work ends, if ever.
pub fn mark(stream: &CudaStream) {
    let mut done: sys::CUevent = std::ptr::null_mut();
    // SAFETY: creates an event and records it on a live stream (the caller bound its context);
    // neither call waits for the stream.
    let recorded = unsafe {
        sys::cuEventCreate(&mut done, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32).result().is_ok()
            && sys::cuEventRecord(done, stream.cu_stream()).result().is_ok()
    };
    if !recorded && !done.is_null() {
        // SAFETY: created above, used by nobody else.
        let _ = unsafe { sys::cuEventDestroy_v2(done) };
        done = std::ptr::null_mut();
    }
    let mut stuck = STUCK.lock().unwrap_or_else(|p| p.into_inner());
    stuck.push(StuckWork { ctx: stream.context().cu_ctx() as usize, done });
    ANY_STUCK.store(true, Ordering::Release);
}

/// Whether work found stuck on `ctx` ([`mark`]) is still running: freeing device
/// memory or unloading a module there (which waits for the device) would then block for as long
/// as it runs, maybe forever, so their `Drop`s leak them instead. One atomic load while nothing was
/// ever stuck; otherwise one event query per stuck stream.
pub fn context_stuck(ctx: &CudaContext) -> bool {
    if !ANY_STUCK.load(Ordering::Acquire) {
        return false;
    }
    let mut stuck = STUCK.lock().unwrap_or_else(|p| p.into_inner());
    stuck.retain(|w| {
        // SAFETY: a query of an event this registry owns; it does not wait.
        let ended = !w.done.is_null() && unsafe { sys::cuEventQuery(w.done) } == sys::CUresult::CUDA_SUCCESS;
        if ended {
            // SAFETY: owned here, and dropped from the registry now.
            let _ = unsafe { sys::cuEventDestroy_v2(w.done) };
        }
        !ended
    });
    if stuck.is_empty() {
        ANY_STUCK.store(false, Ordering::Release);
    }
    let key = ctx.cu_ctx() as usize;
    stuck.iter().any(|w| w.ctx == key)
}
