//! `halo_status`: what every call returns, and which library error maps to which code.

use halo::HaloError;
use std::ffi::c_char;

/// What a halo call returns. `HALO_OK` (0) is success; on any other value
/// `halo_last_error` gives the message of the failure (what went wrong and how to fix it).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum halo_status {
    /// Success.
    HALO_OK = 0,
    /// An argument is invalid: a null pointer, a size that does not fit, a halo plan whose ranks
    /// do not fit together, an unknown transport name.
    HALO_INVALID_ARGUMENT = 1,
    /// No usable GPU or CUDA driver on this machine.
    HALO_NO_GPU = 2,
    /// A CUDA driver call failed (the message names the call and the driver's error).
    HALO_CUDA = 3,
    /// NVSHMEM could not be loaded, started or used.
    HALO_NVSHMEM = 4,
    /// A device wait of the exchange expired: a peer never signalled (the message names the rank,
    /// pulse and step).
    HALO_TIMEOUT = 5,
    /// A host wait on an exchange stream saw no progress for its whole budget: a kernel is stuck
    /// where no device deadline reaches.
    HALO_STUCK = 6,
    /// halo's GPU kernels are missing, stale or built for another GPU architecture.
    HALO_KERNELS = 7,
    /// The router could not choose paths between the ranks.
    HALO_ROUTE = 8,
    /// A check of results against their reference failed.
    HALO_VERIFICATION = 9,
    /// Reading or writing a file failed.
    HALO_IO = 10,
    /// A bug in halo (a panic inside the library, caught at the boundary): please report the message.
    HALO_INTERNAL = 11,
    /// The operating system refused halo a resource it needs (a thread for a bounded call).
    HALO_SYSTEM = 12,
}

impl halo_status {
    /// The code's name as the header spells it.
    pub fn name(self) -> &'static str {
        self.name_c().to_str().unwrap_or("HALO_INTERNAL")
    }

    fn name_c(self) -> &'static std::ffi::CStr {
        match self {
            halo_status::HALO_OK => c"HALO_OK",
            halo_status::HALO_INVALID_ARGUMENT => c"HALO_INVALID_ARGUMENT",
            halo_status::HALO_NO_GPU => c"HALO_NO_GPU",
            halo_status::HALO_CUDA => c"HALO_CUDA",
            halo_status::HALO_NVSHMEM => c"HALO_NVSHMEM",
            halo_status::HALO_TIMEOUT => c"HALO_TIMEOUT",
            halo_status::HALO_STUCK => c"HALO_STUCK",
            halo_status::HALO_KERNELS => c"HALO_KERNELS",
            halo_status::HALO_ROUTE => c"HALO_ROUTE",
            halo_status::HALO_VERIFICATION => c"HALO_VERIFICATION",
            halo_status::HALO_IO => c"HALO_IO",
            halo_status::HALO_INTERNAL => c"HALO_INTERNAL",
            halo_status::HALO_SYSTEM => c"HALO_SYSTEM",
        }
    }
}

/// The code of a library error (every variant listed, so a new one must be placed here).
pub(crate) fn status_of(e: &HaloError) -> halo_status {
    match e {
        HaloError::NoGpu(_) => halo_status::HALO_NO_GPU,
        HaloError::Cuda { .. } => halo_status::HALO_CUDA,
        HaloError::MissingPtx { .. } | HaloError::NoKernels { .. } | HaloError::StalePtx { .. } | HaloError::WrongArch { .. } => {
            halo_status::HALO_KERNELS
        }
        // A host call past its deadline (NVSHMEM's init, a collective) like a device wait.
        HaloError::WaitTimeout(_) | HaloError::HostWaitTimeout(_) | HaloError::Deadline(_) => halo_status::HALO_TIMEOUT,
        HaloError::StreamStuck(_) | HaloError::ExchangeStuck { .. } => halo_status::HALO_STUCK,
        HaloError::Nvshmem(_) | HaloError::NvshmemStartup { .. } | HaloError::NvshmemUnusable { .. } => halo_status::HALO_NVSHMEM,
        HaloError::Thread { .. } => halo_status::HALO_SYSTEM,
        // HALO_FAULT asked for a simulated crash that only the halo command can perform.
        HaloError::KillRequested { .. } => halo_status::HALO_INVALID_ARGUMENT,
        HaloError::Route(_) => halo_status::HALO_ROUTE,
        HaloError::Plan(_) | HaloError::InvalidInput(_) => halo_status::HALO_INVALID_ARGUMENT,
        HaloError::Verification { .. } => halo_status::HALO_VERIFICATION,
        HaloError::Io { .. } => halo_status::HALO_IO,
    }
}

/// The name of a status code (`"HALO_NO_GPU"`), a static NUL-terminated string; `"HALO_UNKNOWN"`
/// for a value that is no `halo_status`. Never fails; does not touch the last error.
#[unsafe(no_mangle)]
pub extern "C" fn halo_status_name(status: i32) -> *const c_char {
    let all = [
        halo_status::HALO_OK,
        halo_status::HALO_INVALID_ARGUMENT,
        halo_status::HALO_NO_GPU,
        halo_status::HALO_CUDA,
        halo_status::HALO_NVSHMEM,
        halo_status::HALO_TIMEOUT,
        halo_status::HALO_STUCK,
        halo_status::HALO_KERNELS,
        halo_status::HALO_ROUTE,
        halo_status::HALO_VERIFICATION,
        halo_status::HALO_IO,
        halo_status::HALO_INTERNAL,
        halo_status::HALO_SYSTEM,
    ];
    match all.iter().find(|s| **s as i32 == status) {
        Some(s) => s.name_c().as_ptr(),
        None => c"HALO_UNKNOWN".as_ptr(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn every_code_is_named_and_unknown_values_say_so() {
        for code in 0..13 {
            // SAFETY: halo_status_name returns a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(halo_status_name(code)) }.to_str().unwrap();
            assert!(name.starts_with("HALO_") && name != "HALO_UNKNOWN", "{code}: {name}");
        }
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(halo_status_name(13)) }.to_str().unwrap(), "HALO_UNKNOWN");
        assert_eq!(unsafe { CStr::from_ptr(halo_status_name(-1)) }.to_str().unwrap(), "HALO_UNKNOWN");
        assert_eq!(halo_status::HALO_STUCK.name(), "HALO_STUCK");
    }

    #[test]
    fn library_errors_map_to_their_codes() {
        assert_eq!(status_of(&HaloError::NoGpu("none".into())), halo_status::HALO_NO_GPU);
        assert_eq!(status_of(&HaloError::InvalidInput("bad".into())), halo_status::HALO_INVALID_ARGUMENT);
        assert_eq!(status_of(&HaloError::HostWaitTimeout("late".into())), halo_status::HALO_TIMEOUT);
        assert_eq!(status_of(&HaloError::Nvshmem("down".into())), halo_status::HALO_NVSHMEM);
        assert_eq!(status_of(&HaloError::NoKernels { arch: "sm_90".into() }), halo_status::HALO_KERNELS);
        assert_eq!(status_of(&HaloError::Thread { step: "barrier", detail: "no thread".into() }), halo_status::HALO_SYSTEM);
        assert_eq!(status_of(&HaloError::ExchangeStuck { rank: 1, why: "stuck".into() }), halo_status::HALO_STUCK);
        assert_eq!(status_of(&HaloError::NvshmemUnusable { who: "rank 0".into(), why: "late".into() }), halo_status::HALO_NVSHMEM);
    }
}
