//! NVSHMEM start-up failures that its init call never returns.
//!
//! NVSHMEM's remote transports run their atomics through the proxy thread, which needs a GPU–CPU
//! mapping of device memory (GDRCopy, or from NVSHMEM 3.8 with driver R610 its own CUDA DMA-BUF
//! backend). Over UCX without one the proxy's first atomic fails: NVSHMEM 3.4 prints `AMO 8 not
//! supported with the current configuration (GDRCopy Disabled)`, 3.8 prints `UCX atomic verb 8 is
//! unsupported without a GPU CPU mapping`, then `proxy.cpp ... aborting`, and the proxy thread is
//! gone while `nvshmemx_hostlib_init_attr` waits for it forever. Nothing is returned, so halo reads
//! what NVSHMEM writes: during init this process's standard error goes through a pipe
//! ([`StderrTap`]) that forwards every byte unchanged and hands each line to [`recognise`]; init
//! itself runs on a thread of its own ([`run_watched`]), so the caller gets a typed error
//! ([`StartupFailure`]) as soon as such a line appears instead of waiting out the start-up deadline.
//! (Not under NVSHMEM's MPI bootstrap: MPI wants its calls from the thread that initialised it.)

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What NVSHMEM's message says went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The remote transport cannot run the proxy's atomics: no GPU–CPU mapping (no GDRCopy, and
    /// no CUDA DMA-BUF backend).
    AtomicsNeedGpuCpuMapping,
    /// The proxy thread aborted (for a reason NVSHMEM printed before this line).
    ProxyAborted,
}

/// A fatal start-up failure recognised in NVSHMEM's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartupFailure {
    /// The kind.
    pub kind: FailureKind,
    /// NVSHMEM's line, as printed (trimmed).
    pub line: String,
}

impl StartupFailure {
    /// What happened, in halo's words.
    pub fn cause(&self) -> &'static str {
        match self.kind {
            FailureKind::AtomicsNeedGpuCpuMapping => {
                "NVSHMEM's remote transport (UCX) cannot run the proxy thread's atomic operations without a GPU-CPU mapping of device memory \
                 (GDRCopy is not loaded, and this NVSHMEM or driver has no CUDA DMA-BUF backend), so the proxy thread aborted and NVSHMEM's init can never finish"
            }
            FailureKind::ProxyAborted => {
                "NVSHMEM's proxy thread aborted during init (see NVSHMEM's lines above for why), so NVSHMEM's init can never finish"
            }
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> &'static str {
        "give the remote transport a GPU-CPU mapping: load GDRCopy's kernel module (`modprobe gdrdrv`, GDRCopy installed where NVSHMEM finds libgdrapi), \
         or use NVSHMEM 3.8 or later with NVIDIA driver R610 or later (its CUDA DMA-BUF backend); or, with every PE on one node, \
         keep NVSHMEM on P2P (unset NVSHMEM_DISABLE_P2P and NVSHMEM_REMOTE_TRANSPORT, or set NVSHMEM_REMOTE_TRANSPORT=none)"
    }
}

impl std::fmt::Display for StartupFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}. NVSHMEM said: `{}`. Fix: {}", self.cause(), self.line, self.fix())
    }
}

/// The failure one line of NVSHMEM's output reports, if it is one that stops init for good.
pub fn recognise(line: &str) -> Option<StartupFailure> {
    let l = line.to_ascii_lowercase();
    let kind = if (l.contains("amo") && l.contains("not supported") && (l.contains("gdrcopy disabled") || l.contains("ucx_local_amo")))
        || (l.contains("atomic verb") && l.contains("unsupported without a gpu cpu mapping"))
    {
        FailureKind::AtomicsNeedGpuCpuMapping
    } else if l.contains("proxy") && l.contains("aborting") {
        FailureKind::ProxyAborted
    } else {
        return None;
    };
    Some(StartupFailure { kind, line: line.trim().to_string() })
}

/// While alive, everything this process writes to file descriptor 2 goes through a pipe: a
/// thread of its own forwards the bytes unchanged to where they went before and hands every
/// complete line to a callback. Dropping it puts the old standard error back, forwards what is
/// left and ends the thread.
pub struct StderrTap {
    saved: RawFd,
    write_end: RawFd,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

impl StderrTap {
    /// Starts the tap; `on_line` sees every line (without its newline).
    pub fn start(mut on_line: impl FnMut(&str) + Send + 'static) -> std::io::Result<Self> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (read_end, write_end) = (fds[0], fds[1]);
        // SAFETY: plain descriptor calls on descriptors this process owns; on failure the ones
        // made here are closed again.
        let saved = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3) };
        if saved < 0 || unsafe { libc::dup2(write_end, 2) } < 0 {
            let e = std::io::Error::last_os_error();
            unsafe {
                libc::close(read_end);
                libc::close(write_end);
                if saved >= 0 {
                    libc::close(saved);
                }
            }
            return Err(e);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let spawned = std::thread::Builder::new().name("halo-stderr-tap".into()).spawn(move || {
            let mut pending: Vec<u8> = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let mut pfd = libc::pollfd { fd: read_end, events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                let ready = unsafe { libc::poll(&mut pfd, 1, 50) };
                if ready == 0 {
                    if stopping.load(Ordering::Acquire) {
                        break;
                    }
                    continue;
                }
                // SAFETY: reads into a buffer of the given size from the pipe this thread owns.
                let n = unsafe { libc::read(read_end, buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                if n <= 0 {
                    break;
                }
                let bytes = &buf[..n as usize];
                write_all(saved, bytes);
                pending.extend_from_slice(bytes);
                while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                    on_line(&String::from_utf8_lossy(&pending[..end]));
                    pending.drain(..=end);
                }
            }
            if !pending.is_empty() {
                on_line(&String::from_utf8_lossy(&pending));
            }
            // SAFETY: this thread owns the read end.
            unsafe { libc::close(read_end) };
        });
        match spawned {
            Ok(reader) => {
                // The watchdog's last words must not wait in the pipe.
                crate::watchdog::write_messages_to(saved);
                Ok(Self { saved, write_end, stop, reader: Some(reader) })
            }
            Err(e) => {
                // SAFETY: puts the old standard error back and closes what was made above.
                unsafe {
                    libc::dup2(saved, 2);
                    libc::close(saved);
                    libc::close(write_end);
                    libc::close(read_end);
                }
                Err(e)
            }
        }
    }
}

impl Drop for StderrTap {
    fn drop(&mut self) {
        // SAFETY: restores fd 2 from the saved copy and closes this tap's write end; the reader
        // then sees the end of the pipe (or, if another thread still holds a copy of the write
        // end, stops at its next idle poll).
        unsafe {
            libc::dup2(self.saved, 2);
            libc::close(self.write_end);
        }
        crate::watchdog::write_messages_to(2);
        self.stop.store(true, Ordering::Release);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        // SAFETY: the reader, which wrote to it, has ended.
        unsafe { libc::close(self.saved) };
    }
}

/// Writes all of `bytes` to `fd`, giving up on an error (standard error has nowhere else to go).
fn write_all(fd: RawFd, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: writes from a valid buffer of the given length.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// How a watched call ended ([`run_watched`]).
#[derive(Debug)]
pub enum Watched<T> {
    /// It returned this.
    Done(T),
    /// A fatal failure was recognised first; the call's thread is left behind, blocked.
    Failed(StartupFailure),
    /// Neither within the limit; the call's thread is left behind.
    Late,
}

/// Runs `call` on a thread of its own while the lines `start_tap` makes it see are passed to
/// [`recognise`]: the call's result, or the first failure recognised (after which the call is
/// abandoned on its thread: it never returns), or [`Watched::Late`] after `limit`. `start_tap`
/// gets the callback to install (normally `|f| StderrTap::start(f)`); the tap lives until this
/// returns.
pub fn run_watched<T: Send + 'static, G>(
    call: impl FnOnce() -> T + Send + 'static,
    start_tap: impl FnOnce(Box<dyn FnMut(&str) + Send>) -> std::io::Result<G>,
    limit: Duration,
) -> std::io::Result<Watched<T>> {
    enum Event<T> {
        Done(T),
        Failed(StartupFailure),
    }
    let (tx, rx): (Sender<Event<T>>, Receiver<Event<T>>) = mpsc::channel();
    let lines = tx.clone();
    let tap = start_tap(Box::new(move |line: &str| {
        if let Some(f) = recognise(line) {
            let _ = lines.send(Event::Failed(f));
        }
    }))?;
    let worker = std::thread::Builder::new().name("halo-nvshmem-init".into()).spawn(move || {
        let out = call();
        let _ = tx.send(Event::Done(out));
    })?;
    let deadline = Instant::now() + limit;
    let outcome = match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(Event::Done(v)) => {
            let _ = worker.join();
            Watched::Done(v)
        }
        Ok(Event::Failed(f)) => Watched::Failed(f),
        Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => Watched::Late,
    };
    drop(tap);
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVSHMEM 3.4.5's lines over UCX without GDRCopy (two PEs on one H200,
    /// `NVSHMEM_REMOTE_TRANSPORT=ucx NVSHMEM_DISABLE_P2P=1`), as `halo launch` prefixed them.
    const NVSHMEM_345: [&str; 2] = [
        "[rank 1] /dvs/p4/build/sw/rel/gpgpu/toolkit/r13.0/main_nvshmem/src/modules/transport/ucx/ucx.cpp:nvshmemt_ucx_local_amo:837: AMO 8 not supported with the current configuration (GDRCopy Disabled)",
        "[rank 1] /dvs/p4/build/sw/rel/gpgpu/toolkit/r13.0/main_nvshmem/src/host/proxy/proxy.cpp:process_channel_amo:622: aborting due to error in process_channel_dma",
    ];
    /// NVSHMEM 3.8.0's line in the same set-up.
    const NVSHMEM_380: &str = "UCX atomic verb 8 is unsupported without a GPU CPU mapping. Enable GDRCopy or the internal CUDA DMA-BUF backend";

    #[test]
    fn dead_proxy_at_init_is_named() {
        // Recognition: both versions' refusals, and the proxy's abort.
        let amo = recognise(&NVSHMEM_345[0].replace("[rank 1] ", "")).expect("3.4.5's AMO line");
        assert_eq!(amo.kind, FailureKind::AtomicsNeedGpuCpuMapping);
        assert_eq!(recognise(NVSHMEM_380).map(|f| f.kind), Some(FailureKind::AtomicsNeedGpuCpuMapping), "3.8.0's verb line");
        assert_eq!(recognise(NVSHMEM_345[1]).map(|f| f.kind), Some(FailureKind::ProxyAborted));
        for quiet in [
            "[rank 0] PE 0 of 2 started",
            "NVSHMEM_DEBUG: transport ucx selected",
            "",
            "WARN: GDRCopy not found, falling back",
            "ibrc_amo: AMO fetch-add not supported by this HCA, emulated",
        ] {
            assert_eq!(recognise(quiet), None, "{quiet}");
        }
        // The message names the cause, NVSHMEM's own words and every fix.
        let text = amo.to_string();
        for needle in ["GPU-CPU mapping", "AMO 8 not supported", "gdrdrv", "NVSHMEM 3.8", "R610", "P2P", "NVSHMEM_DISABLE_P2P"] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
        // Propagation: an init that never returns while those lines reach standard error ends
        // in the typed failure, long before the limit, without waiting for the call.
        let (hold, held) = mpsc::channel::<()>();
        let started = Instant::now();
        let limit = Duration::from_secs(120);
        let out = run_watched(
            move || held.recv().is_ok(),
            |on_line| {
                let tap = StderrTap::start(on_line)?;
                for line in NVSHMEM_345 {
                    write_all(2, format!("{line}\n").as_bytes());
                }
                Ok(tap)
            },
            limit,
        )
        .expect("watching");
        assert!(started.elapsed() < limit);
        match out {
            Watched::Failed(f) => {
                assert_eq!((f.kind, f.line.as_str()), (FailureKind::AtomicsNeedGpuCpuMapping, NVSHMEM_345[0]), "the first fatal line names the cause")
            }
            other => panic!("expected the recognised failure, got {other:?}"),
        }
        drop(hold); // the abandoned call's thread ends here
        // Standard error is back: a line written now is not seen by any tap.
        write_all(2, b"after the tap\n");
        // A call that returns is passed through, with nothing recognised.
        let out = run_watched(|| 7, |on_line| StderrTap::start(on_line), limit).expect("watching");
        assert!(matches!(out, Watched::Done(7)), "{out:?}");
    }

    #[test]
    fn the_tap_forwards_partial_lines_and_sees_every_line() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let keep = seen.clone();
        let tap = StderrTap::start(move |l| keep.lock().unwrap().push(l.to_string())).expect("tap");
        write_all(2, b"one\ntw");
        write_all(2, b"o\nthree");
        drop(tap);
        let seen = seen.lock().unwrap().clone();
        // Other tests of this binary may write to standard error meanwhile: ours come in order.
        let ours: Vec<&str> = seen.iter().map(String::as_str).filter(|l| ["one", "two", "three"].contains(l)).collect();
        assert_eq!(ours, ["one", "two", "three"], "{seen:?}");
    }
}
