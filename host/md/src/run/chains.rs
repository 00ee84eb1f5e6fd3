//! The two chains of a search step that need only the new plan, run side by side
//! ([`crate::workers::Workers::beside`]): each rank's local atoms and the first half of its grid
//! and lists ([`LocalChain`]), and the router's paths for the new halos with the exchange's
//! replan or rebuild ([`ExchangeChain`]). Neither reads what the other writes: the local chain
//! fills the search's host arrays and enqueues GPU passes on each rank's local stream that touch
//! only the rank's own search buffers; the exchange chain moves the exchange (its maps, its
//! buffers, its streams) and the router. Each rank's `update` finishes its search after both.

use super::{EXCHANGE_HEADROOM, MdConfig, MdOutcome, SearchPath, replan_fence, same_transports};
use crate::abi::Float3;
use crate::decomp::{HaloPlan, Redecomposed};
use crate::error::{HaloError, Result};
use crate::exchange::{Exchange, Placement, RankHalo, Routing};
use crate::nbnxm::ListSetup;
use crate::rank::MdRank;
use crate::search::{self, HostSearch, RankSearch};
use crate::system::MolecularSystem;
use std::time::{Duration, Instant};

/// The plan of a search step, as the local chain takes it.
pub(super) enum Planned {
    /// From the ranks' own atoms: the plan with each rank's new home atoms and local positions;
    /// `on_gpus` where the per-atom passes ran on the ranks' GPUs.
    Redecomposed { done: Redecomposed, on_gpus: bool },
    /// From the whole system gathered.
    Gathered(HaloPlan),
}

impl Planned {
    /// Every rank's halo of the plan.
    pub(super) fn rank_halos(&self) -> Vec<RankHalo> {
        match self {
            Self::Redecomposed { done, .. } => done.plan.rank_halos(),
            Self::Gathered(plan) => plan.rank_halos(),
        }
    }
}

/// What the local chain needs of the run: the search's host arrays and threads, the ranks, the
/// system and the lists' set-up.
pub(super) struct LocalChain<'a> {
    pub(super) host_search: &'a mut HostSearch,
    pub(super) ranks: &'a mut Vec<MdRank>,
    pub(super) system: &'a MolecularSystem,
    pub(super) ids: &'a [usize],
    pub(super) setup: &'a ListSetup,
    pub(super) lists_on: search::ListsOn,
}

/// What the local chain made: the plan, every local rank's search, the local atoms' time and
/// the first halves' time.
pub(super) struct LocalSearched {
    pub(super) plan: HaloPlan,
    pub(super) found: Vec<RankSearch>,
    pub(super) lists: Duration,
    pub(super) begin: Duration,
}

impl LocalChain<'_> {
    /// Each rank's local atoms (and on the host's paths its grid and lists), then the first half
    /// of each rank's GPU grid and lists, enqueued on its local stream ([`MdRank::begin_search`];
    /// each rank's on a search thread of its own where this process drives several).
    pub(super) fn run(self, planned: Planned, box_size: [f32; 3]) -> Result<LocalSearched> {
        let t = Instant::now();
        let (plan, found) = match planned {
            Planned::Redecomposed { done, on_gpus } => tracing::debug_span!("search.local_atoms")
                .in_scope(|| self.host_search.rank_searches_redecomposed(done, self.system, self.ids, self.setup, self.lists_on, on_gpus))?,
            Planned::Gathered(plan) => {
                let found = self.host_search.rank_searches(&plan, self.system, self.ids, self.setup, self.lists_on)?;
                (plan, found)
            }
        };
        let lists = t.elapsed();
        let t_begin = Instant::now();
        let begun = self
            .host_search
            .workers()
            .map(self.ranks.iter_mut().zip(&found).collect(), |(m, r)| tracing::debug_span!("search.begin").in_scope(|| m.begin_search(r, box_size)));
        begun.into_iter().collect::<Result<Vec<_>>>()?;
        Ok(LocalSearched { plan, found, lists, begin: t_begin.elapsed() })
    }
}

/// What the exchange chain needs of the run: the router, the exchange and the paths it follows,
/// the run's counters, where the ranks run and the run's configuration.
pub(super) struct ExchangeChain<'a> {
    pub(super) routing: &'a mut Option<Routing>,
    pub(super) exchange: &'a mut Option<Box<dyn Exchange>>,
    pub(super) exchange_plans: &'a mut Vec<crate::route::RoutedPaths>,
    pub(super) out: &'a mut MdOutcome,
    pub(super) placement: &'a Placement,
    pub(super) cfg: &'a MdConfig,
}

impl ExchangeChain<'_> {
    /// The exchange moved onto `halos`: under routing every rank's paths for them first (the same
    /// plans on every PE: across PEs `carried` by the redecomposition's plans where it ran, else
    /// gathered by the router's own collective); then replanned where every pair keeps its
    /// transport and the halos fit its buffers, else built anew. Whether it was replanned.
    pub(super) fn run(self, halos: Vec<RankHalo>, carried: Option<&[Vec<u8>]>, path: SearchPath) -> Result<bool> {
        let plans = match (self.routing.as_mut(), carried) {
            (Some(r), Some(gathered)) => {
                Some(tracing::debug_span!("search.route").in_scope(|| r.plan_gathered(&halos, gathered).map(<[_]>::to_vec))?)
            }
            (Some(r), None) => Some(tracing::debug_span!("search.route").in_scope(|| r.plan::<Float3>(&halos).map(<[_]>::to_vec))?),
            (None, _) => None,
        };
        let same_paths = plans.as_ref().is_none_or(|p| same_transports(p, self.exchange_plans));
        // How the replan is fenced across PEs (`replan_fence`): on the redecomposed path every PE
        // settled its streams (`settle`, or the safe point's) before it entered the
        // redecomposition's all-gathers (`TAG_MIGRATE` always runs across PEs, then one per pulse
        // and `TAG_PLAN`; under routing the plans' all-gather follows), a PE leaves an all-gather
        // only after every PE entered it, and nothing since launched a step or wrote into a peer
        // (the home read-back came before the gathers; the grids' and lists' first passes, begun
        // beside this chain, touch only each rank's own search buffers; the lists' writes and the
        // uploads come after the replan): the contract of `ReplanFence::AfterCollective`. The
        // gathered path keeps the barrier: its gather buffers are written by peers at the next
        // search, and that reuse is fenced by this barrier (`HomeGather::gather`). Ranks in one
        // process have no barrier.
        let fence = replan_fence(path);
        let _span = tracing::debug_span!("search.exchange").entered();
        // The halos go to the replan where they fit the buffers, else to a new exchange: asked
        // first, so that neither gets a copy (a copy of every rank's maps, cold at a search, is
        // tens of microseconds).
        let rebuild_from = match self.exchange.as_mut() {
            Some(ex) if same_paths && ex.fits(&halos) => {
                let barriers = ex.replan_barriers();
                let replanned = ex.replan_fenced(halos, fence)?;
                if !replanned {
                    return Err(HaloError::InvalidInput("the exchange refused a replan onto halos it said fit its buffers".into()));
                }
                self.out.replans += 1;
                self.out.replan_barriers += ex.replan_barriers().saturating_sub(barriers);
                None
            }
            _ => Some(halos),
        };
        let Some(halos) = rebuild_from else { return Ok(true) };
        // Free the old buffers first (collective, like the allocation that follows).
        *self.exchange = None;
        let mut ex = match &plans {
            Some(p) => self.placement.exchange_planned_with_headroom::<Float3>(halos, p, EXCHANGE_HEADROOM)?,
            None => self.placement.exchange_with_headroom::<Float3>(halos, EXCHANGE_HEADROOM)?,
        };
        if let Some(p) = &self.cfg.fault {
            ex = Box::new(crate::exchange::perturb::Perturbed::new(ex, p.clone())?);
        }
        ex.set_wait_timeout(self.cfg.wait_timeout);
        ex.check_transport(self.cfg.transport)?;
        *self.exchange = Some(ex);
        *self.exchange_plans = plans.unwrap_or_default();
        self.out.exchange_builds += 1;
        Ok(false)
    }
}
