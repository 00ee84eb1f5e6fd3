//! Small collectives between PEs over the symmetric heap, for the benchmark's and the exchange
//! check's decisions (every PE must take the same), gathering times, and broadcasting NCCL's
//! unique id. Through the symmetric heap when every PE is mapped into every other (one node, any
//! launcher); through `halo launch`'s rendezvous when they are not (NVSHMEM_DISABLE_P2P=1, the put
//! path through a remote transport).

use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::DeviceMemory;
use crate::nvshmem::{Nvshmem, SymmetricBuffer};
use std::sync::Arc;

/// Small collectives between the PEs: every PE writes its values into a symmetric buffer and
/// everyone reads everyone's through `nvshmem_ptr` when every peer is mapped (one node); when
/// they are not, through `halo launch`'s rendezvous instead.
pub struct PeComm {
    nvshmem: Arc<Nvshmem>,
    buf: SymmetricBuffer<f64>,
    mapped: bool,
    gathers: std::cell::Cell<u64>,
}

impl PeComm {
    /// A buffer of `capacity` f64 per PE (collective).
    pub fn new(nvshmem: Arc<Nvshmem>, capacity: usize) -> Result<Self> {
        let buf = nvshmem.alloc::<f64>(capacity)?;
        let me = nvshmem.my_pe();
        let here = (0..nvshmem.n_pes()).all(|pe| pe == me || buf.peer_ptr(pe).is_some());
        // Every PE must take the same branch: agree through the rendezvous where there is one
        // (`halo launch`; elsewhere, e.g. under mpirun on one node, every PE sees every peer).
        let mapped = match halo::launch::rendezvous::all_gather("bench-comm-mapped", &[u8::from(here)]) {
            Ok(all) => all.iter().all(|b| b.as_slice() == [1]),
            Err(_) => here,
        };
        Ok(Self { nvshmem, buf, mapped, gathers: std::cell::Cell::new(0) })
    }

    /// Whether every PE's memory is mapped into this process.
    pub fn mapped(&self) -> bool {
        self.mapped
    }

    /// Every PE's `values`, by PE (collective; at most `capacity` values).
    pub fn all_gather(&self, values: &[f64]) -> Result<Vec<Vec<f64>>> {
        if values.len() > self.buf.len() {
            return Err(HaloError::InvalidInput(format!("gather of {} values into {}", values.len(), self.buf.len())));
        }
        if !self.mapped {
            return self.all_gather_by_rendezvous(values);
        }
        self.buf.copy_from_host(values)?;
        self.nvshmem.barrier_all()?;
        let mut out = Vec::with_capacity(self.nvshmem.n_pes());
        for pe in 0..self.nvshmem.n_pes() {
            let src = if pe == self.nvshmem.my_pe() { Some(self.buf.device_ptr()) } else { self.buf.peer_ptr(pe) };
            let src = src.ok_or_else(|| HaloError::Nvshmem(format!("PE {pe} is not mapped into this process (single node only)")))?;
            let mut v = vec![0.0f64; values.len()];
            if !v.is_empty() {
                self.nvshmem.context().bind_to_thread().during("binding the context")?;
                // SAFETY: `src` addresses `values.len()` f64 of PE `pe`'s copy of this symmetric
                // buffer, written before the barrier above and not rewritten before the next one.
                unsafe { cudarc::driver::result::memcpy_dtoh_sync(bytemuck::cast_slice_mut::<f64, u8>(&mut v), src) }.during("gathering results")?;
            }
            out.push(v);
        }
        self.nvshmem.barrier_all()?;
        Ok(out)
    }

    /// The same through the launcher's rendezvous directory (unmapped peers, `halo launch` only).
    fn all_gather_by_rendezvous(&self, values: &[f64]) -> Result<Vec<Vec<f64>>> {
        let n = self.gathers.get();
        self.gathers.set(n + 1);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = halo::launch::rendezvous::all_gather(&format!("bench-{n}"), &bytes).map_err(|e| {
            HaloError::InvalidInput(format!("the PEs cannot map each other's memory, and gathering through `halo launch`'s rendezvous failed: {e}"))
        })?;
        Ok(all.iter().map(|b| b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect()).collect())
    }

    /// True when every PE says true.
    pub fn all(&self, ok: bool) -> Result<bool> {
        Ok(self.all_gather(&[ok as u8 as f64])?.iter().all(|v| v[0] != 0.0))
    }

    /// Rank 0's bytes on every PE.
    pub fn broadcast_bytes(&self, bytes: &[u8; 128]) -> Result<[u8; 128]> {
        let words: Vec<f64> = bytes.chunks(8).map(|c| f64::from_bits(u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))).collect();
        let all = self.all_gather(&words)?;
        let mut out = [0u8; 128];
        for (i, w) in all[0].iter().enumerate() {
            out[8 * i..8 * i + 8].copy_from_slice(&w.to_bits().to_le_bytes());
        }
        Ok(out)
    }
}
