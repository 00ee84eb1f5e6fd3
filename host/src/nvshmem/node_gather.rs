//! The all-gather of [`super::KeptGather`] between the PEs of one node, through shared memory
//! instead of the symmetric heap. Host bytes that travel through GPU memory cost a copy in, a put
//! per PE, a barrier on a stream and its synchronisation, and copies out: about 0.1–0.2 ms per
//! call on the GPU machines' hosts, three calls per search step. Through files in `/dev/shm`
//! mapped by every PE it is a `memcpy` in, one release store, a spin on each peer's word and a
//! `memcpy` out: what an MPI library's shared-memory transport does for small messages.
//!
//! Each PE owns two segments (one per call parity), each a 64-byte header (`call`: the call whose
//! message the segment holds, stored last with release ordering; `len`: its bytes) and the
//! message. Call `k` writes segment `k % 2` and waits for every peer's segment `k % 2` to hold
//! call `k`. Reuse is safe without a second handshake: a PE writes segment `k % 2` again at call
//! `k + 2` only after it has seen every peer's call `k + 1`, which each peer posts only after it
//! has finished reading call `k`. A message longer than a segment grows the segment's file in
//! place (only its owner writes it, and nobody reads it then, by the same argument); a reader
//! maps a peer's segment again when the header announces more bytes than it has mapped.
//!
//! The files are unlinked as soon as every PE has opened them (a collective of the caller), so
//! nothing is left behind, whatever happens to the processes.

use crate::error::{HaloError, Result};
use memmap2::{Mmap, MmapMut, MmapOptions};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes of a segment's header: the call word, the length word, padding to a cache line.
const HEADER: usize = 64;
/// Word offsets in the header.
const CALL: usize = 0;
const LEN: usize = 1;

/// One PE's segment of one parity as this PE maps it.
enum Mapping {
    /// This PE's own (written here).
    Own(MmapMut),
    /// A peer's (read here).
    Peer(Mmap),
}

impl Mapping {
    fn bytes(&self) -> &[u8] {
        match self {
            Mapping::Own(m) => m,
            Mapping::Peer(m) => m,
        }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        let b = self.bytes();
        assert!(b.len() >= HEADER && i < HEADER / 8, "segment header word {i} of a {}-byte mapping", b.len());
        // SAFETY: the mapping is page-aligned and at least `HEADER` bytes long; `i < HEADER / 8`;
        // AtomicU64 has the layout of u64, and every process reaches the header words only
        // through atomics (the message bytes are ordered by the `CALL` word's release/acquire).
        unsafe { &*(b.as_ptr() as *const AtomicU64).add(i) }
    }
}

/// A segment: its file (kept open, so it can be mapped again after it grew, even unlinked) and
/// the current mapping.
struct Segment {
    file: File,
    map: Mapping,
    path: PathBuf,
}

impl Segment {
    fn create(path: PathBuf, bytes: usize) -> Result<Self> {
        let io = |what, source| HaloError::Io { what, path: path.clone(), source };
        let file =
            OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path).map_err(|e| io("creating a gather segment", e))?;
        file.set_len((HEADER + bytes) as u64).map_err(|e| io("sizing a gather segment", e))?;
        // SAFETY: a new private file of this run, sized above; only this PE writes it, readers
        // order their reads of the message by the header's atomics.
        let map = unsafe { MmapOptions::new().map_mut(&file) }.map_err(|e| io("mapping a gather segment", e))?;
        Ok(Self { file, map: Mapping::Own(map), path })
    }

    fn open(path: &Path) -> Result<Self> {
        let io = |what, source| HaloError::Io { what, path: path.to_path_buf(), source };
        let file = OpenOptions::new().read(true).open(path).map_err(|e| io("opening a peer's gather segment", e))?;
        let mut s = Self { file, map: Mapping::Peer(empty_map()?), path: path.to_path_buf() };
        s.remap()?;
        Ok(s)
    }

    /// Maps the file again at its current size.
    fn remap(&mut self) -> Result<()> {
        let io = |what, source| HaloError::Io { what, path: self.path.clone(), source };
        let len = self.file.metadata().map_err(|e| io("reading a gather segment's size", e))?.len() as usize;
        if len < HEADER {
            return Err(HaloError::InvalidInput(format!("the gather segment {} holds {len} bytes, less than its header", self.path.display())));
        }
        // SAFETY: as in `create`/`open`: the owner only grows the file, and reads of the message
        // are ordered by the header's atomics.
        self.map = match self.map {
            Mapping::Own(_) => {
                Mapping::Own(unsafe { MmapOptions::new().len(len).map_mut(&self.file) }.map_err(|e| io("mapping a gather segment", e))?)
            }
            Mapping::Peer(_) => Mapping::Peer(unsafe { MmapOptions::new().len(len).map(&self.file) }.map_err(|e| io("mapping a gather segment", e))?),
        };
        Ok(())
    }

    /// Message bytes the current mapping holds.
    fn capacity(&self) -> usize {
        self.map.bytes().len() - HEADER
    }
}

/// A one-page anonymous mapping, the placeholder of a mapping about to be made.
fn empty_map() -> Result<Mmap> {
    MmapOptions::new().len(HEADER).map_anon().and_then(|m| m.make_read_only()).map_err(|source| HaloError::Io {
        what: "mapping a placeholder",
        path: PathBuf::new(),
        source,
    })
}

/// This PE's segments before the peers are known ([`NodeGather::create`]), then the gather
/// itself ([`NodeGather::connect`]).
pub(crate) struct NodeGather {
    me: usize,
    /// `[pe][parity]` once connected (this PE's own at `me`); only the own ones before.
    segments: Vec<[Segment; 2]>,
    /// This PE's segment files (removed by [`Self::unlink`], at the latest on drop).
    own_paths: [PathBuf; 2],
    /// Calls made so far.
    calls: u64,
    timeout: Duration,
}

impl NodeGather {
    /// This PE's two segments of `bytes` message bytes each (grown when a message is longer).
    /// Returns them unconnected: publish [`Self::paths`], then [`Self::connect`].
    pub(crate) fn create(me: usize, bytes: usize, timeout: Duration) -> Result<Self> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let path = |p: usize| crate::node::shared_folder().join(format!("halo-gather-{}-{nanos}-{me}-{p}", std::process::id()));
        let first = Segment::create(path(0), bytes)?;
        let second = Segment::create(path(1), bytes).inspect_err(|_| {
            let _ = std::fs::remove_file(&first.path);
        })?;
        let own_paths = [first.path.clone(), second.path.clone()];
        Ok(Self { me, segments: vec![[first, second]], own_paths, calls: 0, timeout })
    }

    /// This PE's segment files, for the peers to open.
    pub(crate) fn paths(&self) -> [PathBuf; 2] {
        self.own_paths.clone()
    }

    /// Opens every PE's segments (`paths[pe]`, this PE's own included, which stay as they are).
    /// Every PE must have created its segments first; unlink them with [`Self::unlink`] once
    /// every PE has connected.
    pub(crate) fn connect(mut self, paths: &[[PathBuf; 2]]) -> Result<Self> {
        if self.segments.len() != 1 || self.me >= paths.len() {
            return Err(HaloError::InvalidInput(format!("a node gather of PE {} connects once, to {} PEs", self.me, paths.len())));
        }
        let own = self.segments.pop().ok_or_else(|| HaloError::InvalidInput("no own segments".into()))?;
        let mut own = Some(own);
        for (pe, p) in paths.iter().enumerate() {
            if pe == self.me {
                self.segments.push(own.take().ok_or_else(|| HaloError::InvalidInput("own segments taken twice".into()))?);
            } else {
                self.segments.push([Segment::open(&p[0])?, Segment::open(&p[1])?]);
            }
        }
        Ok(self)
    }

    /// Removes this PE's segment files (every mapping and open file stays valid): once every PE
    /// has connected.
    pub(crate) fn unlink(&self) {
        for p in &self.own_paths {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Every PE's `mine`, indexed by PE. Collective over the connected PEs; every wait is bounded
    /// by the timeout given at creation (the error names the peer).
    pub(crate) fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.all_gather_owned(mine.to_vec())
    }

    /// [`Self::all_gather`] of a message this PE hands over: its own entry of the result is
    /// `mine` itself, not a copy (a search's pulse message is a few hundred kilobytes, copied
    /// cold).
    pub(crate) fn all_gather_owned(&mut self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let call = self.calls + 1;
        let parity = (call % 2) as usize;
        let me = self.me;
        // Write: grow the own segment first when the message does not fit.
        {
            let seg = &mut self.segments[me][parity];
            if mine.len() > seg.capacity() {
                let bytes = mine.len() + mine.len() / 2;
                seg.file.set_len((HEADER + bytes) as u64).map_err(|source| HaloError::Io {
                    what: "growing a gather segment",
                    path: seg.path.clone(),
                    source,
                })?;
                seg.remap()?;
            }
            let Mapping::Own(map) = &mut seg.map else {
                return Err(HaloError::InvalidInput("this PE's gather segment is mapped read-only".into()));
            };
            map[HEADER..HEADER + mine.len()].copy_from_slice(&mine);
            seg.map.word(LEN).store(mine.len() as u64, Ordering::Relaxed);
            // Release: a peer that sees `call` sees the length and the message.
            seg.map.word(CALL).store(call, Ordering::Release);
        }
        self.calls = call;
        let (timeout, started) = (self.timeout, Instant::now());
        let mut all = Vec::with_capacity(self.segments.len());
        let mut mine = Some(mine);
        for pe in 0..self.segments.len() {
            if pe == me {
                all.push(mine.take().unwrap_or_default());
                continue;
            }
            let seg = &mut self.segments[pe][parity];
            wait_for(seg.map.word(CALL), call, started, timeout, || format!("PE {me} waited for PE {pe}'s message of gather call {call}"))?;
            let len = seg.map.word(LEN).load(Ordering::Relaxed) as usize;
            if len > seg.capacity() {
                seg.remap()?;
                if len > seg.capacity() {
                    return Err(HaloError::InvalidInput(format!(
                        "PE {pe}'s gather message of {len} bytes is longer than its segment ({} bytes)",
                        seg.capacity()
                    )));
                }
            }
            all.push(seg.map.bytes()[HEADER..HEADER + len].to_vec());
        }
        Ok(all)
    }
}

impl Drop for NodeGather {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Spins until `word` reaches `call` (acquire), yielding the CPU after the first millisecond; an
/// error after `timeout` from `started`, with `what` saying what was awaited.
fn wait_for(word: &AtomicU64, call: u64, started: Instant, timeout: Duration, what: impl FnOnce() -> String) -> Result<()> {
    let mut polls: u32 = 0;
    loop {
        let seen = word.load(Ordering::Acquire);
        if seen >= call {
            // A peer can be at most one call ahead of this one: it needs this PE's message of
            // `call` to finish it.
            return if seen == call {
                Ok(())
            } else {
                Err(HaloError::InvalidInput(format!("{}: found call {seen}, so the PEs' gathers are out of step", what())))
            };
        }
        std::hint::spin_loop();
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(1024) {
            let waited = started.elapsed();
            if waited >= timeout {
                return Err(HaloError::HostWaitTimeout(format!("{} for {:.1} s (it posted call {seen})", what(), waited.as_secs_f64())));
            }
            if waited > Duration::from_millis(1) {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` PEs as threads of this process: created, connected, unlinked.
    fn node(n: usize, bytes: usize, timeout: Duration) -> Vec<NodeGather> {
        let made: Vec<NodeGather> = (0..n).map(|pe| NodeGather::create(pe, bytes, timeout).unwrap()).collect();
        let paths: Vec<[PathBuf; 2]> = made.iter().map(NodeGather::paths).collect();
        let all: Vec<NodeGather> = made.into_iter().map(|g| g.connect(&paths).unwrap()).collect();
        for g in &all {
            g.unlink();
        }
        for p in paths.iter().flatten() {
            assert!(!p.exists(), "{} left behind", p.display());
        }
        all
    }

    /// Message `call` of PE `pe`: its length varies from empty to beyond the initial segment.
    fn message(pe: usize, call: usize) -> Vec<u8> {
        let len = [0, 1, 7, 300, 5000, 64, 100_000, 3][(pe + call) % 8];
        (0..len).map(|i| (i * 31 + pe * 7 + call) as u8).collect()
    }

    #[test]
    fn threads_gather_every_message_across_growth_and_parities() {
        for n in [1, 2, 3, 4] {
            let gathers = node(n, 256, Duration::from_secs(20));
            std::thread::scope(|s| {
                for (pe, mut g) in gathers.into_iter().enumerate() {
                    s.spawn(move || {
                        for call in 0..40 {
                            // Every other call hands its message over: its own entry is that message.
                            let all = if call % 2 == 0 {
                                g.all_gather(&message(pe, call)).unwrap()
                            } else {
                                let mine = message(pe, call);
                                let at = mine.as_ptr();
                                let all = g.all_gather_owned(mine).unwrap();
                                assert_eq!(all[pe].as_ptr(), at, "PE {pe}'s own entry of call {call} is a copy");
                                all
                            };
                            assert_eq!(all.len(), n);
                            for (q, m) in all.iter().enumerate() {
                                assert_eq!(m, &message(q, call), "PE {pe} read PE {q}'s call {call}");
                            }
                        }
                    });
                }
            });
        }
    }

    #[test]
    fn a_missing_peer_is_a_bounded_error_that_names_it() {
        let mut gathers = node(2, 64, Duration::from_millis(50));
        let started = Instant::now();
        let e = gathers[0].all_gather(b"hello").unwrap_err().to_string();
        assert!(e.contains("PE 0 waited for PE 1") && e.contains("call 1"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // PE 1 catches up: its call 1 sees PE 0's message, which is still there.
        let all = gathers[1].all_gather(b"late").unwrap();
        assert_eq!(all, vec![b"hello".to_vec(), b"late".to_vec()]);
    }

    #[test]
    fn connecting_twice_or_out_of_range_is_refused() {
        let g = NodeGather::create(3, 64, Duration::from_secs(1)).unwrap();
        let paths = [g.paths()];
        let own = g.paths();
        let e = g.connect(&paths).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("PE 3") && e.contains("1 PEs"), "{e}");
        // Dropped unconnected: its files are gone too.
        assert!(own.iter().all(|p| !p.exists()));
    }
}
