//! Forwards a rank's stdout/stderr to the launcher's, one whole line at a time with a `[rank N] ` prefix.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread;
use std::time::{Duration, Instant};

/// A line longer than this is forwarded in pieces (each with its prefix) so a rank that never
/// prints a newline cannot make the launcher buffer without bound.
const MAX_LINE: u64 = 1 << 20;

/// Which of the launcher's streams a pipe goes to.
#[derive(Debug, Clone, Copy)]
pub enum Sink {
    /// The launcher's stdout.
    Stdout,
    /// The launcher's stderr.
    Stderr,
}

/// The forwarding threads of all ranks; [`Forwarders::finish`] waits for them, boundedly.
pub struct Forwarders {
    done_tx: Sender<()>,
    done_rx: Receiver<()>,
    running: usize,
}

impl Forwarders {
    /// No threads yet.
    pub fn new() -> Forwarders {
        let (done_tx, done_rx) = channel();
        Forwarders { done_tx, done_rx, running: 0 }
    }

    /// Starts a thread copying `pipe` to `sink`, each line prefixed with `[rank {rank}] `.
    pub fn forward(&mut self, rank: usize, pipe: impl Read + Send + 'static, sink: Sink) -> io::Result<()> {
        let done = self.done_tx.clone();
        thread::Builder::new().name(format!("halo-launch-rank{rank}-out")).spawn(move || {
            copy_lines(rank, pipe, sink);
            // The receiver may be gone if the launcher stopped waiting; nothing to do then.
            let _ = done.send(());
        })?;
        self.running += 1;
        Ok(())
    }

    /// Waits until every pipe reached end of file or `limit` passed. The pipes close when the ranks
    /// exit; a grandchild that escaped the rank's process group could keep one open forever, and the
    /// launcher must not hang on it.
    pub fn finish(self, limit: Duration) {
        let deadline = Instant::now() + limit;
        for _ in 0..self.running {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.done_rx.recv_timeout(left).is_err() {
                tracing::warn!("some rank output was still open {limit:?} after the ranks exited; not waiting for it");
                return;
            }
        }
    }
}

impl Default for Forwarders {
    fn default() -> Self {
        Self::new()
    }
}

fn copy_lines(rank: usize, pipe: impl Read, sink: Sink) {
    let prefix = format!("[rank {rank}] ");
    let mut reader = BufReader::new(pipe);
    let mut line = Vec::with_capacity(256);
    // After the launcher's own stream fails (e.g. a closed pipe) we keep draining the rank's pipe
    // so the rank never blocks on a full pipe, and drop the text.
    let mut sink_ok = true;
    loop {
        line.clear();
        line.extend_from_slice(prefix.as_bytes());
        match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        if sink_ok {
            // One write_all under the stream's lock: lines of different ranks never mix.
            let result = match sink {
                Sink::Stdout => {
                    let mut out = io::stdout().lock();
                    out.write_all(&line).and_then(|()| out.flush())
                }
                Sink::Stderr => io::stderr().lock().write_all(&line),
            };
            sink_ok = result.is_ok();
        }
    }
}
