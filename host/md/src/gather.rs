//! The first part of a search step: every rank's home coordinates and velocities back into the
//! whole system, on every process, so each can build the same new decomposition.
//!
//! - Ranks in one process: each rank's home arrays are copied to the host.
//! - One rank per PE: each PE copies its home arrays (contiguous, in local order) into every PE's
//!   symmetric gather buffers at its rank's offset (the offsets follow from the last plan, which
//!   every PE holds), with device copies through `nvshmem_ptr` (NVLink); after a barrier each PE
//!   reads the whole buffers once. Where some peer is not mapped the launcher's rendezvous carries
//!   the arrays instead (slow: files). Every PE decides which once, together.

use crate::abi::Float3;
use crate::decomp::HaloPlan;
use crate::error::{CudaContextExt, HaloError, Result};
use crate::exchange::Placement;
use crate::gpu::{CudaStream, DeviceMemory};
use crate::nvshmem::{Nvshmem, SymmetricBuffer};
use crate::system::MolecularSystem;
use std::sync::Arc;

/// The first `n` elements of a device array (synchronous).
pub fn read_prefix<T: bytemuck::Pod>(mem: &(impl DeviceMemory<T> + ?Sized), n: usize) -> Result<Vec<T>> {
    if n > mem.len() {
        return Err(HaloError::InvalidInput(format!("reading {n} elements of a buffer of {}", mem.len())));
    }
    let mut out = vec![T::zeroed(); n];
    if n == 0 {
        return Ok(out);
    }
    mem.context().bind_to_thread().during("binding the context")?;
    // SAFETY: `out` holds `n` elements and the buffer at least `n` (checked above).
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(bytemuck::cast_slice_mut::<T, u8>(&mut out), mem.device_ptr()) }
        .during("copying from the GPU")?;
    Ok(out)
}

/// Page-locked host memory for `Float3`s (as `f32` triples: cudarc's pinned slices hold its own
/// element types): device-to-host copies into it run at full speed, several times faster than
/// into ordinary (pageable) memory. Portable: usable by every context of the process.
struct Pinned(cudarc::driver::PinnedHostSlice<f32>);

impl Pinned {
    fn new(ctx: &Arc<cudarc::driver::CudaContext>, len: usize) -> Result<Self> {
        // SAFETY: the contents are written (by a copy) before they are read.
        let slice = unsafe { ctx.alloc_pinned_with_flags::<f32>(3 * len.max(1), cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE) }
            .during("allocating page-locked host memory")?;
        Ok(Self(slice))
    }

    /// The first `n` elements of `mem`, copied through this buffer (synchronous: for reads with
    /// no stream at hand).
    fn read<'a>(&'a mut self, mem: &(impl DeviceMemory<Float3> + ?Sized), n: usize) -> Result<&'a [Float3]> {
        read_fits(n, mem.len(), self.0.len() / 3)?;
        let host = self.0.as_mut_slice().during("reaching page-locked memory")?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut host[..3 * n]);
        if n > 0 {
            mem.context().bind_to_thread().during("binding the context")?;
            // SAFETY: `bytes` holds exactly `n` elements and the buffer at least `n` (checked above).
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(bytes, mem.device_ptr()) }.during("copying from the GPU")?;
        }
        Ok(bytemuck::cast_slice(&host[..3 * n]))
    }

    /// Enqueues on `stream` the copy of the first `n` elements of `mem` into this buffer, without
    /// waiting: the host must not read the buffer (nor start another copy into it) before
    /// `stream` ran the copy, and must keep the buffer alive until then ([`read_pair`] waits).
    fn enqueue(&mut self, mem: &(impl DeviceMemory<Float3> + ?Sized), n: usize, stream: &CudaStream) -> Result<()> {
        read_fits(n, mem.len(), self.0.len() / 3)?;
        if n == 0 {
            return Ok(());
        }
        // Not cudarc's wait: the slice's own event is never recorded here (halo's contexts do not
        // track events, `gpu::open`), so `as_mut_slice` orders nothing; the caller's stream
        // synchronisation does.
        let host = self.0.as_mut_slice().during("reaching page-locked memory")?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut host[..3 * n]);
        stream.context().bind_to_thread().during("binding the context")?;
        // SAFETY: `bytes` holds exactly `n` elements and the device buffer at least `n` (checked
        // above); the destination is page-locked memory owned by `self`, which the caller neither
        // reads nor frees before it synchronised `stream` (see `read_pair`).
        unsafe { cudarc::driver::result::memcpy_dtoh_async(bytes, mem.device_ptr(), stream.cu_stream()) }.during("copying from the GPU")
    }

    /// The first `n` elements, after a copy into them ran.
    fn landed(&self, n: usize) -> Result<&[Float3]> {
        let host = self.0.as_slice().during("reaching page-locked memory")?;
        host.get(..3 * n)
            .map(bytemuck::cast_slice)
            .ok_or_else(|| HaloError::InvalidInput(format!("reading {n} atoms of page-locked memory for {}", host.len() / 3)))
    }
}

/// An error unless `n` elements can be read from a device buffer of `device` elements into page-
/// locked memory of `host` elements (what the GPU holds may be fewer than the plan says).
fn read_fits(n: usize, device: usize, host: usize) -> Result<()> {
    if n > device || n > host {
        return Err(HaloError::InvalidInput(format!("reading {n} atoms of a buffer of {device} through {host}")));
    }
    Ok(())
}

/// The first `n` elements of `x` and of `v` through `hx` and `hv`: both copies enqueued on
/// `stream` (idle, of their GPU), then one wait for the stream, instead of a synchronous copy
/// and a wait each. The stream is synchronised also when enqueuing the second copy failed, so no
/// copy into the page-locked memory is in flight when this returns.
fn read_pair<'a>(
    hx: &'a mut Pinned,
    hv: &'a mut Pinned,
    x: &(impl DeviceMemory<Float3> + ?Sized),
    v: &(impl DeviceMemory<Float3> + ?Sized),
    n: usize,
    stream: &CudaStream,
) -> Result<(&'a [Float3], &'a [Float3])> {
    // Both checked before anything is enqueued.
    read_fits(n, x.len().min(v.len()), (hx.0.len() / 3).min(hv.0.len() / 3))?;
    let enqueued = hx.enqueue(x, n, stream).and_then(|()| hv.enqueue(v, n, stream));
    let waited = stream.synchronize().during("waiting for the home atoms' read-back");
    enqueued?;
    waited?;
    Ok((hx.landed(n)?, hv.landed(n)?))
}

/// One local rank's home arrays on its GPU: coordinates (the exchange's `x`) and velocities, each
/// holding at least `home` elements.
pub struct HomeArrays<'a> {
    /// Global rank.
    pub rank: usize,
    /// Home atoms.
    pub home: usize,
    /// Coordinates.
    pub x: &'a dyn DeviceMemory<Float3>,
    /// Velocities.
    pub v: &'a dyn DeviceMemory<Float3>,
    /// A stream of the rank's GPU for the device copies (idle).
    pub stream: &'a CudaStream,
}

/// How this process gathers home atoms at a search step.
pub struct HomeGather {
    path: Path,
    /// Page-locked room for every atom's coordinates and velocities.
    host: [Pinned; 2],
}

enum Path {
    /// Every rank is in this process: copies to the host.
    Local,
    /// One rank per PE, copies into every PE's symmetric buffers.
    Peers {
        /// This PE.
        nvshmem: Arc<Nvshmem>,
        /// Coordinates of every atom, by rank, in local order.
        x: SymmetricBuffer<Float3>,
        /// Velocities, likewise.
        v: SymmetricBuffer<Float3>,
    },
    /// One rank per PE, some peer not mapped: the launcher's rendezvous.
    Rendezvous,
}

impl HomeGather {
    /// The gather for `placement` and a system of `atoms` atoms. Collective across PEs (symmetric
    /// allocation, and one all-gather, tagged `<tag>gather-path`, to agree on the path).
    pub fn new(placement: &Placement, atoms: usize, tag: &str) -> Result<Self> {
        let ctx = match placement {
            Placement::Local(modules) | Placement::LocalDirect(modules) => {
                modules.first().ok_or_else(|| HaloError::InvalidInput("no GPU module".into()))?.context().clone()
            }
            Placement::Pe { module, .. } => module.context().clone(),
        };
        let host = [Pinned::new(&ctx, atoms)?, Pinned::new(&ctx, atoms)?];
        let Placement::Pe { nvshmem, .. } = placement else { return Ok(Self { path: Path::Local, host }) };
        let x = nvshmem.alloc::<Float3>(atoms)?;
        let v = nvshmem.alloc::<Float3>(atoms)?;
        let mapped = (0..nvshmem.n_pes()).all(|pe| x.peer_ptr(pe).is_some() && v.peer_ptr(pe).is_some());
        let votes = placement.all_gather(&format!("{tag}gather-path"), vec![vec![u8::from(mapped)]])?;
        let path = if votes.iter().all(|b| b.first() == Some(&1)) {
            Path::Peers { nvshmem: nvshmem.clone(), x, v }
        } else {
            tracing::warn!("md: some PE cannot map a peer's memory; search steps gather atoms through the launcher's rendezvous (slow)");
            Path::Rendezvous
        };
        Ok(Self { path, host })
    }

    /// The first `n` coordinates and velocities of one rank's arrays (idle), copied through the
    /// page-locked buffers on `stream` (a stream of their GPU, idle), with one wait: a search step
    /// that plans from the ranks' own atoms reads them so. An error, before any copy, when either
    /// array holds fewer than `n`.
    pub fn read_home(
        &mut self,
        x: &dyn DeviceMemory<Float3>,
        v: &dyn DeviceMemory<Float3>,
        n: usize,
        stream: &CudaStream,
    ) -> Result<(Vec<Float3>, Vec<Float3>)> {
        let (mut positions, mut velocities) = (Vec::new(), Vec::new());
        self.read_home_into(x, v, n, stream, &mut positions, &mut velocities)?;
        Ok((positions, velocities))
    }

    /// [`Self::read_home`] appended to `positions` and `velocities` (arrays a caller reuses).
    pub fn read_home_into(
        &mut self,
        x: &dyn DeviceMemory<Float3>,
        v: &dyn DeviceMemory<Float3>,
        n: usize,
        stream: &CudaStream,
        positions: &mut Vec<Float3>,
        velocities: &mut Vec<Float3>,
    ) -> Result<()> {
        let [hx, hv] = &mut self.host;
        let (x, v) = read_pair(hx, hv, x, v, n, stream)?;
        positions.extend_from_slice(x);
        velocities.extend_from_slice(v);
        Ok(())
    }

    /// Writes every rank's home coordinates and velocities into `system` (positions and
    /// velocities by global id), from `mine` (this process's ranks, all idle) and `plan` (the
    /// layout they hold: home atoms first, `global_ids`). Collective across PEs; `tag` names the
    /// rendezvous all-gather where one is needed (unique per call).
    pub fn gather(&mut self, placement: &Placement, plan: &HaloPlan, mine: &[HomeArrays<'_>], system: &mut MolecularSystem, tag: &str) -> Result<()> {
        for m in mine {
            if plan.ranks.get(m.rank).is_none_or(|r| r.home_atoms != m.home) {
                return Err(HaloError::InvalidInput(format!("rank {} holds {} home atoms, not what the plan says", m.rank, m.home)));
            }
        }
        let offsets: Vec<usize> = plan.ranks.iter().scan(0, |at, r| Some(std::mem::replace(at, *at + r.home_atoms))).collect();
        let place = |system: &mut MolecularSystem, rank: usize, x: &[Float3], v: &[Float3]| {
            for ((&g, &p), &u) in plan.ranks[rank].global_ids.iter().zip(x).zip(v) {
                system.positions[g as usize] = p;
                system.velocities[g as usize] = u;
            }
        };
        let [hx, hv] = &mut self.host;
        match &self.path {
            Path::Local => {
                for m in mine {
                    let (x, v) = read_pair(hx, hv, m.x, m.v, m.home, m.stream)?;
                    place(system, m.rank, x, v);
                }
            }
            Path::Peers { nvshmem, x, v } => {
                let total = offsets.last().map_or(0, |o| o + plan.ranks.last().map_or(0, |r| r.home_atoms));
                if total > x.len() {
                    return Err(HaloError::InvalidInput(format!("{total} home atoms but gather buffers of {}", x.len())));
                }
                for m in mine {
                    let bytes = m.home * size_of::<Float3>();
                    for pe in 0..nvshmem.n_pes() {
                        for (dst, src) in [(x, m.x), (v, m.v)] {
                            let at = dst.peer_ptr(pe).ok_or_else(|| HaloError::InvalidInput(format!("PE {pe} is not mapped")))?;
                            if bytes > 0 {
                                // SAFETY: the source holds `home` elements; the destination is the
                                // peer's symmetric buffer of `atoms` elements, and this rank's
                                // range ends at offset + home <= total <= atoms (checked above).
                                unsafe {
                                    cudarc::driver::sys::cuMemcpyAsync(
                                        at + (offsets[m.rank] * size_of::<Float3>()) as u64,
                                        src.device_ptr(),
                                        bytes,
                                        m.stream.cu_stream(),
                                    )
                                }
                                .result()
                                .during("copying home atoms into a peer's gather buffer")?;
                            }
                        }
                    }
                    m.stream.synchronize().during("waiting for the gather copies")?;
                }
                // Every PE's copies into this PE's buffers are complete (each synchronised its
                // stream before the barrier).
                nvshmem.barrier_all()?;
                let (all_x, all_v) = (hx.read(x, total)?, hv.read(v, total)?);
                for (rank, r) in plan.ranks.iter().enumerate() {
                    let range = offsets[rank]..offsets[rank] + r.home_atoms;
                    place(system, rank, &all_x[range.clone()], &all_v[range]);
                }
                // No PE writes these buffers again before this read is done: the next writes come
                // at the next search, after the exchange's replan (or rebuild) of this one, which
                // is fenced by a barrier that this PE enters only after this read (why a search
                // through this gather keeps `ReplanFence::Barrier`: `run.rs`, `replan_fence`).
            }
            Path::Rendezvous => {
                let bytes = mine
                    .iter()
                    .map(|m| {
                        let (x, v) = (read_prefix(m.x, m.home)?, read_prefix(m.v, m.home)?);
                        let mut b = bytemuck::cast_slice::<Float3, u8>(&x).to_vec();
                        b.extend_from_slice(bytemuck::cast_slice(&v));
                        Ok(b)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let all = placement.all_gather(tag, bytes)?;
                for (rank, b) in all.iter().enumerate() {
                    let n = plan.ranks.get(rank).map_or(0, |r| r.home_atoms);
                    if b.len() != 2 * n * size_of::<Float3>() {
                        return Err(HaloError::InvalidInput(format!("rank {rank} sent {} bytes for {n} home atoms", b.len())));
                    }
                    let all: Vec<Float3> = bytemuck::pod_collect_to_vec(b);
                    place(system, rank, &all[..n], &all[n..]);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_back_fits_both_the_device_buffer_and_the_page_locked_memory() {
        assert!(read_fits(0, 0, 0).is_ok(), "nothing to read");
        assert!(read_fits(22_500, 28_125, 45_000).is_ok());
        assert!(read_fits(45_000, 45_000, 45_000).is_ok(), "exactly full");
        // The GPU holds fewer atoms than the plan says.
        let e = read_fits(22_501, 22_500, 45_000).unwrap_err().to_string();
        assert!(e.contains("reading 22501 atoms of a buffer of 22500"), "{e}");
        // More than the page-locked memory holds (a plan of more atoms than the system).
        assert!(read_fits(45_001, 60_000, 45_000).is_err());
    }
}
