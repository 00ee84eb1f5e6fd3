//! What a crash leaves behind: on SIGSEGV or SIGBUS the `halo` command prints which thread
//! faulted (its name, its tid, whether it is the process's main thread) and where, before the
//! process ends the way it would have without this report. A fault in a thread halo did not start
//! (NVSHMEM's proxy or bootstrap, the CUDA driver) then shows as such instead of a bare
//! "Segmentation fault".
//!
//! The report is written with `write(2)` from a fixed buffer, followed on glibc by the faulting
//! thread's frames from glibc's `backtrace` and `backtrace_symbols_fd` (return addresses with the
//! nearest exported symbol of each library, e.g. `libnvshmem_host.so.3(+0x…)`; no allocation, the
//! unwinder is loaded at install, glibc's documented way to use them in a handler). Offsets into the
//! `halo` binary resolve with `addr2line -e halo -f -C 0x…` (the bundle keeps its debug info).
//!
//! After the report the previous disposition is restored: a fault (the kernel's `si_code > 0`)
//! returns and faults again into it (Rust's stack-overflow report, or the default action); a
//! signal sent by `kill` is raised again with the default action. Either way the process dies of
//! the same signal as before.

use std::fmt::Write as _;
use std::sync::OnceLock;

/// The signals reported.
const SIGNALS: [libc::c_int; 2] = [libc::SIGSEGV, libc::SIGBUS];

/// The dispositions before ours, by position in [`SIGNALS`].
static PREVIOUS: OnceLock<[libc::sigaction; 2]> = OnceLock::new();
/// Frames printed at most.
const FRAMES: usize = 48;

/// The main thread's signal stack: room for glibc's unwinder (Rust's own is a few pages).
const MAIN_SIGNAL_STACK: usize = 256 << 10;

/// Below this a thread's signal stack is too small for the unwinder: its frames are skipped.
const MIN_STACK_FOR_FRAMES: usize = 64 << 10;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    /// glibc's `backtrace(3)`.
    fn backtrace(buffer: *mut *mut libc::c_void, size: libc::c_int) -> libc::c_int;
    /// glibc's `backtrace_symbols_fd(3)`: one line per frame written to `fd`, without allocating.
    fn backtrace_symbols_fd(buffer: *const *mut libc::c_void, size: libc::c_int, fd: libc::c_int);
}

/// The calling thread's frames on stderr (glibc), or nothing.
fn write_frames() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: the buffer holds FRAMES pointers and backtrace writes at most that many.
    unsafe {
        let mut frames = [std::ptr::null_mut::<libc::c_void>(); FRAMES];
        let n = backtrace(frames.as_mut_ptr(), FRAMES as libc::c_int);
        backtrace_symbols_fd(frames.as_ptr(), n, 2);
    }
}

/// Loads glibc's unwinder now: its first use loads libgcc_s, which must not happen in a handler.
fn preload_unwinder() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: as in write_frames, into a local buffer.
    unsafe {
        let mut frames = [std::ptr::null_mut::<libc::c_void>(); 2];
        backtrace(frames.as_mut_ptr(), 2);
    }
}

/// Installs the report for SIGSEGV and SIGBUS (once; later calls do nothing). Call early in
/// `main`, before other threads start.
pub fn install() {
    PREVIOUS.get_or_init(|| {
        preload_unwinder();
        give_main_thread_a_larger_signal_stack();
        // SAFETY: sigaction with a zeroed struct whose handler, mask and flags are set; the
        // previous dispositions are read into zeroed structs the kernel fills.
        unsafe {
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = on_fatal as *const () as usize;
            ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut ours.sa_mask);
            let mut previous: [libc::sigaction; 2] = std::mem::zeroed();
            for (sig, prev) in SIGNALS.iter().zip(previous.iter_mut()) {
                libc::sigaction(*sig, &ours, prev);
            }
            previous
        }
    });
}

/// Replaces the calling thread's signal stack by one of [`MAIN_SIGNAL_STACK`] bytes (kept for the
/// life of the process), so a fault in it can print its frames.
fn give_main_thread_a_larger_signal_stack() {
    let stack: &'static mut [u8] = Box::leak(vec![0u8; MAIN_SIGNAL_STACK].into_boxed_slice());
    // SAFETY: the new stack is valid for the life of the process; sigaltstack copies the struct.
    unsafe {
        let ss = libc::stack_t { ss_sp: stack.as_mut_ptr().cast(), ss_flags: 0, ss_size: stack.len() };
        libc::sigaltstack(&ss, std::ptr::null_mut());
    }
}

/// Whether the handler runs on a signal stack too small for the unwinder (a thread Rust started,
/// whose signal stack is a few pages).
fn on_small_signal_stack() -> bool {
    // SAFETY: sigaltstack with a null new stack only reads the current one into a zeroed struct.
    unsafe {
        let mut cur: libc::stack_t = std::mem::zeroed();
        libc::sigaltstack(std::ptr::null(), &mut cur) == 0 && cur.ss_flags & libc::SS_ONSTACK != 0 && cur.ss_size < MIN_STACK_FOR_FRAMES
    }
}

/// The report's text: signal, address, thread, pid (no allocation).
fn report(out: &mut Buf, sig: libc::c_int, addr: usize, user_sent: bool, thread: &str, tid: i64, pid: i64) {
    let name = if sig == libc::SIGBUS { "SIGBUS" } else { "SIGSEGV" };
    let whose = if tid == pid { "the process's main thread" } else { "not the main thread" };
    let _ = write!(out, "halo: fatal signal {sig} ({name}) in thread '{thread}' (tid {tid}, {whose}) of pid {pid}, ");
    if user_sent {
        let _ = write!(out, "sent by another process (kill)");
    } else {
        let _ = write!(out, "at address {addr:#x}");
    }
    let _ = writeln!(
        out,
        "; threads halo starts are named halo-*, `main` or the command's name, others belong to NVSHMEM, the CUDA driver or a launcher library"
    );
}

extern "C" fn on_fatal(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: only async-signal-safe calls (prctl, syscall, getpid, write, glibc's backtrace after
    // its preload, sigaction, signal, raise); `info` is the kernel's siginfo for this signal.
    unsafe {
        let (code, addr) = if info.is_null() { (0, 0) } else { ((*info).si_code, (*info).si_addr() as usize) };
        let mut comm = [0u8; 17];
        libc::prctl(libc::PR_GET_NAME, comm.as_mut_ptr() as libc::c_ulong, 0, 0, 0);
        let len = comm.iter().position(|&b| b == 0).unwrap_or(16);
        let thread = std::str::from_utf8(&comm[..len]).unwrap_or("?");
        let tid = libc::syscall(libc::SYS_gettid);
        let mut out = Buf::new();
        report(&mut out, sig, addr, code <= 0, thread, tid, i64::from(libc::getpid()));
        libc::write(2, out.bytes().as_ptr().cast(), out.bytes().len());
        if on_small_signal_stack() {
            let note = b"halo: (frames skipped: this thread's signal stack is too small for the unwinder)\n";
            libc::write(2, note.as_ptr().cast(), note.len());
        } else {
            write_frames();
        }
        let at = SIGNALS.iter().position(|&s| s == sig).unwrap_or(0);
        match PREVIOUS.get() {
            Some(previous) if code > 0 => {
                libc::sigaction(sig, &previous[at], std::ptr::null_mut());
            }
            _ => {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
        }
    }
}

/// A fixed-size text buffer (`fmt::Write` without allocation); text past its end is dropped.
struct Buf {
    data: [u8; 512],
    len: usize,
}

impl Buf {
    fn new() -> Self {
        Self { data: [0; 512], len: 0 }
    }

    fn bytes(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

impl std::fmt::Write for Buf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.data.len() - self.len);
        self.data[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(sig: libc::c_int, addr: usize, user_sent: bool, thread: &str, tid: i64, pid: i64) -> String {
        let mut b = Buf::new();
        report(&mut b, sig, addr, user_sent, thread, tid, pid);
        String::from_utf8(b.bytes().to_vec()).unwrap()
    }

    #[test]
    fn the_report_names_the_thread_and_the_fault() {
        let t = text(libc::SIGSEGV, 0x10, false, "halo", 1234, 1200);
        assert!(
            t.starts_with("halo: fatal signal 11 (SIGSEGV) in thread 'halo' (tid 1234, not the main thread) of pid 1200, at address 0x10;"),
            "{t}"
        );
        let t = text(libc::SIGBUS, 0, true, "main", 7, 7);
        assert!(t.contains("(SIGBUS) in thread 'main' (tid 7, the process's main thread)") && t.contains("sent by another process"), "{t}");
    }

    #[test]
    fn the_buffer_drops_what_does_not_fit() {
        let mut b = Buf::new();
        let long = "x".repeat(2000);
        let _ = write!(b, "{long}");
        assert_eq!(b.bytes().len(), 512);
    }
}
