//! Host-to-host messages between the PEs of one node, for the host-driven transports
//! ([`super::host_driven`]): each PE owns an inbox of 64-bit words in shared memory (a file in
//! `/dev/shm`, mapped by every PE of the node), row `w` of which only PE `w` writes. A message is
//! a monotonic sequence number stored with release ordering; the reader spins with acquire loads
//! until the word reaches the value it needs. This is what an MPI library's shared-memory
//! transport does for its control messages (ready-to-receive, done), at the cost of one cache
//! line moving between two CPU cores: well under a microsecond.
//!
//! Every wait is bounded: a peer that never posts becomes an error naming the peer, the message
//! and the step, after the exchange's wait timeout.

use crate::error::{HaloError, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One PE's words: `rows` writers × `slots` words each.
struct Words {
    map: memmap2::MmapMut,
    len: usize,
}

impl Words {
    fn map(file: &File, len: usize, path: &Path) -> Result<Self> {
        // SAFETY: the file is a private shared-memory file of this run, sized to `len` words by
        // its creator before its path was published; every access goes through atomics.
        let map = unsafe { memmap2::MmapOptions::new().len(len * 8).map_mut(file) }.map_err(|source| HaloError::Io {
            what: "mapping the mailbox",
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self { map, len })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.len, "mailbox word {i} of {}", self.len);
        // SAFETY: the mapping is page-aligned and holds `len` u64 words; `i < len`; AtomicU64 has
        // the layout of u64, and every process touches these words only through atomics.
        unsafe { &*(self.map.as_ptr() as *const AtomicU64).add(i) }
    }
}

/// This PE's inbox and the inboxes of the PEs it writes to.
pub struct Mailbox {
    me: usize,
    slots: usize,
    inbox: Words,
    path: PathBuf,
    peers: Vec<Option<Words>>,
    unlinked: bool,
}

impl Mailbox {
    /// Creates this PE's inbox: `n_pes` rows of `slots` words, all zero.
    pub fn create(me: usize, n_pes: usize, slots: usize) -> Result<Self> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let path = crate::node::shared_folder().join(format!("halo-mailbox-{}-{nanos}-{me}", std::process::id()));
        let io = |what, source| HaloError::Io { what, path: path.clone(), source };
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path).map_err(|e| io("creating the mailbox", e))?;
        let len = n_pes * slots;
        file.set_len((len * 8) as u64).map_err(|e| io("sizing the mailbox", e))?;
        let inbox = Words::map(&file, len, &path)?;
        Ok(Self { me, slots, inbox, path, peers: (0..n_pes).map(|_| None).collect(), unlinked: false })
    }

    /// The inbox file, for the peers to open.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Maps PE `pe`'s inbox (its [`Self::path`]) so this PE can post to it.
    pub fn open_peer(&mut self, pe: usize, path: &Path) -> Result<()> {
        let io = |what, source| HaloError::Io { what, path: path.to_path_buf(), source };
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(|e| io("opening a peer's mailbox", e))?;
        let len = self.inbox.len;
        let bytes = file.metadata().map_err(|e| io("reading a peer's mailbox size", e))?.len();
        if bytes != (len * 8) as u64 {
            return Err(HaloError::InvalidInput(format!("PE {pe}'s mailbox {} holds {bytes} bytes, {} expected", path.display(), len * 8)));
        }
        self.peers[pe] = Some(Words::map(&file, len, path)?);
        Ok(())
    }

    /// Removes the inbox file (its mappings stay valid): call once every peer has opened it.
    pub fn unlink(&mut self) {
        if !self.unlinked {
            let _ = std::fs::remove_file(&self.path);
            self.unlinked = true;
        }
    }

    /// Stores `value` into word `slot` of this PE's row in `to`'s inbox (release: everything this
    /// thread did before is visible to a reader that sees the value).
    pub fn post(&self, to: usize, slot: usize, value: u64) -> Result<()> {
        let words = if to == self.me { Some(&self.inbox) } else { self.peers.get(to).and_then(Option::as_ref) };
        let words = words.ok_or_else(|| HaloError::InvalidInput(format!("PE {} has no mailbox mapping of PE {to}", self.me)))?;
        words.word(self.me * self.slots + slot).store(value, Ordering::Release);
        Ok(())
    }

    /// The word `from` last posted into `slot` of this PE's inbox (acquire).
    #[cfg(test)]
    pub fn read(&self, from: usize, slot: usize) -> u64 {
        self.inbox.word(from * self.slots + slot).load(Ordering::Acquire)
    }

    /// Spins until `from` posted at least `at_least` into `slot`, or `timeout` passed; the error
    /// names what was awaited (`what`, called only on expiry).
    pub fn wait(&self, from: usize, slot: usize, at_least: u64, timeout: Duration, what: impl FnOnce() -> String) -> Result<()> {
        let word = self.inbox.word(from * self.slots + slot);
        if word.load(Ordering::Acquire) >= at_least {
            return Ok(());
        }
        let started = Instant::now();
        let mut polls: u32 = 0;
        loop {
            std::hint::spin_loop();
            if word.load(Ordering::Acquire) >= at_least {
                return Ok(());
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(1024) {
                let waited = started.elapsed();
                if waited >= timeout {
                    let seen = word.load(Ordering::Acquire);
                    return Err(HaloError::HostWaitTimeout(format!(
                        "PE {} waited {:.1} s for PE {from} to {} (message {seen}, expected {at_least})",
                        self.me,
                        waited.as_secs_f64(),
                        what()
                    )));
                }
                // A long wait means the peer is far behind: let other threads of this CPU run.
                if waited > Duration::from_millis(1) {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Sets every word of this PE's inbox to zero. Only while no peer posts (a collective reset
    /// fenced by barriers).
    pub fn clear(&self) {
        for i in 0..self.inbox.len {
            self.inbox.word(i).store(0, Ordering::Relaxed);
        }
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        self.unlink();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posts_reach_the_peer_row_and_waits_end_or_expire() {
        // Two "PEs" in one process, each mapping the other's inbox through its file.
        let mut a = Mailbox::create(0, 2, 3).unwrap();
        let mut b = Mailbox::create(1, 2, 3).unwrap();
        let bp = b.path().to_path_buf();
        a.open_peer(1, &bp).unwrap();
        let ap = a.path().to_path_buf();
        b.open_peer(0, &ap).unwrap();
        a.unlink();
        b.unlink();
        assert!(!a.path().exists(), "unlinked");
        a.post(1, 2, 7).unwrap();
        assert_eq!(b.read(0, 2), 7);
        assert_eq!(b.read(0, 1), 0);
        assert_eq!(b.read(1, 2), 0, "row 1 belongs to PE 1 itself");
        b.wait(0, 2, 7, Duration::from_millis(10), || unreachable!("already there")).unwrap();
        b.wait(0, 2, 3, Duration::from_millis(10), || unreachable!("a larger value ends the wait")).unwrap();
        let err = b.wait(0, 1, 1, Duration::from_millis(20), || "post slot 1".into()).unwrap_err().to_string();
        assert!(err.contains("PE 1 waited") && err.contains("PE 0 to post slot 1") && err.contains("expected 1"), "{err}");
        // A post to oneself lands in one's own inbox.
        a.post(0, 0, 4).unwrap();
        assert_eq!(a.read(0, 0), 4);
        a.clear();
        assert_eq!(a.read(0, 0), 0);
    }

    #[test]
    fn a_wait_sees_a_post_from_another_thread() {
        let mut a = Mailbox::create(0, 2, 1).unwrap();
        let b = Mailbox::create(1, 2, 1).unwrap();
        a.open_peer(1, b.path()).unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            a.post(1, 0, 2).unwrap();
            a
        });
        b.wait(0, 0, 2, Duration::from_secs(10), || "post".into()).unwrap();
        drop(t.join().unwrap());
    }

    #[test]
    fn a_peer_file_of_the_wrong_size_is_refused() {
        let mut a = Mailbox::create(0, 2, 4).unwrap();
        let b = Mailbox::create(1, 2, 3).unwrap();
        let err = a.open_peer(1, b.path()).unwrap_err().to_string();
        assert!(err.contains("PE 1's mailbox") && err.contains("64 expected"), "{err}");
    }
}
