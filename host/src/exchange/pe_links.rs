//! The host-driven transports between NVSHMEM PEs of one node ([`super::host_driven`]): peers'
//! buffers through `nvshmem_ptr`, CUDA IPC events for direct-copy, and a shared-memory
//! [`Mailbox`] for the host handshakes.
//!
//! Set-up ([`PeLinks::setup`]) is collective and never fails on one PE alone: each PE creates its
//! events (`CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`, two per channel for step parity) and
//! its inbox, publishes the IPC handles, the inbox's path and the machine's boot id in a small
//! symmetric buffer, then opens its neighbours' (the ranks it sends to or receives from), and
//! every PE reads every PE's verdict before any of them uses the links. If anything fails anywhere
//! (a PE on another node, no IPC, no `/dev/shm`), every PE gets the same reason and the staged and
//! direct-copy transports report it from `check_transport` instead of running.

use super::Element;
use super::host_driven::{Channel, Links};
use super::mailbox::Mailbox;
use super::memory::{Mem, MemoryKind};
use super::rank::{PeerView, RankExchange};
use crate::desc::RankHalo;
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaContext, CudaStream, DeviceMemory};
use crate::nvshmem::Nvshmem;
use cudarc::driver::sys;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS` (not a value of cudarc's flag enum).
const IPC_EVENT_FLAGS: u32 = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32 | sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32;

/// An event of this process or one opened from another process's handle; destroyed on drop.
struct Event {
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

impl Event {
    fn create(ctx: &Arc<CudaContext>) -> Result<Self> {
        ctx.bind_to_thread().during("binding the context")?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one event handle; the flags are a valid combination for IPC.
        unsafe { sys::cuEventCreate(&mut raw, IPC_EVENT_FLAGS) }.result().during("creating an interprocess event")?;
        Ok(Self { raw, ctx: ctx.clone() })
    }

    fn open(ctx: &Arc<CudaContext>, handle: [u8; 64]) -> Result<Self> {
        ctx.bind_to_thread().during("binding the context")?;
        let mut raw = std::ptr::null_mut();
        let h = sys::CUipcEventHandle_st { reserved: handle.map(|b| b as std::ffi::c_char) };
        // SAFETY: writes one event handle; the handle came from another process's cuIpcGetEventHandle.
        unsafe { sys::cuIpcOpenEventHandle(&mut raw, h) }.result().during("opening a peer's interprocess event")?;
        Ok(Self { raw, ctx: ctx.clone() })
    }

    fn handle(&self) -> Result<[u8; 64]> {
        let mut h = sys::CUipcEventHandle_st { reserved: [0; 64] };
        // SAFETY: the event was created with CU_EVENT_INTERPROCESS.
        unsafe { sys::cuIpcGetEventHandle(&mut h, self.raw) }.result().during("exporting an interprocess event")?;
        Ok(h.reserved.map(|c| c as u8))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: created or opened once, destroyed once.
        self.ctx.record_err(unsafe { sys::cuEventDestroy_v2(self.raw) }.result());
    }
}

/// Two events of one channel, by step parity.
type EventPair = [Event; 2];

/// Of one event, by parity: the step of its last record and who was to wait for it.
type Recorded = [Option<(u64, Vec<usize>)>; 2];

/// This PE's links to its peers.
pub struct PeLinks {
    me: usize,
    pulses: usize,
    views: Vec<Option<PeerView>>,
    /// `own[event][parity]`.
    own: Vec<EventPair>,
    /// `imported[pe][event][parity]`, for the neighbours.
    imported: Vec<Option<Vec<EventPair>>>,
    /// `recorded[event][parity]`: the step of the last record and who was to wait for it.
    recorded: Vec<Recorded>,
    mailbox: Mailbox,
}

// SAFETY: the raw event handles are plain driver handles, usable from any thread with the
// context bound (every use binds it); the mailbox is shared memory accessed through atomics.
unsafe impl Send for PeLinks {}

/// Fixed offsets of the published record (bytes).
mod blob {
    pub const MAGIC: u64 = u64::from_le_bytes(*b"HALOLNK1");
    pub const OK: usize = 8;
    pub const AGREED: usize = 16;
    pub const BOOT_ID: usize = 24;
    pub const BOOT_ID_LEN: usize = 64;
    pub const PATH_LEN: usize = BOOT_ID + BOOT_ID_LEN;
    pub const PATH: usize = PATH_LEN + 8;
    pub const PATH_MAX: usize = 512;
    pub const HANDLES: usize = PATH + PATH_MAX;

    pub fn size(events: usize) -> usize {
        HANDLES + 2 * 64 * events
    }
}

/// This PE's published record.
fn encode(ok: bool, boot: &str, path: &str, handles: &[[u8; 64]], events: usize) -> Vec<u8> {
    let mut b = vec![0u8; blob::size(events)];
    b[..8].copy_from_slice(&blob::MAGIC.to_le_bytes());
    b[blob::OK..blob::OK + 8].copy_from_slice(&(ok as u64).to_le_bytes());
    let boot = &boot.as_bytes()[..boot.len().min(blob::BOOT_ID_LEN)];
    b[blob::BOOT_ID..blob::BOOT_ID + boot.len()].copy_from_slice(boot);
    let path = path.as_bytes();
    if ok && path.len() <= blob::PATH_MAX {
        b[blob::PATH_LEN..blob::PATH_LEN + 8].copy_from_slice(&(path.len() as u64).to_le_bytes());
        b[blob::PATH..blob::PATH + path.len()].copy_from_slice(path);
        for (i, h) in handles.iter().enumerate() {
            b[blob::HANDLES + 64 * i..blob::HANDLES + 64 * (i + 1)].copy_from_slice(h);
        }
    }
    b
}

/// A peer's published record, decoded.
#[derive(Debug)]
struct Published {
    ok: bool,
    boot: String,
    path: PathBuf,
    handles: Vec<[u8; 64]>,
}

fn decode(b: &[u8], events: usize) -> std::result::Result<Published, String> {
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
    if b.len() < blob::size(events) || word(0) != blob::MAGIC {
        return Err("its link record is not there (not a halo PE of this run?)".into());
    }
    let boot = String::from_utf8_lossy(&b[blob::BOOT_ID..blob::BOOT_ID + blob::BOOT_ID_LEN]).trim_end_matches('\0').to_string();
    let len = (word(blob::PATH_LEN) as usize).min(blob::PATH_MAX);
    let path = PathBuf::from(String::from_utf8_lossy(&b[blob::PATH..blob::PATH + len]).into_owned());
    let handles = (0..2 * events).map(|i| b[blob::HANDLES + 64 * i..blob::HANDLES + 64 * (i + 1)].try_into().unwrap_or([0; 64])).collect();
    Ok(Published { ok: word(blob::OK) == 1, boot, path, handles })
}

/// Reads `bytes` bytes at device address `src` (a peer's symmetric buffer through its mapping).
fn read_device(ctx: &Arc<CudaContext>, src: u64, bytes: usize) -> Result<Vec<u8>> {
    let mut v = vec![0u8; bytes];
    ctx.bind_to_thread().during("binding the context")?;
    // SAFETY: `src` maps `bytes` bytes of a live symmetric buffer of the same size on every PE.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut v, src) }.during("reading a peer's link record")?;
    Ok(v)
}

/// The PEs `me` sends to or receives from.
fn neighbours(halo: &RankHalo) -> Vec<usize> {
    let mut n: Vec<usize> = halo.pulses.iter().flat_map(|p| [p.send_rank, p.recv_rank]).collect();
    n.sort_unstable();
    n.dedup();
    n
}

/// Bytes of the symmetric record [`PeLinks::setup`] publishes for `pulses` pulses (allocated for
/// the set-up only; [`super::heap`] counts it in a PE's footprint).
pub fn record_bytes(pulses: usize) -> u64 {
    blob::size(Channel::events(pulses)) as u64
}

/// Whether links set up for `old` serve `new` as they are (a replan): the same number of PEs,
/// and every rank has the same pulse count (events, mailbox words) and the same neighbours
/// (opened events and inboxes). Every PE has every halo, so every PE decides alike.
pub fn same_links(old: &[RankHalo], new: &[RankHalo]) -> bool {
    old.len() == new.len() && old.iter().zip(new).all(|(a, b)| a.pulses.len() == b.pulses.len() && neighbours(a) == neighbours(b))
}

impl PeLinks {
    /// Sets up this PE's links (collective: every PE calls it, in the same order as its other
    /// collective calls). `Ok(Err(reason))` when the host-driven transports cannot run here: the
    /// same outcome on every PE.
    pub fn setup<T: Element>(nvshmem: &Arc<Nvshmem>, rank: &RankExchange<T>, halos: &[RankHalo]) -> Result<std::result::Result<Self, String>> {
        let (me, n) = (nvshmem.my_pe(), nvshmem.n_pes());
        let ctx = rank.context().clone();
        let pulses = halos[me].pulses.len();
        let events = Channel::events(pulses);
        // Charged against the heap budget like the exchange's buffers (and given back on drop).
        let record_mem = Mem::<u8>::new(&MemoryKind::Symmetric(nvshmem.clone()), &ctx, blob::size(events))?;
        let Mem::Symmetric(buf) = &record_mem else {
            return Err(HaloError::InvalidInput("the link record must be symmetric".into()));
        };
        let all_mapped = (0..n).all(|pe| buf.peer_ptr(pe).is_some());
        let local = Self::create_own(me, n, pulses, &ctx, all_mapped);
        let boot = crate::node::boot_id();
        let record = match &local {
            Ok((_, mailbox, handles)) => encode(true, &boot, &mailbox.path().to_string_lossy(), handles, events),
            Err(_) => encode(false, &boot, "", &[], events),
        };
        buf.copy_from_host(&record)?;
        nvshmem.barrier_all()?;
        // Round 2: open the neighbours' inboxes and events.
        let mut linked = local.and_then(|(own, mailbox, _)| Self::open_peers(nvshmem, rank, halos, buf, own, mailbox, &boot));
        let ok = linked.is_ok() as u64;
        ctx.bind_to_thread().during("binding the context")?;
        // SAFETY: 8 bytes inside this PE's own symmetric record.
        unsafe { cudarc::driver::result::memcpy_htod_sync(buf.device_ptr() + blob::AGREED as u64, &ok.to_le_bytes()) }
            .during("publishing the link verdict")?;
        nvshmem.barrier_all()?;
        // Round 3: every PE's verdict.
        let mut failed = Vec::new();
        for pe in 0..n {
            match buf.peer_ptr(pe) {
                Some(p) if all_mapped => {
                    let v = read_device(&ctx, p + blob::AGREED as u64, 8)?;
                    if u64::from_le_bytes(v.try_into().unwrap_or_default()) != 1 {
                        failed.push(pe);
                    }
                }
                _ => failed.push(pe),
            }
        }
        nvshmem.barrier_all()?; // nobody frees or rewrites the records before all have read them
        drop(record_mem);
        if let Ok(l) = &mut linked {
            l.mailbox.unlink(); // every peer has opened it (before the second barrier)
        }
        Ok(match (linked, failed.is_empty()) {
            (Ok(l), true) => Ok(l),
            (Err(why), _) => Err(format!("PE {me}: {why}")),
            (Ok(_), false) => Err(format!("the host-driven links could not be set up on PE(s) {failed:?} (see their messages)")),
        })
    }

    /// This PE's events (and their IPC handles, in `[event][parity]` order) and inbox.
    #[allow(clippy::type_complexity)]
    fn create_own(
        me: usize,
        n: usize,
        pulses: usize,
        ctx: &Arc<CudaContext>,
        all_mapped: bool,
    ) -> std::result::Result<(Vec<[Event; 2]>, Mailbox, Vec<[u8; 64]>), String> {
        if !all_mapped {
            return Err("not every PE's memory is mapped into this one (PEs on several nodes?): staged and direct-copy need one node".into());
        }
        let own = (0..Channel::events(pulses))
            .map(|_| Ok([Event::create(ctx)?, Event::create(ctx)?]))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| format!("no interprocess events: {e}"))?;
        let handles =
            own.iter().flat_map(|pair| pair.iter().map(Event::handle)).collect::<Result<Vec<_>>>().map_err(|e| format!("no IPC handles: {e}"))?;
        let mailbox = Mailbox::create(me, n, Channel::slots(pulses)).map_err(|e| e.to_string())?;
        Ok((own, mailbox, handles))
    }

    fn open_peers<T: Element>(
        nvshmem: &Nvshmem,
        rank: &RankExchange<T>,
        halos: &[RankHalo],
        buf: &crate::nvshmem::SymmetricBuffer<u8>,
        own: Vec<EventPair>,
        mut mailbox: Mailbox,
        boot: &str,
    ) -> std::result::Result<Self, String> {
        let (me, n) = (nvshmem.my_pe(), halos.len());
        let ctx = rank.context();
        let pulses = halos[me].pulses.len();
        let events = Channel::events(pulses);
        let local = rank.local_view();
        let views = (0..n).map(|pe| local.translated(|addr| nvshmem.peer_ptr(addr, pe))).collect();
        let mut imported: Vec<Option<Vec<EventPair>>> = (0..n).map(|_| None).collect();
        for pe in neighbours(&halos[me]).into_iter().filter(|&pe| pe != me) {
            let src = buf.peer_ptr(pe).ok_or_else(|| format!("PE {pe} is not mapped"))?;
            let bytes = read_device(ctx, src, blob::size(events)).map_err(|e| e.to_string())?;
            let p = decode(&bytes, events).map_err(|e| format!("PE {pe}: {e}"))?;
            if !p.ok {
                return Err(format!("PE {pe} could not create its events or mailbox (see its message)"));
            }
            if p.boot != boot {
                return Err(format!(
                    "PE {pe} runs on another machine (boot id {} here, {} there): staged and direct-copy need one node",
                    boot, p.boot
                ));
            }
            mailbox.open_peer(pe, &p.path).map_err(|e| e.to_string())?;
            let opened = (0..events)
                .map(|e| Ok([Event::open(ctx, p.handles[2 * e])?, Event::open(ctx, p.handles[2 * e + 1])?]))
                .collect::<Result<Vec<_>>>()
                .map_err(|e| format!("PE {pe}'s events: {e}"))?;
            imported[pe] = Some(opened);
        }
        Ok(Self { me, pulses, views, own, imported, recorded: (0..events).map(|_| [None, None]).collect(), mailbox })
    }

    /// Forgets every record and clears this PE's inbox: only while no PE runs the exchange
    /// (between the barriers of a collective reset).
    pub fn reset(&mut self) {
        self.mailbox.clear();
        for r in &mut self.recorded {
            *r = [None, None];
        }
    }

    fn index(&self, ch: Channel) -> Result<usize> {
        ch.event_index(self.pulses).ok_or_else(|| HaloError::InvalidInput(format!("{ch:?} is not an event")))
    }
}

impl Links for PeLinks {
    fn view(&self, peer: usize) -> Result<PeerView> {
        self.views.get(peer).copied().flatten().ok_or_else(|| HaloError::InvalidInput(format!("PE {peer} is not mapped into PE {}", self.me)))
    }

    fn record(&mut self, _: usize, ch: Channel, seq: u64, stream: &CudaStream, waiters: &[usize], timeout: Duration) -> Result<()> {
        let (e, parity) = (self.index(ch)?, (seq & 1) as usize);
        let ack = ch.ack_slot(self.pulses).unwrap_or_default();
        // The event is reused: every waiter of its previous record must have enqueued its wait.
        if let Some((prev, ws)) = &self.recorded[e][parity] {
            for &w in ws {
                self.mailbox.wait(w, ack, *prev, timeout, || format!("wait for PE {}'s event of step {prev} ({})", self.me, ch.describe(*prev)))?;
            }
        }
        // SAFETY: a live event of this context, recorded on a stream of this context.
        unsafe { sys::cuEventRecord(self.own[e][parity].raw, stream.cu_stream()) }.result().during("recording an interprocess event")?;
        for &w in waiters {
            self.mailbox.post(w, ch.post_slot(self.pulses), seq)?;
        }
        self.recorded[e][parity] = Some((seq, waiters.to_vec()));
        Ok(())
    }

    fn wait_event(&mut self, _: usize, owner: usize, ch: Channel, seq: u64, stream: &CudaStream, timeout: Duration) -> Result<()> {
        let (e, parity) = (self.index(ch)?, (seq & 1) as usize);
        self.mailbox.wait(owner, ch.post_slot(self.pulses), seq, timeout, || ch.describe(seq))?;
        let event = if owner == self.me {
            &self.own[e][parity]
        } else {
            let events =
                self.imported[owner].as_ref().ok_or_else(|| HaloError::InvalidInput(format!("PE {owner} is not a neighbour of PE {}", self.me)))?;
            &events[e][parity]
        };
        // SAFETY: a live event (own, or opened from the owner's handle) and a stream of this context.
        unsafe { sys::cuStreamWaitEvent(stream.cu_stream(), event.raw, 0) }.result().during("waiting for a peer's interprocess event")?;
        self.mailbox.post(owner, ch.ack_slot(self.pulses).unwrap_or_default(), seq)
    }

    fn post(&self, _: usize, to: usize, ch: Channel, seq: u64) -> Result<()> {
        self.mailbox.post(to, ch.post_slot(self.pulses), seq)
    }

    fn wait_post(&self, _: usize, from: usize, ch: Channel, seq: u64, timeout: Duration) -> Result<()> {
        self.mailbox.wait(from, ch.post_slot(self.pulses), seq, timeout, || ch.describe(seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_garbage() {
        let handles: Vec<[u8; 64]> = (0..6).map(|i| [i as u8 + 1; 64]).collect();
        let b = encode(true, "boot-1", "/dev/shm/halo-mailbox-1", &handles, 3);
        assert_eq!(b.len(), blob::size(3));
        let p = decode(&b, 3).unwrap();
        assert!(p.ok);
        assert_eq!((p.boot.as_str(), p.path.to_str()), ("boot-1", Some("/dev/shm/halo-mailbox-1")));
        assert_eq!(p.handles, handles);
        let failed = decode(&encode(false, "boot-1", "", &[], 3), 3).unwrap();
        assert!(!failed.ok && failed.handles.iter().all(|h| *h == [0; 64]));
        assert!(decode(&vec![0; blob::size(3)], 3).unwrap_err().contains("not there"));
        assert!(decode(&b[..10], 3).is_err());
    }

    #[test]
    fn a_replan_keeps_the_links_only_for_the_same_pulses_and_neighbours() {
        use crate::exchange::synthetic::{self, SyntheticShape};
        let shape = |grid, pulses, home_atoms| SyntheticShape { grid, pulses_per_dim: pulses, home_atoms, send_fraction: 0.4, box_len: 3.0 };
        let a = synthetic::halos(shape([4, 1, 1], 1, 40), 1);
        // Another decomposition of the same grid: other atoms, the same pulses and neighbours.
        assert!(same_links(&a, &synthetic::halos(shape([4, 1, 1], 1, 60), 2)));
        assert!(!same_links(&a, &synthetic::halos(shape([4, 1, 1], 2, 40), 1)), "another pulse count");
        assert!(!same_links(&a, &synthetic::halos(shape([2, 2, 1], 1, 40), 1)), "other neighbours");
        assert!(!same_links(&a, &a[..3]), "another PE count");
        assert!(record_bytes(2) > record_bytes(1) && record_bytes(1) >= blob::HANDLES as u64);
    }

    #[test]
    fn neighbours_are_the_pulses_peers() {
        use crate::exchange::synthetic::{self, SyntheticShape};
        let h = synthetic::halos(SyntheticShape { grid: [2, 2, 1], pulses_per_dim: 1, home_atoms: 20, send_fraction: 0.5, box_len: 3.0 }, 1);
        for (r, halo) in h.iter().enumerate() {
            let n = neighbours(halo);
            assert!(!n.contains(&r) && n.len() == 2, "rank {r}: {n:?}");
        }
    }
}
