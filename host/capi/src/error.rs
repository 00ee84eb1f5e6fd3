//! The last error of this thread, and the boundary every call goes through: a failure becomes a
//! status code plus a message kept for `halo_last_error`, and a panic never crosses into C.

use crate::status::{halo_status, status_of};
use halo::HaloError;
use std::cell::RefCell;
use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};

thread_local! {
    /// The message of this thread's last failed call (empty before the first failure).
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// A failed call: its code and message.
#[derive(Debug)]
pub(crate) struct Failure {
    pub status: halo_status,
    pub message: String,
}

impl Failure {
    /// An invalid argument, with what is wrong and the fix.
    pub fn invalid(message: impl Into<String>) -> Self {
        Failure { status: halo_status::HALO_INVALID_ARGUMENT, message: message.into() }
    }
}

impl From<HaloError> for Failure {
    fn from(e: HaloError) -> Self {
        Failure { status: status_of(&e), message: e.to_string() }
    }
}

/// Runs one C call's body: `Ok` is `HALO_OK`; an error or a panic is stored as this thread's last
/// error (prefixed with the call's name) and returned as its code (a panic as `HALO_INTERNAL`).
pub(crate) fn guard(call: &str, body: impl FnOnce() -> Result<(), Failure>) -> halo_status {
    let _current = KeepCurrentContext::save();
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return halo_status::HALO_OK,
        Ok(Err(f)) => f,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Failure { status: halo_status::HALO_INTERNAL, message: format!("internal error (a bug in halo, please report it): {what}") }
        }
    };
    set_last_error(format!("{call}: {}", failure.message));
    failure.status
}

/// The CUDA context current on the calling thread when a C call starts, made current again when
/// it ends: halo binds its GPU's context to work, and a C or C++ caller's thread must keep the
/// device it had (its next `cudaMalloc` or launch goes there).
struct KeepCurrentContext(Option<cudarc::driver::sys::CUcontext>);

impl KeepCurrentContext {
    fn save() -> Self {
        use cudarc::driver::sys;
        // Asked once per process: every C call, the per-step ones included, passes here.
        if !halo::gpu::driver_library_present() {
            return Self(None);
        }
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes the calling thread's current context (or null) into a local; before
        // cuInit it fails, and nothing is restored.
        let rc = unsafe { sys::cuCtxGetCurrent(&mut current) };
        Self((rc == sys::CUresult::CUDA_SUCCESS).then_some(current))
    }
}

impl Drop for KeepCurrentContext {
    fn drop(&mut self) {
        if let Some(context) = self.0 {
            // SAFETY: the context that was current when the call started (or null: none), which
            // the call did not destroy (halo only retains primary contexts).
            let _ = unsafe { cudarc::driver::sys::cuCtxSetCurrent(context) };
        }
    }
}

/// The body of every `*_destroy` call: frees the handle `ptr` (null allowed) under [`guard`].
///
/// # Safety
/// `ptr` is null or was made by `Box::into_raw` of a `T` and not freed before.
pub(crate) unsafe fn destroy<T>(call: &str, ptr: *mut T) -> halo_status {
    guard(call, || {
        if !ptr.is_null() {
            // SAFETY: the caller's contract.
            drop(unsafe { Box::from_raw(ptr) });
        }
        Ok(())
    })
}

/// Stores `message` as this thread's last error.
pub(crate) fn set_last_error(message: String) {
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
}

/// This thread's last error message (empty when no call on this thread has failed).
pub(crate) fn last_error() -> String {
    LAST_ERROR.with(|e| e.borrow().clone())
}

/// Copies the message of the last failed call on this thread into `buf` (at most `len` bytes,
/// always NUL-terminated; a longer message is cut at a character boundary). The message names the
/// call, what went wrong and how to fix it; it is empty when no call on this thread has failed. A
/// successful call does not clear it. Returns `HALO_INVALID_ARGUMENT` (leaving the message as it
/// is) when `buf` is null or `len` is 0, else `HALO_OK`. `halo_last_error_length() + 1` bytes hold
/// the whole message.
///
/// # Safety
/// `buf` must be null or point to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_last_error(buf: *mut c_char, len: usize) -> halo_status {
    if buf.is_null() || len == 0 {
        return halo_status::HALO_INVALID_ARGUMENT;
    }
    let message = last_error();
    let mut n = message.len().min(len - 1);
    while !message.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: the caller gives `len` writable bytes at `buf`; `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(message.as_ptr().cast::<c_char>(), buf, n);
        *buf.add(n) = 0;
    }
    halo_status::HALO_OK
}

/// The length in bytes of the last failed call's message on this thread, without the terminating
/// NUL (0 when no call on this thread has failed). Never fails.
#[unsafe(no_mangle)]
pub extern "C" fn halo_last_error_length() -> usize {
    LAST_ERROR.with(|e| e.borrow().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(len: usize) -> (halo_status, String) {
        let mut buf = vec![0x55 as c_char; len.max(1)];
        // SAFETY: `buf` has `len` (or 1) writable bytes.
        let status = unsafe { halo_last_error(buf.as_mut_ptr(), len) };
        let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        (status, String::from_utf8(bytes).unwrap())
    }

    #[test]
    fn a_failure_is_kept_with_the_calls_name_until_the_next_failure() {
        let status = guard("halo_test_call", || Err(Failure::invalid("x is null: pass a device pointer")));
        assert_eq!(status, halo_status::HALO_INVALID_ARGUMENT);
        let want = "halo_test_call: x is null: pass a device pointer";
        assert_eq!(halo_last_error_length(), want.len());
        assert_eq!(read(want.len() + 1), (halo_status::HALO_OK, want.to_string()));
        // A success leaves it; a second failure replaces it.
        assert_eq!(guard("halo_ok_call", || Ok(())), halo_status::HALO_OK);
        assert_eq!(read(200).1, want);
        guard("halo_other", || Err(HaloError::NoGpu("no driver".into()).into()));
        assert_eq!(read(200).1, "halo_other: no GPU available: no driver");
    }

    #[test]
    fn short_buffers_get_a_terminated_prefix_cut_at_a_character() {
        guard("halo_x", || Err(Failure::invalid("größe")));
        // "halo_x: gr" is 10 bytes, 'ö' 2 more: 11 bytes of room cut before it.
        assert_eq!(read(12).1, "halo_x: gr");
        assert_eq!(read(13).1, "halo_x: grö");
        assert_eq!(read(1).1, "");
        // No buffer: an error, and the message stays.
        assert_eq!(read(0).0, halo_status::HALO_INVALID_ARGUMENT);
        // SAFETY: a null buffer is checked before any write.
        assert_eq!(unsafe { halo_last_error(std::ptr::null_mut(), 8) }, halo_status::HALO_INVALID_ARGUMENT);
        assert_eq!(read(100).1, "halo_x: größe");
    }

    #[test]
    fn a_panic_is_caught_and_named_as_internal() {
        let status = guard("halo_boom", || panic!("index 7 out of range"));
        assert_eq!(status, halo_status::HALO_INTERNAL);
        let msg = read(300).1;
        assert!(msg.starts_with("halo_boom: internal error") && msg.contains("index 7 out of range"), "{msg}");
        let n = 3;
        let status = guard("halo_boom2", || panic!("formatted {n}"));
        assert_eq!(status, halo_status::HALO_INTERNAL);
        assert!(read(300).1.contains("formatted 3"));
    }

    #[test]
    fn each_thread_has_its_own_last_error() {
        guard("halo_main_thread", || Err(Failure::invalid("here")));
        std::thread::spawn(|| {
            assert_eq!(halo_last_error_length(), 0);
            guard("halo_other_thread", || Err(Failure::invalid("there")));
            assert_eq!(read(100).1, "halo_other_thread: there");
        })
        .join()
        .unwrap();
        assert_eq!(read(100).1, "halo_main_thread: here");
    }
}
