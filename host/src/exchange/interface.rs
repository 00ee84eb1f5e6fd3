//! One interface for ranks in one process ([`LocalRanks`]) and ranks across NVSHMEM PEs
//! ([`PeExchange`]), so that a per-step driver (the MD step, the exchange check, calibration, the
//! benchmark) is written once: build the exchange from a [`Placement`], then call [`Exchange`]'s
//! per-step operations on it, whichever way the ranks are spread.
//!
//! The "local ranks" of an exchange are the ranks this process drives: every rank for
//! [`LocalRanks`], this PE's one rank for [`PeExchange`]. [`Exchange::local_ranks`]`()[i]` is
//! global rank [`RankExchange::rank`], and runs on [`Exchange::streams`]`()[i]`. Collective
//! operations ([`Exchange::barrier`], [`Placement::all_gather`]) are no-ops or identities in one
//! process; across PEs every PE must call them in the same order.
//!
//! Paths are the router's by default ([`PathPolicy::Routed`]); a driver that feeds failures back
//! keeps a [`super::routing::Routing`] and builds with [`Placement::exchange_planned`].

use super::local::LocalRanks;
use super::pe::{PathPolicy, PeExchange};
use super::rank::{RankExchange, SharedSizes};
use crate::desc::RankHalo;
use crate::desc::{Element, Transport};
use crate::error::{HaloError, Result};
use crate::gpu::{CudaStream, DeviceMemory, KernelModule};
use crate::nvshmem::Nvshmem;
use crate::session::PeSession;
use kernels_gpu::abi::Float3;
use std::sync::Arc;
use std::time::Duration;

/// What orders a replan ([`Exchange::replan_fenced`]) after every PE's last step of the old layout.
///
/// A replan changes this PE's layout (index maps, metadata, the halo region peers store into);
/// no PE may do that while a peer still runs a step of the old layout, or while a write of one
/// (a signal, a credit, halo data) is still on its way to it. Ranks in one process need neither
/// (the one host waits for every rank's stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReplanFence {
    /// The exchange fences the replan itself: a bounded wait for this PE's stream, then a host
    /// barrier across PEs (NVSHMEM's, which also completes the NVSHMEM operations still in
    /// flight). Always safe; what [`Exchange::replan`] does.
    #[default]
    Barrier,
    /// The caller already established the fence with a host collective. Its contract, which
    /// every PE must meet, at the same replan (the choice is the caller's and must be the same
    /// on every PE, as the barrier it replaces is collective):
    ///
    /// 1. before entering the collective, every PE waited for all of its streams that run steps
    ///    of this exchange (the halo stream and any stream that launches or replays its kernels)
    ///    and saw them idle, with no device wait that timed out (an exchange that failed is
    ///    refused anyway);
    /// 2. every PE has returned from that collective, or this PE is returning from it: a PE
    ///    leaves an all-gather only after every PE entered it, so by (1) no PE still runs a step
    ///    of the old layout;
    /// 3. since it entered the collective, no PE launched anything of this exchange or wrote
    ///    into a peer's buffers of it (further collectives, and a PE's copies, searches and
    ///    uploads of its own, are fine).
    ///
    /// The exchange still waits (bounded) for this PE's stream. What the collective need not give
    /// is the completion of NVSHMEM operations that a finished kernel may leave in flight through
    /// a remote transport (a credit's `nvshmem_uint64_p` to a peer that `nvshmem_ptr` does not
    /// map): [`PeExchange`] leaves its barrier out only where every PE maps every other PE (then
    /// every write of a step is one of its kernel's own stores, done when the kernel is), a fact
    /// its set-up agreed on every PE alike, and keeps the barrier otherwise.
    AfterCollective,
}

/// The per-step operations every driver needs, over the ranks of this process.
pub trait Exchange<T: Element = Float3> {
    /// The ranks this process drives (all of them, or this PE's one).
    fn local_ranks(&self) -> &[RankExchange<T>];
    /// Mutable access to them (wait timeout, graph capture).
    fn local_ranks_mut(&mut self) -> &mut [RankExchange<T>];
    /// The exchange stream of each local rank, in the same order.
    fn streams(&self) -> &[Arc<CudaStream>];
    /// Whether `transport` can run with these ranks and their peers (decided identically on
    /// every PE, so either all launch or none).
    fn check_transport(&self, transport: Transport) -> Result<()>;
    /// One step's forward exchange (gather chain: coordinates, ghost cells) on every local rank,
    /// enqueued (GPU-initiated transports) or run (staged).
    fn exchange_forward(&mut self, transport: Transport) -> Result<()>;
    /// One step's reverse exchange with accumulation (scatter chain: forces), likewise.
    fn exchange_reverse_accumulate(&mut self, transport: Transport) -> Result<()>;
    /// Waits for every local stream and turns a device wait timeout into an error.
    fn finish(&mut self) -> Result<()>;
    /// Local rank `i` enqueues every later launch, copy and wait on `streams[i]` (one per local
    /// rank, on its GPU; each rank its own): the caller's streams, so that the exchange falls
    /// into the caller's stream order with no event of its own. The first work on a new stream
    /// runs after everything already enqueued on the old one. Halo never destroys a stream it did
    /// not create; one the caller wraps ([`crate::gpu::borrow_stream`]) must outlive the exchange.
    /// [`Self::finish`] (and the exchange's drop) then waits for everything on these streams,
    /// the caller's own work after the halo included; caller work that runs longer than the host
    /// wait budget ([`RankExchange::host_wait_budget`]) without the halo moving reads as a stuck
    /// stream, so finish before enqueuing long work, or wait on an event of your own instead.
    fn use_streams(&mut self, streams: &[Arc<CudaStream>]) -> Result<()>;
    /// Host barrier across PEs; nothing to wait for in one process.
    fn barrier(&self) -> Result<()>;
    /// Host synchronisations so far (the staged path's cost; `finish` counts too).
    fn host_syncs(&self) -> u64;
    /// Resets the device-side protocol of every local rank and waits for it, so the exchange can
    /// run again from step 0 (after a timeout, or before replaying captured steps). Across PEs it
    /// is fenced by barriers: no PE resets while a peer still runs, none runs before all reset.
    fn reset_protocol(&mut self) -> Result<()>;
    /// Moves the exchange to `halos` (a new decomposition of the same rank grid: atoms migrated)
    /// in its existing buffers, keeping signals and step counters; `Ok(false)`, changing nothing,
    /// when the buffers are too small (build a new exchange then; every PE decides alike). Every
    /// local rank must be idle; across PEs it is collective and fenced by a barrier. Home values
    /// must be uploaded again for the new layout.
    fn replan(&mut self, halos: Vec<RankHalo>) -> Result<bool>;

    /// Whether [`Self::replan`] would move the exchange to `halos` in its buffers: it returns
    /// `Ok(false)` exactly where this is false (every PE decides alike). A caller that builds a
    /// new exchange from the same halos where they do not fit asks first, so that it hands
    /// `replan` its halos instead of a copy.
    fn fits(&self, halos: &[RankHalo]) -> bool;

    /// [`Self::replan`] with the fence across PEs that the caller can vouch for ([`ReplanFence`]):
    /// [`ReplanFence::Barrier`] is [`Self::replan`]; [`ReplanFence::AfterCollective`] lets an
    /// exchange across PEs leave out its barrier where the caller's contract (stated there) holds.
    /// Ranks in one process have no peer process to fence against: both are the same. The
    /// provided version ignores the fence and replans with the barrier, which is never weaker.
    fn replan_fenced(&mut self, halos: Vec<RankHalo>, fence: ReplanFence) -> Result<bool> {
        let _ = fence;
        self.replan(halos)
    }

    /// Host barriers across PEs that replans ran so far (0 in one process): how many fences a
    /// [`ReplanFence::AfterCollective`] left out shows as replans without one.
    fn replan_barriers(&self) -> u64 {
        0
    }

    /// What the router chose for each local rank (empty when no router decided: `Auto`,
    /// `ForcePut`, [`LocalRanks::direct`]).
    fn routes(&self) -> Vec<crate::route::RoutedSummary> {
        Vec::new()
    }

    /// Sets the deadline of every device wait of the local ranks.
    fn set_wait_timeout(&mut self, timeout: Duration) {
        for r in self.local_ranks_mut() {
            r.set_wait_timeout(timeout);
        }
    }

    /// Each local rank's forward buffer `x`, its first `total_atoms` values (synchronous).
    fn read_forward(&self) -> Result<Vec<Vec<T>>> {
        self.local_ranks().iter().map(|r| Ok(r.x.to_host()?[..r.halo().total_atoms].to_vec())).collect()
    }

    /// Each local rank's reverse buffer `f`, its first `total_atoms` values (synchronous).
    fn read_reverse(&self) -> Result<Vec<Vec<T>>> {
        self.local_ranks().iter().map(|r| Ok(r.f.to_host()?[..r.halo().total_atoms].to_vec())).collect()
    }
}

impl<T: Element> Exchange<T> for LocalRanks<T> {
    fn local_ranks(&self) -> &[RankExchange<T>] {
        self.ranks()
    }
    fn local_ranks_mut(&mut self) -> &mut [RankExchange<T>] {
        self.ranks_mut()
    }
    fn streams(&self) -> &[Arc<CudaStream>] {
        LocalRanks::streams(self)
    }
    fn check_transport(&self, transport: Transport) -> Result<()> {
        LocalRanks::check_transport(self, transport)
    }
    fn exchange_forward(&mut self, transport: Transport) -> Result<()> {
        LocalRanks::exchange_forward(self, transport)
    }
    fn exchange_reverse_accumulate(&mut self, transport: Transport) -> Result<()> {
        LocalRanks::exchange_reverse_accumulate(self, transport)
    }
    fn finish(&mut self) -> Result<()> {
        LocalRanks::finish(self)
    }
    fn use_streams(&mut self, streams: &[Arc<CudaStream>]) -> Result<()> {
        LocalRanks::use_streams(self, streams)
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn host_syncs(&self) -> u64 {
        LocalRanks::host_syncs(self)
    }
    fn reset_protocol(&mut self) -> Result<()> {
        LocalRanks::reset_protocol(self)
    }
    fn replan(&mut self, halos: Vec<RankHalo>) -> Result<bool> {
        LocalRanks::replan(self, halos)
    }
    fn fits(&self, halos: &[RankHalo]) -> bool {
        LocalRanks::fits(self, halos)
    }
    fn routes(&self) -> Vec<crate::route::RoutedSummary> {
        LocalRanks::routes(self).to_vec()
    }
}

impl<T: Element> Exchange<T> for PeExchange<T> {
    fn local_ranks(&self) -> &[RankExchange<T>] {
        std::slice::from_ref(self.rank())
    }
    fn local_ranks_mut(&mut self) -> &mut [RankExchange<T>] {
        std::slice::from_mut(self.rank_mut())
    }
    fn streams(&self) -> &[Arc<CudaStream>] {
        std::slice::from_ref(self.stream())
    }
    fn check_transport(&self, transport: Transport) -> Result<()> {
        PeExchange::check_transport(self, transport)
    }
    fn exchange_forward(&mut self, transport: Transport) -> Result<()> {
        PeExchange::exchange_forward(self, transport)
    }
    fn exchange_reverse_accumulate(&mut self, transport: Transport) -> Result<()> {
        PeExchange::exchange_reverse_accumulate(self, transport)
    }
    fn finish(&mut self) -> Result<()> {
        PeExchange::finish(self)
    }
    fn use_streams(&mut self, streams: &[Arc<CudaStream>]) -> Result<()> {
        match streams {
            [one] => self.use_stream(one.clone()),
            _ => Err(HaloError::InvalidInput(format!("{} streams for a PE, which drives one rank: pass one", streams.len()))),
        }
    }
    fn barrier(&self) -> Result<()> {
        PeExchange::barrier(self)
    }
    fn host_syncs(&self) -> u64 {
        PeExchange::host_syncs(self)
    }
    fn reset_protocol(&mut self) -> Result<()> {
        PeExchange::reset_protocol(self)
    }
    fn replan(&mut self, halos: Vec<RankHalo>) -> Result<bool> {
        PeExchange::replan(self, halos)
    }
    fn fits(&self, halos: &[RankHalo]) -> bool {
        PeExchange::fits(self, halos)
    }
    fn replan_fenced(&mut self, halos: Vec<RankHalo>, fence: ReplanFence) -> Result<bool> {
        PeExchange::replan_fenced(self, halos, fence)
    }
    fn replan_barriers(&self) -> u64 {
        PeExchange::replan_barriers(self)
    }
    fn routes(&self) -> Vec<crate::route::RoutedSummary> {
        PeExchange::routes(self).cloned().into_iter().collect()
    }
}

/// Where the ranks of a decomposition run, and so which exchange serves them.
#[derive(Clone)]
pub enum Placement {
    /// Every rank in this process: rank `r` on `modules[r % modules.len()]` (one loaded module per
    /// GPU), exchanged by [`LocalRanks`] with the router's paths ([`LocalRanks::new`]).
    Local(Vec<Arc<KernelModule>>),
    /// Every rank in this process as [`Placement::Local`], with direct stores to every peer and
    /// no router ([`LocalRanks::direct`]): what `with_policy(Auto)` makes of a local placement
    /// (calibration measures one path at a time this way).
    LocalDirect(Vec<Arc<KernelModule>>),
    /// One rank per NVSHMEM PE, this process being PE `nvshmem.my_pe()`, exchanged by
    /// [`PeExchange`] (every PE builds the same exchanges in the same order).
    Pe {
        /// This PE.
        nvshmem: Arc<Nvshmem>,
        /// The kernels, registered with NVSHMEM.
        module: Arc<KernelModule>,
        /// How pulses reach their peers.
        policy: PathPolicy,
    },
}

impl Placement {
    /// This PE of a started session ([`PeSession::start`]), with `policy`.
    pub fn pe(session: &PeSession, policy: PathPolicy) -> Self {
        Placement::Pe { nvshmem: session.nvshmem.clone(), module: session.module.clone(), policy }
    }

    /// The same placement with another path policy. Ranks in one process follow the router
    /// (`Routed`, `Planned`) or store directly to every peer (`Auto`, `ForcePut`: they have no
    /// NVSHMEM to put with).
    pub fn with_policy(&self, policy: PathPolicy) -> Self {
        match self {
            Placement::Local(m) | Placement::LocalDirect(m) => match policy {
                PathPolicy::Routed | PathPolicy::Planned(_) => Placement::Local(m.clone()),
                PathPolicy::Auto | PathPolicy::ForcePut => Placement::LocalDirect(m.clone()),
            },
            Placement::Pe { nvshmem, module, .. } => Placement::Pe { nvshmem: nvshmem.clone(), module: module.clone(), policy },
        }
    }

    /// The loaded modules of a placement in one process (rank `r` on `modules[r % len]`).
    pub fn local_modules(&self) -> Option<&[Arc<KernelModule>]> {
        match self {
            Placement::Local(m) | Placement::LocalDirect(m) => Some(m),
            Placement::Pe { .. } => None,
        }
    }

    /// The exchange of `halos` (every rank's, the same complete list on every PE) for the ranks
    /// placed here, with this process's jitter and fault if it asked for any
    /// (`perturb::for_process`): in one process with the router's paths, across PEs as the
    /// placement's policy says (the router's by default). Collective across PEs.
    pub fn exchange<T: Element>(&self, halos: Vec<RankHalo>) -> Result<Box<dyn Exchange<T>>> {
        self.exchange_with_headroom(halos, 0.0)
    }

    /// [`Self::exchange`] with buffers `headroom` (a fraction) larger than `halos` need, so that
    /// [`Exchange::replan`] can keep them when later decompositions grow a little (the memory
    /// prechecks count the headroom: [`super::heap::Footprint::of`] takes the grown sizes).
    pub fn exchange_with_headroom<T: Element>(&self, halos: Vec<RankHalo>, headroom: f64) -> Result<Box<dyn Exchange<T>>> {
        self.build(halos, None, headroom)
    }

    /// The exchange of `halos` following `plans` (every rank's, from a
    /// [`super::routing::Routing`]): what a driver that feeds failures back builds, again after a
    /// safe point switched pairs; with this process's jitter and fault like [`Self::exchange`].
    /// Collective across PEs.
    pub fn exchange_planned<T: Element>(&self, halos: Vec<RankHalo>, plans: &[crate::route::RoutedPaths]) -> Result<Box<dyn Exchange<T>>> {
        self.build(halos, Some(plans), 0.0)
    }

    /// [`Self::exchange_planned`] with `headroom` as [`Self::exchange_with_headroom`] (the MD step,
    /// which replans at search steps).
    pub fn exchange_planned_with_headroom<T: Element>(
        &self,
        halos: Vec<RankHalo>,
        plans: &[crate::route::RoutedPaths],
        headroom: f64,
    ) -> Result<Box<dyn Exchange<T>>> {
        self.build(halos, Some(plans), headroom)
    }

    /// Every exchange a placement builds: `plans` given or as the placement's policy says, buffers
    /// `headroom` larger than `halos` need, wrapped for this process's perturbation.
    fn build<T: Element>(&self, halos: Vec<RankHalo>, plans: Option<&[crate::route::RoutedPaths]>, headroom: f64) -> Result<Box<dyn Exchange<T>>> {
        let sizes = SharedSizes::of(&halos).with_headroom(headroom);
        let signaling = || super::pe::PutSignaling::from_env();
        super::perturb::for_process(match (self, plans) {
            (Placement::Local(modules) | Placement::LocalDirect(modules), Some(plans)) => {
                Box::new(LocalRanks::<T>::with_plans_and_sizes(halos, modules, plans, sizes)?)
            }
            (Placement::Local(modules), None) => Box::new(LocalRanks::<T>::with_sizes(halos, modules, sizes)?),
            (Placement::LocalDirect(modules), None) => Box::new(LocalRanks::<T>::direct_with_sizes(halos, modules, sizes)?),
            (Placement::Pe { nvshmem, module, .. }, Some(plans)) => {
                let mine = plans.get(nvshmem.my_pe()).ok_or_else(|| HaloError::InvalidInput(format!("no plan for PE {}", nvshmem.my_pe())))?;
                let policy = PathPolicy::Planned(mine.clone().leak());
                Box::new(PeExchange::<T>::with_sizes(nvshmem.clone(), module.clone(), halos, policy, signaling()?, sizes)?)
            }
            (Placement::Pe { nvshmem, module, policy }, None) => {
                Box::new(PeExchange::<T>::with_sizes(nvshmem.clone(), module.clone(), halos, *policy, signaling()?, sizes)?)
            }
        })
    }

    /// The path policy across PEs (ranks in one process are always routed).
    pub fn policy(&self) -> PathPolicy {
        match self {
            Placement::Local(_) => PathPolicy::Routed,
            Placement::LocalDirect(_) => PathPolicy::Auto,
            Placement::Pe { policy, .. } => *policy,
        }
    }

    /// [`Self::all_gather`] for a collective repeated often (search steps): across PEs through
    /// `kept`'s symmetric buffers ([`KeptGather`](crate::nvshmem::KeptGather), made by the first
    /// call, `initial` bytes per PE, grown when needed), one put per PE and a barrier instead of
    /// allocations. Every PE makes the same calls with its own `kept`.
    pub fn all_gather_kept(
        &self,
        tag: &str,
        mine: Vec<Vec<u8>>,
        kept: &mut Option<crate::nvshmem::KeptGather>,
        initial: usize,
    ) -> Result<Vec<Vec<u8>>> {
        match self {
            Placement::Local(_) | Placement::LocalDirect(_) => Ok(mine),
            Placement::Pe { nvshmem, .. } => {
                let [one] = <[Vec<u8>; 1]>::try_from(mine).map_err(|m| HaloError::InvalidInput(format!("a PE drives one rank, not {}", m.len())))?;
                let gather = match kept {
                    Some(g) => g,
                    None => kept.insert(crate::nvshmem::KeptGather::new(nvshmem, initial)?),
                };
                gather.all_gather_owned(one).map_err(|e| HaloError::Nvshmem(format!("gathering {tag} across PEs: {e}")))
            }
        }
    }

    /// Every rank's bytes, indexed by rank, from `mine` (one entry per local rank, in
    /// [`Exchange::local_ranks`] order): `mine` itself in one process; across PEs an all-gather
    /// through NVSHMEM ([`Nvshmem::all_gather_bytes`]), so it works under every launcher and across
    /// nodes (small host data: search steps, checks). `tag` names it in errors.
    pub fn all_gather(&self, tag: &str, mine: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
        match self {
            Placement::Local(_) | Placement::LocalDirect(_) => Ok(mine),
            Placement::Pe { nvshmem, .. } => {
                let [one] = <[Vec<u8>; 1]>::try_from(mine).map_err(|m| HaloError::InvalidInput(format!("a PE drives one rank, not {}", m.len())))?;
                nvshmem.all_gather_bytes(&one).map_err(|e| HaloError::Nvshmem(format!("gathering {tag} across PEs: {e}")))
            }
        }
    }
}
