//! An all-gather of small host data that keeps its buffers from one call to the next, for
//! collectives that repeat every few milliseconds (an MD run's search steps). [`Nvshmem::all_gather_bytes`]
//! allocates and frees symmetric memory on every call (each a collective with its own barrier); this one
//! sets up once and grows only when a message does not fit.
//!
//! Two paths, chosen once by [`KeptGather::new`] and the same on every PE:
//! - **node** (every PE on one machine, the default there): files in `/dev/shm` mapped by every PE
//!   ([`super::node_gather`]): a copy in, one release store, a spin on each peer's word, copies out.
//! - **symmetric** (PEs on several nodes, or `HALO_KEPT_GATHER=symmetric`): symmetric buffers.
//!   Each PE owns a slot of `slot` bytes in every PE's destination buffer: an 8-byte length, then
//!   the message. A PE whose message does not fit writes its length alone; after the barrier every
//!   PE sees that length, so all of them grow together (a collective reallocation, the same on
//!   every PE) and gather again. Two destination buffers alternate: a PE may put the next gather's
//!   message while a slower peer still reads this one, but not the one after (that needs the next
//!   barrier, which the peer enters only after reading). One put per PE and one barrier a call.
//!
//! `HALO_KEPT_GATHER` = `auto` (default: node when every PE shares this machine's boot id and made
//! its segments, else symmetric), `node` (an error where it cannot run) or `symmetric`.

#[cfg(doc)]
use super::GatherPath;
use super::node_gather::NodeGather;
use super::{Nvshmem, SymmetricBuffer};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::DeviceMemory;
use crate::watchdog::steps;
use std::path::PathBuf;
use std::sync::Arc;

/// Bytes of the length word before each message.
const HEADER: usize = 8;

/// Bytes read from the start of every slot in one copy after the barrier: the length word and the
/// whole of a short message (a safe point's word, a migration), so most rounds read each slot once.
const PREFIX: usize = 16 << 10;

/// The environment variable that picks the path (see the module docs).
pub const ENV_KEPT_GATHER: &str = "HALO_KEPT_GATHER";

/// Which path [`KeptGather::new`] may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatherRoute {
    /// Shared memory when every PE is on this machine, else symmetric buffers.
    Auto,
    /// Shared memory, or an error.
    Node,
    /// Symmetric buffers.
    Symmetric,
}

impl GatherRoute {
    /// From [`ENV_KEPT_GATHER`] (unset: [`Self::Auto`]); anything else is an error naming the
    /// choices.
    pub fn from_env() -> Result<Self> {
        Self::parse(std::env::var(ENV_KEPT_GATHER).ok().as_deref())
    }

    fn parse(value: Option<&str>) -> Result<Self> {
        match value.map(str::trim) {
            None | Some("" | "auto") => Ok(Self::Auto),
            Some("node") => Ok(Self::Node),
            Some("symmetric") => Ok(Self::Symmetric),
            Some(other) => Err(HaloError::InvalidInput(format!("{ENV_KEPT_GATHER}={other}: use auto, node or symmetric"))),
        }
    }
}

/// Buffers kept for repeated all-gathers (see the module docs). Every PE must make the same calls
/// in the same order, like any collective; drop it on every PE at the same point (symmetric
/// buffers are freed collectively).
pub struct KeptGather {
    path: Path,
}

enum Path {
    Node(NodeGather),
    Symmetric(Symmetric),
}

impl KeptGather {
    /// Buffers for messages of up to `bytes` bytes per PE (grown when one is longer), on the path
    /// [`GatherRoute::from_env`] allows. Collective.
    pub fn new(nvshmem: &Arc<Nvshmem>, bytes: usize) -> Result<Self> {
        let route = GatherRoute::from_env()?;
        if route != GatherRoute::Symmetric {
            match node_gather(nvshmem, bytes)? {
                Ok(g) => return Ok(Self { path: Path::Node(g) }),
                Err(why) if route == GatherRoute::Node => {
                    return Err(HaloError::InvalidInput(format!("{ENV_KEPT_GATHER}=node: {why}; unset it or use symmetric")));
                }
                Err(why) => tracing::debug!("kept all-gathers through symmetric buffers: {why}"),
            }
        }
        Ok(Self { path: Path::Symmetric(Symmetric::new(nvshmem, bytes)?) })
    }

    /// Whether the gathers go through shared memory on this node.
    pub fn on_node(&self) -> bool {
        matches!(self.path, Path::Node(_))
    }

    /// Every PE's `mine`, indexed by PE. Collective.
    pub fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        match &mut self.path {
            Path::Node(g) => g.all_gather(mine),
            Path::Symmetric(g) => g.all_gather(mine),
        }
    }

    /// [`Self::all_gather`] of a message this PE hands over: on the node path its own entry of the
    /// result is `mine` itself, not a copy (the symmetric path reads every entry back).
    pub fn all_gather_owned(&mut self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        match &mut self.path {
            Path::Node(g) => g.all_gather_owned(mine),
            Path::Symmetric(g) => g.all_gather(&mine),
        }
    }
}

/// The node path for every PE, or why not (the same answer on every PE). Collective: two
/// all-gathers, the first of each PE's machine and segment files, the second of whether it could
/// open every peer's; each PE removes its files after the second, when every PE has opened them.
fn node_gather(nvshmem: &Arc<Nvshmem>, bytes: usize) -> Result<std::result::Result<NodeGather, String>> {
    let (me, n) = (nvshmem.my_pe(), nvshmem.n_pes());
    let made = NodeGather::create(me, bytes, nvshmem.timeout);
    let boot = crate::node::boot_id();
    let record = match &made {
        Ok(g) => encode(&boot, Some(&g.paths())),
        Err(_) => encode(&boot, None),
    };
    let records = nvshmem.all_gather_bytes(&record)?;
    let decoded: Vec<(String, Option<[PathBuf; 2]>)> = records.iter().map(|r| decode(r)).collect();
    let why = if let Err(e) = &made {
        Some(format!("PE {me} could not make its shared-memory segments: {e}"))
    } else if let Some(pe) = decoded.iter().position(|(b, _)| *b != boot) {
        Some(format!("PE {pe} runs on another machine than PE {me}"))
    } else {
        decoded.iter().position(|(_, p)| p.is_none()).map(|pe| format!("PE {pe} could not make its shared-memory segments"))
    };
    let connected = match (why, made) {
        (None, Ok(g)) => {
            let paths: Vec<[PathBuf; 2]> = decoded.into_iter().filter_map(|(_, p)| p).collect();
            if paths.len() == n {
                g.connect(&paths).map_err(|e| format!("PE {me} could not open its peers' segments: {e}"))
            } else {
                Err("a PE's record was lost".into())
            }
        }
        (Some(why), _) => Err(why),
        (None, Err(e)) => Err(e.to_string()),
    };
    // Everyone's verdict: the node path only if every PE connected (this is also the barrier after
    // which the files may go).
    let verdicts = nvshmem.all_gather_u64(u64::from(connected.is_ok()))?;
    if let Ok(g) = &connected {
        g.unlink();
    }
    match (connected, verdicts.iter().position(|&v| v != 1)) {
        (Ok(g), None) => Ok(Ok(g)),
        (Ok(_), Some(pe)) => Ok(Err(format!("PE {pe} could not open its peers' shared-memory segments"))),
        (Err(why), _) => Ok(Err(why)),
    }
}

/// A PE's record for [`node_gather`]: its boot id, then its two segment paths (none when it has
/// no segments), newline-separated.
fn encode(boot: &str, paths: Option<&[PathBuf; 2]>) -> Vec<u8> {
    let mut s = boot.replace('\n', " ");
    if let Some([a, b]) = paths {
        s = format!("{s}\n{}\n{}", a.display(), b.display());
    }
    s.into_bytes()
}

fn decode(record: &[u8]) -> (String, Option<[PathBuf; 2]>) {
    let text = String::from_utf8_lossy(record);
    let mut lines = text.split('\n');
    let boot = lines.next().unwrap_or_default().to_string();
    let paths = match (lines.next(), lines.next()) {
        (Some(a), Some(b)) => Some([PathBuf::from(a), PathBuf::from(b)]),
        _ => None,
    };
    (boot, paths)
}

/// The symmetric path (see the module docs).
struct Symmetric {
    nvshmem: Arc<Nvshmem>,
    /// Bytes per PE in the destination buffers (length word included).
    slot: usize,
    /// This PE's outgoing slot.
    src: SymmetricBuffer<u8>,
    /// Every PE's slots, twice (alternating calls).
    dst: [SymmetricBuffer<u8>; 2],
    /// The destination of the next call.
    parity: usize,
}

impl Symmetric {
    /// Buffers for messages of up to `bytes` bytes per PE (grown when one is longer). Collective.
    fn new(nvshmem: &Arc<Nvshmem>, bytes: usize) -> Result<Self> {
        let slot = (bytes + HEADER).next_multiple_of(256);
        let n = nvshmem.n_pes();
        Ok(Self { nvshmem: nvshmem.clone(), slot, src: nvshmem.alloc(slot)?, dst: [nvshmem.alloc(slot * n)?, nvshmem.alloc(slot * n)?], parity: 0 })
    }

    /// The longest message that fits without growing.
    fn capacity(&self) -> usize {
        self.slot - HEADER
    }

    /// Every PE's `mine`, indexed by PE. Collective. Puts and a barrier only, so it also runs where
    /// NVSHMEM refuses its other collectives (several PEs per GPU without MPS: [`GatherPath`]).
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let nv = self.nvshmem.clone();
        let slots = self.round(mine)?;
        let longest = slots.iter().map(|s| s.len).max().unwrap_or(0);
        if longest <= self.capacity() {
            return self.read(slots);
        }
        // Someone's message did not fit: every PE saw every length, so all grow alike (new buffers
        // allocated, then the old ones freed: collectives in the same order everywhere) and gather again.
        *self = Self::new(&nv, longest + longest / 2)?;
        let slots = self.round(mine)?;
        self.read(slots)
    }

    /// One round: this PE's length (and message, when it fits) into its slot of every PE's current
    /// destination, a barrier, then the start of every PE's slot read back (its length, and all of
    /// a message of up to [`PREFIX`] bytes). Leaves `parity` at the buffer read.
    fn round(&mut self, mine: &[u8]) -> Result<Vec<Slot>> {
        let nv = &self.nvshmem;
        let (me, n) = (nv.my_pe(), nv.n_pes());
        let fits = mine.len() <= self.capacity();
        let mut out = (mine.len() as u64).to_le_bytes().to_vec();
        if fits {
            out.extend_from_slice(mine);
        }
        self.src.copy_from_host(&out)?;
        let dst = &self.dst[self.parity];
        let at = dst.device_ptr() + (me * self.slot) as u64;
        let (put, from, len) = (nv.lib.api.nvshmem_putmem, self.src.device_ptr(), out.len());
        nv.bounded(steps::GATHER, move || {
            for pe in 0..n {
                // SAFETY: `src` and `dst` are symmetric (allocated on every PE with the same sizes, the
                // allocation's barrier ensuring every PE has them); this PE's slot of `dst` holds `slot`
                // bytes and `out` at most that many; the blocking put has completed locally when it
                // returns, so `src` may be rewritten next call (if the call is abandoned, the PE is
                // unusable and the buffers are never freed).
                unsafe { put(at as *mut _, from as *const _, len, pe as i32) };
            }
        })?;
        // Every PE's puts returned before it entered the barrier: all slots are written after it.
        nv.barrier_all()?;
        // Each slot's start in one copy: its length, and the whole of a short message.
        let prefix = self.slot.min(PREFIX);
        (0..n)
            .map(|pe| {
                let mut head = vec![0u8; prefix];
                copy_out(dst, pe * self.slot, &mut head)?;
                let len = head.get(..HEADER).and_then(|w| w.try_into().ok()).map_or(0, u64::from_le_bytes) as usize;
                Ok(Slot { len, head })
            })
            .collect()
    }

    /// Every PE's message of the round just done (all fit), then the other buffer for the next call.
    fn read(&mut self, slots: Vec<Slot>) -> Result<Vec<Vec<u8>>> {
        let dst = &self.dst[self.parity];
        let all = slots
            .into_iter()
            .enumerate()
            .map(|(pe, Slot { len, mut head })| {
                let have = head.len() - HEADER;
                if len <= have {
                    head.truncate(HEADER + len);
                    head.drain(..HEADER);
                    return Ok(head);
                }
                let mut v = head.split_off(HEADER);
                v.resize(len, 0);
                copy_out(dst, pe * self.slot + HEADER + have, &mut v[have..])?;
                Ok(v)
            })
            .collect::<Result<Vec<_>>>()?;
        self.parity ^= 1;
        Ok(all)
    }
}

/// What a round read of one PE's slot: the message's length and the slot's first bytes.
struct Slot {
    len: usize,
    head: Vec<u8>,
}

/// `out.len()` bytes of `buf` from byte `offset` (synchronous).
fn copy_out(buf: &SymmetricBuffer<u8>, offset: usize, out: &mut [u8]) -> Result<()> {
    if offset + out.len() > buf.len() {
        return Err(HaloError::Nvshmem(format!("a kept all-gather read {} bytes at {offset} of a buffer of {}", out.len(), buf.len())));
    }
    if out.is_empty() {
        return Ok(());
    }
    buf.context().bind_to_thread().during("binding the context")?;
    // SAFETY: the range lies inside the buffer (checked above); `out` holds exactly that many bytes.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(out, buf.device_ptr() + offset as u64) }.during("reading a kept all-gather")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_comes_from_the_environment_value() {
        assert_eq!(GatherRoute::parse(None).unwrap(), GatherRoute::Auto);
        assert_eq!(GatherRoute::parse(Some(" auto ")).unwrap(), GatherRoute::Auto);
        assert_eq!(GatherRoute::parse(Some("node")).unwrap(), GatherRoute::Node);
        assert_eq!(GatherRoute::parse(Some("symmetric")).unwrap(), GatherRoute::Symmetric);
        let e = GatherRoute::parse(Some("shm")).unwrap_err().to_string();
        assert!(e.contains("HALO_KEPT_GATHER=shm") && e.contains("auto, node or symmetric"), "{e}");
    }

    #[test]
    fn a_node_record_round_trips_with_and_without_segments() {
        let paths = [PathBuf::from("/dev/shm/halo-gather-1-2-0-0"), PathBuf::from("/dev/shm/halo-gather-1-2-0-1")];
        assert_eq!(decode(&encode("boot-a", Some(&paths))), ("boot-a".to_string(), Some(paths)));
        assert_eq!(decode(&encode("boot-b", None)), ("boot-b".to_string(), None));
        // A newline in the boot id cannot shift the paths.
        assert_eq!(decode(&encode("x\ny", None)), ("x y".to_string(), None));
        assert_eq!(decode(b""), (String::new(), None));
    }
}
