//! An all-gather of small host data that keeps its symmetric buffers from one call to the next, for
//! collectives that repeat every few milliseconds (an MD run's search steps). [`Nvshmem::all_gather_bytes`]
//! allocates and frees symmetric memory on every call (each a collective with its own barrier); this one
//! allocates once, grows only when a message does not fit, and costs one put per PE and one barrier.
//!
//! Each PE owns a slot of `slot` bytes in every PE's destination buffer: an 8-byte length, then the
//! message. A PE whose message does not fit writes its length alone; after the barrier every PE sees
//! that length, so all of them grow together (a collective reallocation, the same on every PE) and
//! gather again. Two destination buffers alternate: a PE may put the next gather's message while a
//! slower peer still reads this one, but not the one after (that needs the next barrier, which the
//! peer enters only after reading).

#[cfg(doc)]
use super::GatherPath;
use super::{Nvshmem, SymmetricBuffer};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::DeviceMemory;
use crate::watchdog::{self, steps};
use std::sync::Arc;

/// Bytes of the length word before each message.
const HEADER: usize = 8;

/// Bytes read from the start of every slot in one copy after the barrier: the length word and the
/// whole of a short message (a safe point's word, a migration), so most rounds read each slot once.
const PREFIX: usize = 16 << 10;

/// Symmetric buffers kept for repeated all-gathers (see the module docs). Every PE must make the
/// same calls in the same order, like any collective; drop it on every PE at the same point (its
/// buffers are freed collectively).
pub struct KeptGather {
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

impl KeptGather {
    /// Buffers for messages of up to `bytes` bytes per PE (grown when one is longer). Collective.
    pub fn new(nvshmem: &Arc<Nvshmem>, bytes: usize) -> Result<Self> {
        let slot = (bytes + HEADER).next_multiple_of(256);
        let n = nvshmem.n_pes();
        Ok(Self { nvshmem: nvshmem.clone(), slot, src: nvshmem.alloc(slot)?, dst: [nvshmem.alloc(slot * n)?, nvshmem.alloc(slot * n)?], parity: 0 })
    }

    /// The longest message that fits without growing.
    pub fn capacity(&self) -> usize {
        self.slot - HEADER
    }

    /// Every PE's `mine`, indexed by PE. Collective. Puts and a barrier only, so it also runs where
    /// NVSHMEM refuses its other collectives (several PEs per GPU without MPS: [`GatherPath`]).
    pub fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
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
        nv.ctx.bind_to_thread().during("binding the context")?;
        watchdog::bounded(steps::GATHER, nv.timeout, || {
            for pe in 0..n {
                // SAFETY: `src` and `dst` are symmetric (allocated on every PE with the same sizes, the
                // allocation's barrier ensuring every PE has them); this PE's slot of `dst` holds `slot`
                // bytes and `out` at most that many; the blocking put has completed locally when it
                // returns, so `src` may be rewritten next call.
                unsafe { (nv.lib.api.nvshmem_putmem)(at as *mut _, self.src.device_ptr() as *const _, out.len(), pe as i32) };
            }
        });
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
