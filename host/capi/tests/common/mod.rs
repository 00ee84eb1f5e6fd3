//! What the C API's GPU tests share: reading the last error and asserting a call succeeded, as a
//! C program would.

use halo_capi::status::halo_status;

/// The message of the last failed call on this thread.
pub fn last_error() -> String {
    let mut buf = vec![0 as std::ffi::c_char; halo_capi::error::halo_last_error_length() + 1];
    // SAFETY: `buf` has that many writable bytes.
    unsafe { halo_capi::error::halo_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: NUL-terminated by halo_last_error.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

/// Asserts that `call` returned `HALO_OK`, with its last error when it did not.
pub fn ok(status: halo_status, call: &str) {
    assert_eq!(status, halo_status::HALO_OK, "{call}: {}", last_error());
}
