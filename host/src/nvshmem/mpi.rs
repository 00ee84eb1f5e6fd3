//! NVSHMEM and the halo plan over the caller's MPI communicator (feature `mpi`, the `mpi` crate).
//!
//! - [`Nvshmem::init_with_mpi`]: rank 0 of the communicator makes NVSHMEM's unique id, `MPI_Bcast`
//!   hands its 128 bytes to every rank, and each initialises NVSHMEM with the unique-id bootstrap
//!   as PE = its rank in the communicator. This works with any MPI implementation (NVSHMEM's own
//!   MPI bootstrap plugin is built against Open MPI's `libmpi.so.40`).
//! - [`all_gather_halos`]: every rank's [`RankHalo`] (serde JSON, `MPI_Allgatherv`), the list
//!   the exchange's `PeExchange::new` takes, without files or NVSHMEM.
//! - [`device_from_communicator`]: the rank's GPU from its rank on the node
//!   (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`), so no launcher variable is needed.
//!
//! The communicator is any `mpi` crate communicator (`mpi::topology::SimpleCommunicator`, e.g.
//! `universe.world()`); [`rsmpi`] re-exports the crate halo was built with.

use super::{Bootstrap, Nvshmem, UniqueId};
use crate::desc::RankHalo;
use crate::error::{HaloError, Result};
use crate::gpu::CudaContext;
use ::mpi::datatype::PartitionMut;
use ::mpi::traits::{Communicator, CommunicatorCollectives, Root};
use nvshmem_sys::NvshmemLib;
use std::sync::Arc;
use std::time::Duration;

/// The `mpi` crate (rsmpi) halo is built with, so that a caller passes communicators of the same
/// version.
pub use ::mpi as rsmpi;

/// The first byte of the broadcast: rank 0 made the id.
const ID_MADE: u8 = 1;
/// The first byte of the broadcast: rank 0 could not make the id (it returns its own error).
const ID_FAILED: u8 = 0;

impl Nvshmem {
    /// Initialises this process as PE `comm.rank()` of `comm.size()` on `ctx`'s GPU, bootstrapped
    /// over the caller's communicator: rank 0 makes NVSHMEM's unique id
    /// (`nvshmemx_get_uniqueid`), it is broadcast over `comm` ([`broadcast_unique_id`]), and every
    /// rank initialises with it ([`Nvshmem::init`] with [`Bootstrap::UniqueId`]). Collective over
    /// `comm`. halo owns the lifetime: dropping the last handle finalises NVSHMEM, which must
    /// happen before the caller finalises MPI.
    pub fn init_with_mpi<C: Communicator>(lib: NvshmemLib, ctx: &Arc<CudaContext>, comm: &C, timeout: Duration) -> Result<Arc<Self>> {
        let (rank, nranks) = (comm.rank() as usize, comm.size() as usize);
        // Not under halo's watchdog: a rank that dies before the broadcast is MPI's to handle
        // (mpiexec ends the job), and the watchdog's remedy would be to end this process.
        let id = broadcast_unique_id(comm, || super::unique_id(&lib))?;
        let nvshmem = Self::init(lib, ctx, &Bootstrap::UniqueId { rank, nranks, id }, timeout)?;
        if nvshmem.my_pe() != rank || nvshmem.n_pes() != nranks {
            return Err(HaloError::Nvshmem(format!(
                "NVSHMEM says PE {} of {}, the communicator rank {rank} of {nranks}",
                nvshmem.my_pe(),
                nvshmem.n_pes()
            )));
        }
        Ok(nvshmem)
    }
}

/// Rank 0's unique id on every rank of `comm`: rank 0 calls `make`, and one `MPI_Bcast` of 129
/// bytes (a flag, then the id) hands it out. When `make` fails on rank 0, rank 0 returns that
/// error and every other rank an error naming rank 0, instead of hanging. Collective over `comm`.
pub fn broadcast_unique_id<C: Communicator>(comm: &C, make: impl FnOnce() -> Result<UniqueId>) -> Result<UniqueId> {
    let mut message = [ID_FAILED; 129];
    let made = if comm.rank() == 0 {
        let made = make();
        if let Ok(UniqueId(bytes)) = &made {
            message[0] = ID_MADE;
            message[1..].copy_from_slice(bytes);
        }
        Some(made)
    } else {
        None
    };
    comm.process_at_rank(0).broadcast_into(&mut message[..]);
    if let Some(made) = made {
        return made;
    }
    if message[0] != ID_MADE {
        return Err(HaloError::Nvshmem(format!(
            "rank 0 of the communicator could not make NVSHMEM's unique id (rank 0's error says why), so rank {} cannot start NVSHMEM",
            comm.rank()
        )));
    }
    let mut id = [0u8; 128];
    id.copy_from_slice(&message[1..]);
    Ok(UniqueId(id))
}

/// `mine` when it is `Ok` on every rank of `comm`; otherwise every rank returns an error (its
/// own, or one naming the ranks that failed `what`), so that no rank goes on into a collective
/// that a failed rank never joins. Collective over `comm` (one all-gather of one byte).
pub fn all_ready<C: Communicator, T>(comm: &C, what: &str, mine: Result<T>) -> Result<T> {
    let flags = all_gather_bytes(comm, &[u8::from(mine.is_ok())])?;
    let failed: Vec<String> = flags.iter().enumerate().filter(|(_, f)| f.first() != Some(&1)).map(|(r, _)| r.to_string()).collect();
    match mine {
        Err(e) => Err(e),
        Ok(_) if !failed.is_empty() => Err(HaloError::Nvshmem(format!(
            "rank(s) {} of the communicator failed {what} (their errors say why), so rank {} stops too",
            failed.join(", "),
            comm.rank()
        ))),
        Ok(v) => Ok(v),
    }
}

/// Every rank's `mine`, in rank order (`MPI_Allgather` of the lengths, then `MPI_Allgatherv`).
/// Collective over `comm`.
pub fn all_gather_bytes<C: Communicator>(comm: &C, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
    let len = i32::try_from(mine.len())
        .map_err(|_| HaloError::InvalidInput(format!("{} bytes to all-gather over MPI: at most {} fit one MPI count", mine.len(), i32::MAX)))?;
    let mut lens = vec![0i32; comm.size() as usize];
    comm.all_gather_into(&len, &mut lens[..]);
    let mut displs = Vec::with_capacity(lens.len());
    let mut total = 0i64;
    for &n in &lens {
        displs.push(i32::try_from(total).map_err(|_| HaloError::InvalidInput(format!("the ranks' {total}+ bytes exceed one MPI displacement")))?);
        total += i64::from(n);
    }
    let mut all = vec![0u8; total as usize];
    {
        let mut partition = PartitionMut::new(&mut all[..], &lens[..], &displs[..]);
        comm.all_gather_varcount_into(mine, &mut partition);
    }
    Ok(lens.iter().zip(&displs).map(|(&n, &at)| all[at as usize..(at + n) as usize].to_vec()).collect())
}

/// Every rank's halo, in rank order, from each rank's own (`mine`): what
/// the exchange's `PeExchange::new` takes (and the CPU reference needs). Serde JSON bytes all-gathered over `comm`
/// ([`all_gather_bytes`]). Collective over `comm`.
pub fn all_gather_halos<C: Communicator>(comm: &C, mine: &RankHalo) -> Result<Vec<RankHalo>> {
    let bytes = serde_json::to_vec(mine).map_err(|e| HaloError::InvalidInput(format!("encoding rank {}'s halo: {e}", comm.rank())))?;
    all_gather_bytes(comm, &bytes)?
        .into_iter()
        .enumerate()
        .map(|(rank, b)| {
            serde_json::from_slice(&b).map_err(|e| HaloError::InvalidInput(format!("rank {rank}'s halo, as gathered over MPI, does not decode: {e}")))
        })
        .collect()
}

/// This rank's rank among the ranks of `comm` on its node (`MPI_Comm_split_type` with
/// `MPI_COMM_TYPE_SHARED`, ordered by rank in `comm`). Collective over `comm`.
pub fn local_rank<C: Communicator>(comm: &C) -> usize {
    local_rank_and_size(comm).0
}

/// [`local_rank`] and how many ranks of `comm` share the node. Collective over `comm`.
pub fn local_rank_and_size<C: Communicator>(comm: &C) -> (usize, usize) {
    let node = comm.split_shared(comm.rank());
    (node.rank() as usize, node.size() as usize)
}

/// How many of a node's `local_size` ranks share the GPU of node-local rank `local_rank` when
/// they take the `visible` GPUs round robin ([`device_for_local_rank`]). Pure.
pub fn ranks_sharing_gpu(local_rank: usize, local_size: usize, visible: usize) -> usize {
    if visible == 0 {
        return 1;
    }
    let device = local_rank % visible;
    (local_size / visible + usize::from(device < local_size % visible)).max(1)
}

/// The GPU of the rank with node-local rank `local_rank` when `visible` GPUs are visible: the
/// local rank wrapped modulo `visible` (several ranks share a GPU when there are more ranks than
/// GPUs on the node, as under MPS). Pure.
pub fn device_for_local_rank(local_rank: usize, visible: usize) -> Result<usize> {
    if visible == 0 {
        return Err(HaloError::NoGpu(format!("node-local rank {local_rank} needs a GPU, but none is visible")));
    }
    Ok(local_rank % visible)
}

/// This rank's GPU: [`device_of_local_rank`] of its node-local rank in `comm` ([`local_rank`]).
/// Collective over `comm`.
pub fn device_from_communicator<C: Communicator>(comm: &C) -> Result<usize> {
    device_of_local_rank(local_rank(comm))
}

/// The GPU of the rank with node-local rank `local`: `HALO_DEVICE` when set, else
/// [`device_for_local_rank`] with the GPUs visible to this process.
pub fn device_of_local_rank(local: usize) -> Result<usize> {
    if let Ok(text) = std::env::var(crate::launch::env::ENV_DEVICE) {
        return text.trim().parse().map_err(|_| {
            HaloError::InvalidInput(format!("{}={text:?} is not a GPU ordinal (a non-negative integer)", crate::launch::env::ENV_DEVICE))
        });
    }
    device_for_local_rank(local, crate::gpu::device_count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_wraps_around_the_visible_ones() {
        assert_eq!(device_for_local_rank(0, 1).unwrap(), 0);
        assert_eq!(device_for_local_rank(1, 1).unwrap(), 0, "two ranks share one GPU (MPS)");
        assert_eq!(device_for_local_rank(3, 2).unwrap(), 1);
        assert_eq!(device_for_local_rank(5, 8).unwrap(), 5);
        let err = device_for_local_rank(0, 0).unwrap_err().to_string();
        assert!(err.contains("none is visible"), "{err}");
    }

    #[test]
    fn the_ranks_sharing_a_gpu_are_those_the_round_robin_puts_there() {
        assert_eq!(ranks_sharing_gpu(0, 2, 1), 2, "two ranks on one GPU (MPS)");
        assert_eq!(ranks_sharing_gpu(1, 2, 2), 1, "one rank per GPU");
        // Five ranks on two GPUs: 0, 2, 4 on GPU 0; 1, 3 on GPU 1.
        assert_eq!(ranks_sharing_gpu(4, 5, 2), 3);
        assert_eq!(ranks_sharing_gpu(3, 5, 2), 2);
        assert_eq!(ranks_sharing_gpu(0, 1, 8), 1, "fewer ranks than GPUs");
        assert_eq!(ranks_sharing_gpu(0, 3, 0), 1, "no GPU: nothing to share");
        for (size, visible) in [(7, 3), (8, 8), (16, 5)] {
            let total: usize = (0..visible).map(|d| ranks_sharing_gpu(d, size, visible)).sum();
            assert_eq!(total, size, "every rank counted once ({size} ranks, {visible} GPUs)");
        }
    }
}
