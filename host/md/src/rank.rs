//! One rank's MD work on its GPU: the nbnxm pair forces (home–home on the local stream, pairs with a
//! halo atom on the halo stream), the leapfrog update, and the events that order them around the
//! halo exchange without any host synchronisation (docs/architecture.md, "One MD step").

use crate::abi::{self, Float3};
use crate::decomp::{Decomposition, GpuHome, GpuRank};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::exchange::RankExchange;
use crate::exchange::Transport;
use crate::gpu::{CudaEvent, CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape, Staging};
use crate::kernel_args;
use crate::kernels::MAX_GATHER_BLOCKS;
use crate::lookup::{InverseMassesKernel, enqueue_lookup};
use crate::nbnxm::gpu_search::grow;
use crate::nbnxm::{EnergySlot, HomeCopies, HomeOnDevice, Launch, ListKind, ListSetup, NbnxmGpu, ResidentSearch, TypesById};
use crate::phases::{Mark, PhaseProbe};
use crate::search::{RankLists, RankSearch};
use crate::zeroing::{StepZeroing, integration_clears_halo};
use cudarc::driver::CudaGraph;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one step does beyond the forces and the update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepWork {
    /// Prune the inner lists from the outer ones first (the search step and every `nstprune`
    /// steps after it).
    pub prune: bool,
    /// Sum the potential (force kernels) and kinetic (update) energy into this record of
    /// [`MdRank::energy_records`].
    pub energy: Option<usize>,
}

/// One energy record of a rank: potential and kinetic energy of its pairs and home atoms (kJ/mol).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EnergyRecord {
    /// Potential-shifted LJ energy of the pairs this rank computed.
    pub potential: f64,
    /// Kinetic energy of the home atoms at the force's time (leapfrog average).
    pub kinetic: f64,
}

/// One rank's MD buffers, lists, stream and events. Lives for the whole run; a search step
/// replaces its contents ([`Self::update`]).
pub struct MdRank {
    module: Arc<KernelModule>,
    nb: NbnxmGpu,
    /// Velocities of the home atoms.
    v: DeviceBuffer<Float3>,
    inv_mass: DeviceBuffer<f32>,
    /// Atom types of the home atoms (what a search on the GPU sorts into the grid's slots).
    types: DeviceBuffer<u32>,
    /// `1 / m` per atom type (`search::inverse_masses_by_type`): with the grid built on the GPU
    /// the home atoms' `inv_mass` is made from `types` on the device
    /// (`enqueue_lookup::<InverseMassesKernel>`).
    inv_by_type: DeviceBuffer<f32>,
    /// Every atom's type by global id ([`Self::set_types_by_id`]): with the home atoms merged on
    /// the GPU by its redecomposition, a search makes their types there from their ids instead of
    /// uploading them. `None`: uploaded.
    types_by_id: Option<DeviceBuffer<u32>>,
    /// `[potential, kinetic]` per record.
    energies: DeviceBuffer<f64>,
    home: usize,
    total: usize,
    /// Whether the home forces are zero when the next step starts: the integration clears them
    /// after using them (the kernels' `f = 0`), so every step after the first of a search
    /// interval starts without a memset; a search (new lists, maybe a new exchange and home count)
    /// clears this, and its first step zeroes them itself.
    forces_clear: bool,
    /// Whether the last integration also cleared the halo forces `f[home..total]` (its transport
    /// lets it: [`Transport::halo_forces_read_by_peer`] is `false`), so that a plain step needs no
    /// memset at all. Counts only together with `forces_clear`, which every search resets and the
    /// same integration sets ([`StepZeroing::plan`]).
    halo_clear: bool,
    /// This step's memsets, planned by its local work; the halo work zeroes the halo forces when
    /// they say so and waits for the local stream's zeroing when there was any.
    zeroing: StepZeroing,
    /// The local stream (home–home forces; the integration of a rank alone), normal priority.
    pub local: Arc<CudaStream>,
    home_forces_zeroed: CudaEvent,
    /// Recorded by the stream that does not integrate after its last work of the step (the
    /// home–home forces, or the force halo); the integrating stream waits for it
    /// ([`Self::integrate`]).
    join: CudaEvent,
    /// Which stream integrates a step with halo work.
    integrate_on: IntegrationStream,
    /// Recorded after the integration (on the stream that integrates), after a search's uploads
    /// and after a replayed graph (on the local stream); the next step's halo work is ordered
    /// after it.
    coordinates_ready: CudaEvent,
    /// Whether [`Self::coordinates_ready`] was last recorded by an uncaptured step's integration,
    /// on the halo stream: the next step's halo work then follows it by stream order and needs no
    /// wait for it ([`Self::begin_step`]).
    ready_on_halo: bool,
    /// Recorded on the exchange's stream after a search's staged home uploads ([`Self::update`]);
    /// the local stream waits for it before the steps ([`Self::order_after_uploads`]).
    uploaded: CudaEvent,
    /// The captured step's own events: the graph's start (the halo stream forks there), its
    /// zeroing, local-forces and integration events (the last joins the halo stream back).
    fork: CudaEvent,
    captured: [CudaEvent; 3],
    /// Page-locked staging of a search's uploads, kept for the whole run.
    staging: HomeStaging,
    /// The home atoms' redecomposition on this GPU (made at the first search that uses it): the
    /// new home atoms' velocities stay there and are copied into `v` ([`Self::update`]).
    gpu_home: Option<GpuHome>,
    /// The last search's host wait for the GPU grid's and lists' first passes
    /// ([`Self::search_wait`]).
    search_wait: Duration,
    /// While steps are profiled (`MdRun::profile_phases`): the timing events of their phases.
    probe: Option<PhaseProbe>,
}

/// Page-locked staging, one per array a search uploads from the host (home coordinates into the
/// exchange's `x`, velocities, `1 / m`, types; with the grid built on the GPU only velocities, and
/// those only when the GPU's redecomposition did not leave them there, [`MdRank::update`]): each
/// upload is a host copy into memory kept between searches and a copy enqueued on the exchange's
/// stream of the rank (no host wait per copy). One per array, so that no upload of a search waits
/// for another of the same search to land.
#[derive(Default)]
struct HomeStaging {
    x: Staging<Float3>,
    v: Staging<Float3>,
    inv_mass: Staging<f32>,
    types: Staging<u32>,
}

impl HomeStaging {
    /// Enqueues every home array of `found` on `halo`, the stream of `ex`: the coordinates into
    /// `ex`'s `x` (home elements only), the rest into the rank's buffers (grown for them).
    fn all(
        &mut self,
        found: &RankSearch,
        ex: &RankExchange,
        v: &DeviceBuffer<Float3>,
        inv_mass: &DeviceBuffer<f32>,
        types: &DeviceBuffer<u32>,
        halo: &CudaStream,
    ) -> Result<()> {
        ex.upload_coordinates_async(&found.home_x, &mut self.x, halo)?;
        self.velocities(found, v, halo)?;
        self.inv_mass.upload(&found.inv_mass, inv_mass, halo)?;
        self.types.upload(&found.home_types, types, halo)
    }

    /// Enqueues the home velocities of `found` on `halo`, unless they are on the GPU already
    /// (`found.home_on_device`).
    fn velocities(&mut self, found: &RankSearch, v: &DeviceBuffer<Float3>, halo: &CudaStream) -> Result<()> {
        if !found.home_on_device {
            self.v.upload(&found.home_v, v, halo)?;
        }
        Ok(())
    }
}

/// The home atoms of `g`'s last redecomposition as a grid build takes them on the device: their
/// coordinates, and their types from their ids where the rank has the table by id.
fn home_on_device<'a>(g: &'a GpuHome, by_id: Option<&'a DeviceBuffer<u32>>) -> HomeOnDevice<'a> {
    let types = by_id.map(|by_id| TypesById { ids: g.home_ids() as &dyn DeviceMemory<u32>, by_id: by_id as &dyn DeviceMemory<u32> });
    HomeOnDevice { x: g.positions(), types }
}

/// Which event set a step's launches use.
#[derive(Clone, Copy)]
enum Events {
    Step,
    Captured,
}

/// A step's events, in the order it records them.
#[derive(Clone, Copy)]
enum StepEvent {
    /// On the local stream after its memsets; the halo stream's force kernel waits for it.
    Zeroed,
    /// On the stream that does not integrate, after its last work of the step; the integration
    /// waits for it.
    Join,
    /// After the integration: on the halo stream when it integrates, and the local stream waits
    /// for it; on the local stream otherwise, for the halo stream's next step.
    Integrated,
}

/// Which of a rank's two streams integrates a step with halo work ([`MdRank::integrate`]; a rank
/// alone integrates on its local stream). Either way the local stream is ordered after the whole
/// step. The integration needs both chains' forces, and the next step's two chains both start
/// after it: one of them crosses streams at each end, the other follows it by stream order.
/// [`Self::for_ranks`] chooses by how the ranks are driven, from the measurements in
/// docs/benchmarks.md ("Strong scaling").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IntegrationStream {
    /// The halo stream, after a wait for the local forces: the force halo, the integration and
    /// the next coordinate halo follow one another there, and the local stream waits for the
    /// integration. The faster where measured with one PE per process (2 PEs sharing one GPU,
    /// whose halo chain of coordinate halo, forces with halo atoms and force halo sets the step;
    /// docs/benchmarks.md).
    #[default]
    Halo,
    /// The local stream, after a wait for the force halo: the home–home forces, the integration
    /// and the next home–home forces follow one another there (each launched to overlap the one
    /// before), and the halo stream waits for the integration. The faster where measured with
    /// several ranks in one process (two on one GPU; docs/benchmarks.md).
    Local,
}

impl IntegrationStream {
    /// The default for ranks driven one per process (PEs: [`Self::Halo`]) or several by one
    /// process ([`Self::Local`]), the faster of the two in each case where measured (one GPU
    /// shared; no pair of GPUs was measured).
    pub fn for_ranks(one_pe_per_process: bool) -> Self {
        if one_pe_per_process { Self::Halo } else { Self::Local }
    }

    /// `auto` (`None`: [`Self::for_ranks`] decides), `halo` or `local`.
    pub fn parse_choice(s: &str) -> Result<Option<Self>> {
        if s == "auto" { Ok(None) } else { Self::parse(s).map(Some) }
    }

    /// The choice named `halo` or `local`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "halo" => Ok(Self::Halo),
            "local" => Ok(Self::Local),
            other => Err(HaloError::InvalidInput(format!("integrate on the `{other}` stream: choose auto, halo or local"))),
        }
    }

    /// `halo` or `local`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Halo => "halo",
            Self::Local => "local",
        }
    }
}

impl MdRank {
    /// A rank's GPU state for its first search `found`: its lists (uploaded, or searched on the
    /// GPU from its grid), the LJ table and `1 / m` per type (`inv_by_type`,
    /// `search::inverse_masses_by_type`), room for `records` energy records per search interval,
    /// and the home arrays of `found` (coordinates into `ex`'s `x`, velocities, `1 / m`, types),
    /// all as [`Self::update`] does, from empty lists.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        module: Arc<KernelModule>,
        found: &RankSearch,
        lj: &[[f32; 2]],
        inv_by_type: &[f32],
        setup: &ListSetup,
        box_size: [f32; 3],
        records: usize,
        ex: &RankExchange,
        halo: &CudaStream,
    ) -> Result<Self> {
        let ctx = module.context().clone();
        if inv_by_type.is_empty() || inv_by_type.len() * inv_by_type.len() != lj.len() {
            return Err(HaloError::InvalidInput(format!(
                "{} inverse masses for an LJ table of {} entries: give one per atom type (search::inverse_masses_by_type)",
                inv_by_type.len(),
                lj.len()
            )));
        }
        let inv_table = DeviceBuffer::from_host(&ctx, inv_by_type)?;
        // A synchronous copy from pageable memory may return before its DMA lands, and the local
        // stream (non-blocking) would not follow it: wait once, here, before any search reads it.
        ctx.synchronize().during("waiting for the inverse masses' upload")?;
        let local = ctx.new_stream().during("creating the local stream")?;
        let event = || ctx.new_event(None).during("creating an event");
        let home = found.lists.home_atoms().max(1);
        // No grid and no lists yet: `update` below searches (or uploads) them.
        let nb = NbnxmGpu::new_resident(module.clone(), lj, setup, box_size)?;
        let mut me = Self {
            nb,
            v: DeviceBuffer::uninit(&ctx, home)?,
            inv_mass: DeviceBuffer::uninit(&ctx, home)?,
            types: DeviceBuffer::uninit(&ctx, home)?,
            inv_by_type: inv_table,
            types_by_id: None,
            energies: DeviceBuffer::zeroed(&ctx, 2 * records.max(1))?,
            home: 0,
            total: 0,
            forces_clear: false,
            halo_clear: false,
            zeroing: StepZeroing::plan(false, false, false),
            home_forces_zeroed: event()?,
            join: event()?,
            integrate_on: IntegrationStream::default(),
            coordinates_ready: event()?,
            ready_on_halo: false,
            uploaded: event()?,
            fork: event()?,
            captured: [event()?, event()?, event()?],
            staging: HomeStaging::default(),
            gpu_home: None,
            search_wait: Duration::ZERO,
            probe: None,
            local,
            module,
        };
        me.update(found, box_size, ex, halo)?;
        Ok(me)
    }

    /// Checks the home arrays of `found` against its home count and the exchange `ex`, and grows
    /// this rank's buffers for them; enqueues nothing. Then records the new counts.
    ///
    /// Why the growths are safe: the rank was idle when this search began (the search step waited
    /// for the local stream, which waited for the last search's [`Self::uploaded`]), and since then
    /// only [`Self::begin_search`]'s grid and count passes may have been enqueued, which read and
    /// write the grid's, the search's and the lists' own buffers, never these; so a freed buffer
    /// is no queued copy's target (a free may wait for those passes on the host, which costs
    /// nothing but that wait, and happens only when a buffer grows).
    fn fit_home(&mut self, found: &RankSearch, ex: &RankExchange) -> Result<()> {
        let from_device = matches!(found.lists, RankLists::GpuGrid(_));
        // Velocities left on the GPU by its redecomposition count as the home atoms'.
        let v_len = match (found.home_on_device, &self.gpu_home) {
            (false, _) => found.home_v.len(),
            (true, Some(g)) if from_device && found.home_v.is_empty() => g.home_atoms(),
            (true, _) => {
                return Err(HaloError::InvalidInput(format!(
                    "rank {}: velocities said to be on the GPU without its redecomposition, a grid on the GPU and no host velocities",
                    ex.rank()
                )));
            }
        };
        let lens = [found.home_x.len(), v_len, found.inv_mass.len(), found.home_types.len()];
        let home = home_arrays_fit(found.lists.home_atoms(), lens, from_device)?;
        if home > ex.halo().home_atoms {
            return Err(HaloError::InvalidInput(format!(
                "rank {}: {home} home coordinates for a layout of {} home atoms",
                ex.rank(),
                ex.halo().home_atoms
            )));
        }
        grow(&self.module, &mut self.v, home)?;
        grow(&self.module, &mut self.inv_mass, home)?;
        grow(&self.module, &mut self.types, home)?;
        self.home = home;
        self.total = found.lists.atoms();
        self.forces_clear = false;
        Ok(())
    }

    /// After the rank's search: the local stream waits for [`Self::uploaded`] (the staged home
    /// arrays and, recorded after them on the same stream, the replan's maps and metadata), so
    /// every later launch there sees them: the steps' force and update kernels, and a captured
    /// step, whose halo branch forks from the local stream inside the graph and so is ordered
    /// after this wait too. Then [`Self::coordinates_ready`] is recorded after that wait (and
    /// after the search's device copies of the home coordinates and types, earlier on the local
    /// stream), for the halo stream's next coordinate halo ([`Self::begin_step`]); the halo stream
    /// follows its own copies by stream order anyway. Enqueued after the search, so that the
    /// copies overlap the grid and list kernels on the local stream instead of delaying them.
    fn order_after_uploads(&mut self) -> Result<()> {
        self.local.wait(&self.uploaded).during("ordering the local stream after the search's uploads")?;
        self.ready_on_halo = false;
        self.coordinates_ready.record(&self.local).during("recording an event")
    }

    /// Replaces the lists (uploaded, or searched on the GPU on the local stream), home
    /// coordinates (in `ex`'s `x`), velocities, masses and types with those of a new search
    /// `found`; returns the time of the GPU search (zero for uploaded lists; with the grid built
    /// on the GPU it includes the host's staging of the velocities and the masses' launch, which
    /// overlap the GPU's passes). The rank must be idle (the search step synchronised its
    /// streams) but for a search [`Self::begin_search`] began with the same `found`, and `ex` the
    /// exchange the next steps use, replanned (or built) for `found`, with `halo` its stream for
    /// this rank.
    ///
    /// Where each home array comes from (`search_and_stage`):
    /// - lists from the host, or a grid from the host (`RankLists::Host`, `RankLists::Gpu`): all
    ///   four from `found`'s host arrays, through page-locked staging on `halo` (no host wait),
    ///   enqueued before the search, whose kernels never read them, so the DMA runs while the
    ///   local stream searches;
    /// - the grid built on the GPU (`RankLists::GpuGrid`): the coordinates and types by
    ///   device-to-device copies on the local stream from the grid's own upload of the local
    ///   atoms (home atoms first, the exchange's order; `NbnxmGpu::update_local_into`, or its
    ///   second half when [`Self::begin_search`] enqueued the first, which leaves the lists' write
    ///   pass running on the local stream), so they cross the bus once; `1 / m` made from those
    ///   types on the local stream (`enqueue_lookup::<InverseMassesKernel>`); the velocities
    ///   copied there from the GPU's redecomposition, or staged on `halo`, while the GPU runs the
    ///   grid's and the lists' first passes (before the search's first host wait).
    ///
    /// Then, also after a failure: `uploaded` is recorded on `halo` and the local stream
    /// waits for it (`order_after_uploads`). Nothing here waits on the host for the copies (nor,
    /// with the grid on the GPU, for the lists' write pass): the steps are ordered after them on
    /// the GPU (the local stream by stream order and that wait, the halo stream through
    /// `coordinates_ready`). A search through pageable synchronous copies (host lists, a grid
    /// from the host) still needs the caller's context synchronisation before the steps
    /// (`run.rs`).
    pub fn update(&mut self, found: &RankSearch, box_size: [f32; 3], ex: &RankExchange, halo: &CudaStream) -> Result<Duration> {
        // The caller may run each rank's update on a host thread of its own.
        let bound = self.module.context().bind_to_thread().during("binding the rank's GPU context");
        let fitted = bound.and_then(|()| tracing::debug_span!("search.update.fit_home").in_scope(|| self.fit_home(found, ex)));
        let searched = match fitted {
            Ok(()) => self.search_and_stage(found, box_size, ex, halo),
            Err(e) => Err(e),
        };
        // Always: whatever was enqueued on `halo` is then covered by the local stream's order.
        let recorded = self.uploaded.record(halo).during("recording the search's uploads");
        let ordered = self.order_after_uploads();
        let searched = searched?;
        recorded?;
        ordered?;
        Ok(searched)
    }

    /// The new lists of `found` and its home arrays (see [`Self::update`]); the time of a GPU
    /// search. Stops at the first error (whatever was enqueued stays enqueued: `update` orders
    /// it).
    fn search_and_stage(&mut self, found: &RankSearch, box_size: [f32; 3], ex: &RankExchange, halo: &CudaStream) -> Result<Duration> {
        let t = Instant::now();
        let Self { module, nb, staging, v, inv_mass, types, inv_by_type, types_by_id, local, gpu_home, home, search_wait, .. } = self;
        *search_wait = Duration::ZERO;
        match &found.lists {
            RankLists::Host(search) => {
                staging.all(found, ex, v, inv_mass, types, halo)?;
                nb.update(search, box_size)?;
                Ok(Duration::ZERO)
            }
            RankLists::Gpu(grid) => {
                staging.all(found, ex, v, inv_mass, types, halo)?;
                nb.update_on_gpu(grid, box_size, local)?;
                Ok(t.elapsed())
            }
            RankLists::GpuGrid(atoms) => {
                // Home atoms merged on this GPU by its redecomposition: the velocities copied on
                // the local stream, which ran that redecomposition and runs the steps (`fit_home`
                // checked the count), and the positions taken from there by the grid's build.
                let merged = gpu_home.as_ref().filter(|_| found.home_on_device);
                if let Some(g) = merged {
                    v.copy_prefix_from_async(g.velocities(), *home, local)?;
                }
                // Only home elements of `x` are written: peers may already store into this rank's
                // halo region (after the replan's fence: its barrier, or the search's all-gathers)
                // without conflict.
                let from = merged.map(|g| home_on_device(g, types_by_id.as_ref()));
                let n = *home;
                let copies = HomeCopies { x: &ex.x, types: &*types, from };
                // The masses after the types' copy on the local stream, enqueued while the GPU runs
                // the grid's passes.
                let mut before_wait = || {
                    staging.velocities(found, v, halo)?;
                    enqueue_lookup::<InverseMassesKernel>(module, types, inv_by_type, inv_mass, n, local)
                };
                let searched = if nb.begun() {
                    nb.finish_local(atoms, local, Some((copies.x, copies.types)), &mut before_wait)?
                } else {
                    nb.update_local_into(atoms, box_size, local, copies, &mut before_wait)?
                };
                *search_wait = searched.wait_time;
                Ok(t.elapsed())
            }
        }
    }

    /// The first half of a search whose grid is built on the GPU (`RankLists::GpuGrid`), on the
    /// local stream without a host wait: the grid of `found`'s local atoms (the home coordinates
    /// taken on the device from the GPU's redecomposition when `found.home_on_device`) and the
    /// lists' first passes enqueued up to the search's one read-back
    /// ([`NbnxmGpu::begin_local`]); the time it took. It needs nothing of the exchange, so the
    /// search step runs it before the router and the replan, which then overlap these passes;
    /// [`Self::update`] with the same `found` completes it. Other lists: nothing to begin
    /// ([`Self::update`] does the whole search). The rank must be idle.
    pub fn begin_search(&mut self, found: &RankSearch, box_size: [f32; 3]) -> Result<Duration> {
        let RankLists::GpuGrid(atoms) = &found.lists else { return Ok(Duration::ZERO) };
        let t = Instant::now();
        // The caller may run each rank's begin on a host thread of its own.
        self.module.context().bind_to_thread().during("binding the rank's GPU context")?;
        let from = self.gpu_home.as_ref().filter(|_| found.home_on_device).map(|g| home_on_device(g, self.types_by_id.as_ref()));
        self.nb.begin_local_checked(atoms, box_size, &self.local, from, found.home_checked)?;
        Ok(t.elapsed())
    }

    /// A search of a rank that has every atom (one rank, no halo) entirely on the GPU, on the
    /// local stream: the home coordinates `x` wrapped into the box in place, the cluster grid
    /// sorted and both lists searched there ([`NbnxmGpu::update_resident`]). The atoms keep their
    /// order, so velocities, masses, types and the exchange's plan stay as they are. Synchronous;
    /// its passes run behind whatever the local stream holds (finishing the search begun by
    /// [`Self::begin_search_resident_ahead`], where one was).
    pub fn search_resident(&mut self, x: &impl DeviceMemory<Float3>, box_size: [f32; 3]) -> Result<ResidentSearch> {
        self.without_halo("a search on the GPU alone")?;
        self.forces_clear = false;
        self.nb.update_resident(x, &self.types, self.home, box_size, &self.local)
    }

    /// The first half of [`Self::search_resident`] with the same `x` and box, enqueued on the
    /// local stream now, behind the steps enqueued so far and before anything waits for them
    /// (`NbnxmGpu::begin_resident`): the coordinates' wrap, the grid and the lists' first passes
    /// run right after the last step. The search then only finishes it.
    pub fn begin_search_resident_ahead(&mut self, x: &impl DeviceMemory<Float3>, box_size: [f32; 3]) -> Result<()> {
        self.without_halo("a search on the GPU alone")?;
        self.nb.begin_resident(x, &self.types, self.home, box_size, &self.local)
    }

    /// An error unless this rank has no halo atoms, which `what` (a search on the GPU alone, a
    /// step without halo work) needs.
    fn without_halo(&self, what: &str) -> Result<()> {
        if self.total != self.home {
            return Err(HaloError::InvalidInput(format!(
                "{what} needs a rank without halo atoms; this one has {} home and {} local atoms",
                self.home, self.total
            )));
        }
        Ok(())
    }

    /// This rank's home atoms as the device of a redecomposition on its GPU
    /// (`halo::decomp::redecompose_on_devices`), on the local stream: `x` the exchange's
    /// coordinates of rank `rank` (home atoms first), `ids` their global ids (the last plan's).
    /// Its passes run behind whatever the local stream holds (the last steps, where the migration
    /// was begun ahead: [`Self::begin_redecompose_ahead`]). The new home atoms' velocities stay on the GPU; the next
    /// [`Self::update`] with `RankSearch::home_on_device` copies them into place.
    pub fn home_device<'a>(&'a mut self, rank: usize, x: &'a (dyn DeviceMemory<Float3> + Sync), ids: &'a [u32]) -> Result<GpuRank<'a>> {
        if ids.len() != self.home {
            return Err(HaloError::InvalidInput(format!("rank {rank}: {} home ids for {} home atoms on its GPU", ids.len(), self.home)));
        }
        if self.gpu_home.as_ref().is_none_or(|g| g.rank() != rank) {
            self.gpu_home = Some(GpuHome::new(self.module.context(), rank)?);
        }
        let g = self.gpu_home.as_mut().ok_or_else(|| HaloError::InvalidInput(format!("rank {rank}: no GPU redecomposition state")))?;
        Ok(g.with(&self.module, &self.local, x, &self.v, ids))
    }

    /// Gives this rank every atom's type by global id (the system's `types`), uploaded once: a
    /// search whose home atoms a redecomposition merged on this GPU ([`Self::home_device`]) then
    /// makes their types there from their ids (kernel `types_by_id`), and its grid uploads only the
    /// halo atoms' types. The types must be the system's that the searches' local atoms are
    /// built from; a type at or past the LJ table's is refused. Synchronous.
    pub fn set_types_by_id(&mut self, types: &[u8]) -> Result<()> {
        let ntypes = self.inv_by_type.len();
        let wide: Vec<u32> = types.iter().map(|&t| u32::from(t)).collect();
        if let Some((id, t)) = crate::nbnxm::first_at_or_above(&wide, ntypes) {
            return Err(HaloError::InvalidInput(format!("atom {id} has type {t}, beyond the {ntypes} types of the LJ table")));
        }
        let ctx = self.module.context();
        let table = DeviceBuffer::from_host(ctx, &wide)?;
        // A synchronous copy from pageable memory may return before its DMA lands, and the local
        // stream (non-blocking) would not follow it: wait once, here.
        ctx.synchronize().during("waiting for the types' upload")?;
        self.types_by_id = Some(table);
        Ok(())
    }

    /// Enqueues this rank's part of the next redecomposition's migration on the local stream
    /// now, behind the steps enqueued so far and before anything waits for them
    /// ([`GpuRank::begin_ahead`]): the arguments are [`Self::home_device`]'s, and the search's
    /// own `home_device` with the same ones takes it up. Until then the caller keeps `x` and `ids`
    /// as they are.
    pub fn begin_redecompose_ahead(&mut self, rank: usize, x: &(dyn DeviceMemory<Float3> + Sync), ids: &[u32], geo: &Decomposition) -> Result<()> {
        self.home_device(rank, x, ids)?.begin_ahead(geo)
    }

    /// How many of this rank's redecompositions took their migration up from one begun ahead
    /// ([`Self::begin_redecompose_ahead`]).
    pub fn redecompose_ahead_taken(&self) -> u64 {
        self.gpu_home.as_ref().map_or(0, GpuHome::ahead_taken)
    }

    /// Forgets a migration begun ahead ([`Self::begin_redecompose_ahead`]) that its search did not
    /// take up.
    pub fn discard_redecompose_ahead(&mut self) {
        if let Some(g) = self.gpu_home.as_mut() {
            g.discard_ahead();
        }
    }

    /// Of the last [`Self::update`]'s search time, the host's wait for the GPU grid's and lists'
    /// first passes ([`ResidentSearch::wait_time`]; zero for lists from the host).
    pub fn search_wait(&self) -> Duration {
        self.search_wait
    }

    /// The nbnxm lists on the GPU.
    pub fn nbnxm(&self) -> &NbnxmGpu {
        &self.nb
    }

    /// Home atoms of the current search interval.
    pub fn home_atoms(&self) -> usize {
        self.home
    }

    /// Energy records this rank holds per search interval.
    pub fn energy_records(&self) -> usize {
        self.energies.len() / 2
    }

    fn check_exchange(&self, ex: &RankExchange) -> Result<()> {
        if ex.halo().home_atoms != self.home || ex.halo().total_atoms != self.total {
            return Err(HaloError::InvalidInput(format!(
                "rank {}: the exchange has {} home / {} local atoms, the lists {} / {}",
                ex.rank(),
                ex.halo().home_atoms,
                ex.halo().total_atoms,
                self.home,
                self.total
            )));
        }
        Ok(())
    }

    fn slot(&self, record: usize, which: usize) -> Result<EnergySlot<'_>> {
        EnergySlot::new(&self.energies, 2 * record + which)
    }

    /// First half of a step, before the coordinate halo. Local stream: zero the home forces unless
    /// the last integration cleared them (and zero the energy record), prune the local list on
    /// prune steps, home–home forces. The halo stream then waits for `coordinates_ready` (the
    /// coordinate halo reads home coordinates): after a search for its home coordinates on the
    /// local stream, after a captured step for the graph there, after an uncaptured step for the
    /// integration, unless that ran on the halo stream itself ([`IntegrationStream::Halo`]),
    /// which then follows it by stream order: no wait.
    pub fn begin_step(&mut self, ex: &RankExchange, halo: &CudaStream, work: StepWork) -> Result<()> {
        self.local_work(ex, work, Some(Events::Step))?;
        if !self.ready_on_halo {
            halo.wait(&self.coordinates_ready).during("ordering the halo after the search or a captured step")?;
        }
        self.mark(Mark::HaloBegin, halo)
    }

    /// [`Self::begin_step`] of a rank alone: one rank in all, whose exchange has no pulse and
    /// which has no halo atom. Only the local work, on the local stream: no halo stream, so no
    /// event between the kernels, and each is launched to overlap the one before
    /// (`Launch::AfterKernel`), across steps too ([`Self::integrate_alone`]). An error for a rank
    /// with a halo.
    pub fn begin_step_alone(&mut self, ex: &RankExchange, work: StepWork) -> Result<()> {
        self.alone(ex)?;
        self.local_work(ex, work, None)?;
        // A profiled step records every mark: the halo's, empty, on the local stream.
        for mark in [Mark::HaloBegin, Mark::CoordHalo, Mark::NonLocalPrune, Mark::NonLocalForces, Mark::ForceHalo] {
            self.mark(mark, &self.local)?;
        }
        Ok(())
    }

    /// [`Self::integrate`] of a rank alone ([`Self::begin_step_alone`]): the integration right
    /// after the local forces on the local stream, with no wait for a halo stream, and no event
    /// recorded after it: nothing on another stream follows these steps (the search that ends
    /// them synchronises the local stream first, `MdRun`'s settle).
    pub fn integrate_alone(&mut self, ex: &RankExchange, transport: Transport, dt: f32, work: StepWork) -> Result<()> {
        self.alone(ex)?;
        // Launched to overlap the local forces before it: the kernel waits for them first.
        let local = self.local.clone();
        self.leapfrog(ex, &local, Launch::AfterKernel, transport, dt, work)?;
        self.mark(Mark::End, &self.local)
    }

    /// An error unless this rank is alone: no pulse in `ex`, no halo atom.
    fn alone(&self, ex: &RankExchange) -> Result<()> {
        if !ex.halo().pulses.is_empty() {
            return Err(HaloError::InvalidInput(format!(
                "rank {}: a step without halo work for a rank with {} pulses",
                ex.rank(),
                ex.halo().pulses.len()
            )));
        }
        self.without_halo("a step without halo work")
    }

    /// The local stream's part of a step. `events`: where the halo stream's force kernel waits
    /// for this step's zeroing (`None`: no halo work follows, nothing to record).
    fn local_work(&mut self, ex: &RankExchange, work: StepWork, events: Option<Events>) -> Result<()> {
        self.check_exchange(ex)?;
        self.mark(Mark::Begin, &self.local)?;
        let zeroing = StepZeroing::plan(self.forces_clear, self.halo_clear, work.energy.is_some());
        if zeroing.home {
            ex.f.zero_range_async(0, self.home, &self.local)?;
        }
        if let Some(r) = work.energy {
            self.energies.zero_range_async(2 * r, 2, &self.local)?;
        }
        // Both force kernels add into home forces and the energy record: the halo stream's kernel
        // waits for this event. With nothing zeroed here (the last integration cleared the forces,
        // no energy) the halo stream is already ordered after that integration
        // (`coordinates_ready`), and the event and its wait would be two host calls for nothing.
        self.zeroing = zeroing;
        if let Some(events) = events.filter(|_| zeroing.on_local()) {
            self.event(events, StepEvent::Zeroed).record(&self.local).during("recording an event")?;
        }
        // The local stream's kernels (the prune, the forces, the integration) let no kernel after
        // them start early, and each waits for the one before it: each is launched to overlap the
        // end of the one before (after a memset or an event it is a plain launch).
        if work.prune {
            self.nb.prune(ListKind::Local, &ex.x, &self.local, Launch::AfterKernel)?;
        }
        self.mark(Mark::LocalPrune, &self.local)?;
        let slot = work.energy.map(|r| self.slot(r, 0)).transpose()?;
        self.nb.forces_into(ListKind::Local, &ex.x, &ex.f, &self.local, slot, Launch::AfterKernel)?;
        self.mark(Mark::LocalForces, &self.local)
    }

    /// Records `mark` of the profiled step on `stream` (nothing when no step is profiled).
    pub fn mark(&self, mark: Mark, stream: &CudaStream) -> Result<()> {
        self.probe.as_ref().map_or(Ok(()), |p| p.mark(mark, stream))
    }

    /// Starts profiling this rank's uncaptured steps (timing events at every [`Mark`]), or ends it
    /// and returns what was profiled (`on` false).
    pub fn profile(&mut self, on: bool) -> Result<Option<PhaseProbe>> {
        let mut was = self.probe.take();
        if let Some(p) = was.as_mut() {
            p.flush()?;
        }
        if on {
            self.probe = Some(PhaseProbe::new(self.module.context())?);
        }
        Ok(was)
    }

    /// Ends profiling without reading the events back (after a failed step: the error that
    /// ended it is the one to report).
    pub fn discard_profile(&mut self) {
        self.probe = None;
    }

    /// Forgets what was profiled so far and goes on profiling (the steps a rollback runs again).
    pub fn restart_profile(&mut self) {
        if let Some(p) = self.probe.as_mut() {
            p.restart();
        }
    }

    /// Ends the profiled step (after [`Self::integrate`]); `keep`: count it.
    pub fn end_profiled_step(&mut self, keep: bool) -> Result<()> {
        self.probe.as_mut().map_or(Ok(()), |p| p.end_step(keep))
    }

    /// The step's event `which`. A captured step has its own, so the events of uncaptured steps
    /// never belong to a graph.
    fn event(&self, events: Events, which: StepEvent) -> &CudaEvent {
        match events {
            Events::Step => match which {
                StepEvent::Zeroed => &self.home_forces_zeroed,
                StepEvent::Join => &self.join,
                StepEvent::Integrated => &self.coordinates_ready,
            },
            Events::Captured => &self.captured[which as usize],
        }
    }

    /// After the coordinate halo, on the halo stream: zero the halo forces unless the last
    /// integration cleared them (a transport whose peers read them keeps this memset, which the
    /// coordinate halo orders after the peers' previous force halo), wait for the home-force
    /// zeroing, prune the non-local list on prune steps, then the forces of pairs with a halo atom.
    pub fn nonlocal_forces(&mut self, ex: &RankExchange, halo: &CudaStream, work: StepWork) -> Result<()> {
        self.halo_work(ex, halo, work, Events::Step)
    }

    fn halo_work(&mut self, ex: &RankExchange, halo: &CudaStream, work: StepWork, events: Events) -> Result<()> {
        if self.zeroing.halo {
            ex.f.zero_range_async(self.home, self.total - self.home, halo)?;
        }
        if self.zeroing.on_local() {
            halo.wait(self.event(events, StepEvent::Zeroed)).during("ordering non-local forces after the zeroing")?;
        }
        // Plain launches: the kernel before them on the halo stream is the coordinate halo, whose
        // fused kernels let the next one start early (`Launch::AfterKernel`).
        if work.prune {
            self.nb.prune(ListKind::NonLocal, &ex.x, halo, Launch::Plain)?;
        }
        self.mark(Mark::NonLocalPrune, halo)?;
        let slot = work.energy.map(|r| self.slot(r, 0)).transpose()?;
        self.nb.forces_into(ListKind::NonLocal, &ex.x, &ex.f, halo, slot, Launch::Plain)?;
        self.mark(Mark::NonLocalForces, halo)
    }

    /// After the force halo: the integrating stream ([`Self::set_integration_stream`]) waits for
    /// the other one's last work of the step and integrates the home atoms (adding the kinetic
    /// energy on energy steps), clearing the home forces and, where `transport` lets it, the halo
    /// forces; the local stream is then ordered after the integration (by stream order, or by its
    /// wait for it), so that it orders the whole step (the next step's local work, a search's
    /// read-back, the checks).
    pub fn integrate(&mut self, ex: &RankExchange, halo: &CudaStream, transport: Transport, dt: f32, work: StepWork) -> Result<()> {
        self.ready_on_halo = false;
        self.update_work(ex, halo, transport, dt, work, Events::Step)?;
        match self.integrate_on {
            // Recorded on the halo stream by the integration there.
            IntegrationStream::Halo => self.ready_on_halo = true,
            IntegrationStream::Local => self.coordinates_ready.record(&self.local).during("recording an event")?,
        }
        Ok(())
    }

    /// Which stream integrates the steps with halo work from now on.
    pub fn set_integration_stream(&mut self, on: IntegrationStream) {
        self.integrate_on = on;
    }

    fn update_work(&mut self, ex: &RankExchange, halo: &CudaStream, transport: Transport, dt: f32, work: StepWork, events: Events) -> Result<()> {
        let local = self.local.clone();
        // On the halo stream a plain launch: the kernel before it there is the force halo, whose
        // fused kernel lets the next kernel start once its blocks are resident (blocks parked that
        // early would hold room that the peers' spinning grids are counted on), and the wait
        // stands between them anyway. On the local stream it overlaps the end of the local forces
        // where the wait is met by then.
        let (on, other, launch) = match self.integrate_on {
            IntegrationStream::Halo => (halo, &*local, Launch::Plain),
            IntegrationStream::Local => (&*local, halo, Launch::AfterKernel),
        };
        let join = self.event(events, StepEvent::Join);
        join.record(other).during("recording an event")?;
        on.wait(join).during("ordering integration after both chains")?;
        self.leapfrog(ex, on, launch, transport, dt, work)?;
        self.mark(Mark::End, on)?;
        if self.integrate_on == IntegrationStream::Halo {
            let integrated = self.event(events, StepEvent::Integrated);
            integrated.record(halo).during("recording an event")?;
            local.wait(integrated).during("ordering the local stream after integration")?;
        }
        Ok(())
    }

    /// The integration on `stream`, after whatever orders it there, launched as `launch` says.
    fn leapfrog(&mut self, ex: &RankExchange, stream: &CudaStream, launch: Launch, transport: Transport, dt: f32, work: StepWork) -> Result<()> {
        self.mark(Mark::Integrate, stream)?;
        // The halo forces too, in the same launch, where only this rank's force halo (done by now)
        // reads them.
        let clears_halo = integration_clears_halo(transport);
        let halo_atoms = if clears_halo { self.total - self.home } else { 0 };
        let items = self.home + halo_atoms;
        if items > 0 {
            // The kernel's one index space `0..home + halo_atoms` is a `u32`.
            if u32::try_from(items).is_err() {
                return Err(HaloError::InvalidInput(format!("rank {}: {items} atoms to integrate and clear do not fit in u32", ex.rank())));
            }
            let (mut x, mut v, mut f, mut m, mut n, mut dt) =
                (ex.x.device_ptr(), self.v.device_ptr(), ex.f.device_ptr(), self.inv_mass.device_ptr(), self.home as u32, dt);
            let (mut clear_from, mut clear_n) = (self.home as u32, halo_atoms as u32);
            let shape = LaunchShape::for_items(items, MAX_GATHER_BLOCKS);
            match work.energy {
                None => {
                    let mut args = kernel_args![x, v, f, m, n, dt, clear_from, clear_n];
                    // SAFETY: arguments match `leapfrog`; every buffer holds at least `home` elements
                    // and `f` at least `total` (`check_exchange`); the ranges `..home` and
                    // `home..total` do not overlap. Nothing else touches these forces until the next
                    // step's force kernels, which are ordered after this one: on `stream` by stream
                    // order, on the other stream by its wait for the integration's event (or a
                    // graph's order); their last readers, this step's force kernels, force halo and
                    // the check between it and here, are done (stream order and the wait for the
                    // local forces; no peer reads the halo forces when `clears_halo`).
                    // With `Launch::AfterKernel` the kernel waits for the kernel before it first.
                    unsafe { launch.launch(&self.module, abi::LEAPFROG, shape, stream, &mut args)? };
                }
                Some(r) => {
                    let mut ke = self.slot(r, 1)?.ptr();
                    let mut args = kernel_args![x, v, f, m, n, dt, clear_from, clear_n, ke];
                    // SAFETY: arguments match `leapfrog_energy`; as above, `ke` is inside `energies`.
                    unsafe { launch.launch(&self.module, abi::LEAPFROG_ENERGY, shape, stream, &mut args)? };
                }
            }
        }
        // The update cleared the home forces (with no home atoms there is nothing to clear), and
        // the halo forces where the transport lets it.
        self.forces_clear = true;
        self.halo_clear = clears_halo;
        Ok(())
    }

    /// One step without energy (`work.energy` must be `None`; with `work.prune` the prune kernels
    /// too) of this rank captured as a CUDA graph on the local stream: the local work, the halo stream forked from the graph's start (the graph, launched
    /// on the local stream, starts after the previous step's integration), this rank's coordinate
    /// halo, the forces with halo atoms, its force halo, and the integration, joined back into the
    /// local stream. Nothing runs now; [`Self::launch_graph`] replays it. Valid until the next
    /// search (new lists and launch shapes): capture again then. GPU-initiated transports only
    /// (the exchange's launches carry no step counter: docs/protocol.md, "Graphs").
    ///
    /// The graph holds the memsets this step needs now ([`StepZeroing::plan`]): captured right
    /// after a search, those of both force ranges (redundant on later replays); captured after an
    /// integration that cleared the forces, none, relying on the integration before each replay,
    /// which every step of the search interval ends with (the graph's own included), so the
    /// graph must not be replayed after the next search (`crate::zeroing`).
    pub fn capture_step(
        &mut self,
        ex: &mut RankExchange,
        halo: &Arc<CudaStream>,
        transport: Transport,
        dt: f32,
        work: StepWork,
    ) -> Result<CudaGraph> {
        if !transport.gpu_initiated() {
            return Err(HaloError::InvalidInput(format!("the {} transport is host-driven and cannot be captured", transport.name())));
        }
        if work.energy.is_some() {
            return Err(HaloError::InvalidInput(
                "a step that sums energies writes its own record and cannot be replayed from a graph; capture steps without energy".into(),
            ));
        }
        if self.probe.is_some() {
            return Err(HaloError::InvalidInput("a profiled step is timed by events between its phases and cannot be captured as a graph".into()));
        }
        // Thread-local mode: other threads' CUDA calls stay legal during the capture.
        self.local.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).during("starting a graph capture")?;
        let mut queue = || -> Result<()> {
            self.fork.record(&self.local).during("recording an event")?;
            halo.wait(&self.fork).during("forking the halo stream into the capture")?;
            self.local_work(ex, work, Some(Events::Captured))?;
            ex.launch_coordinates(transport, halo)?;
            self.halo_work(ex, halo, work, Events::Captured)?;
            ex.launch_forces(halo)?;
            self.update_work(ex, halo, transport, dt, work, Events::Captured)
        };
        let queued = queue();
        // Always end the capture, or the stream stays in capture mode.
        let graph = self.local.end_capture(CUgraphInstantiate_flags(0)).during("ending a graph capture");
        queued?;
        let graph = graph?.ok_or_else(|| HaloError::InvalidInput("the captured step is empty".into()))?;
        graph.upload().during("uploading a graph")?;
        Ok(graph)
    }

    /// Replays a step captured by [`Self::capture_step`] on the local stream, then marks the
    /// integration done for the next uncaptured step's halo work.
    pub fn launch_graph(&mut self, graph: &CudaGraph) -> Result<()> {
        self.ready_on_halo = false;
        graph.launch().during("launching a captured step")?;
        self.coordinates_ready.record(&self.local).during("recording an event")
    }

    /// The first `n` energy records (synchronous; call when the rank is idle).
    pub fn read_energies(&self, n: usize) -> Result<Vec<EnergyRecord>> {
        let all = self.energies.to_host()?;
        Ok(all.chunks_exact(2).take(n).map(|c| EnergyRecord { potential: c[0], kinetic: c[1] }).collect())
    }

    /// The device buffer of the home velocities (its first [`Self::home_atoms`] elements).
    pub fn velocity_buffer(&self) -> &DeviceBuffer<Float3> {
        &self.v
    }

    /// The device buffer of the home atoms' types (its first [`Self::home_atoms`] elements).
    pub fn type_buffer(&self) -> &DeviceBuffer<u32> {
        &self.types
    }

    /// The device buffer of the home atoms' `1 / m` (its first [`Self::home_atoms`] elements).
    pub fn inv_mass_buffer(&self) -> &DeviceBuffer<f32> {
        &self.inv_mass
    }

    /// Waits for the local stream.
    pub fn synchronize(&self) -> Result<()> {
        self.local.synchronize().during("waiting for the local stream")
    }
}

/// The home count of a search whose home arrays hold `lens` = [coordinates, velocities, `1 / m`,
/// types] elements for `home` home atoms: an error unless every array holds exactly `home`, or,
/// `from_device` (the GPU copies the coordinates and types from its grid's upload and makes the
/// masses from the types), unless the velocities hold `home` and the others none (checked before
/// anything of the search is enqueued or grown).
fn home_arrays_fit(home: usize, lens: [usize; 4], from_device: bool) -> Result<usize> {
    let host = if from_device { 0 } else { home };
    let [x, v, m, t] = lens;
    if [x, m, t] != [host; 3] || v != home {
        let source = if from_device { ", coordinates, types and masses from the GPU's grid" } else { "" };
        return Err(HaloError::InvalidInput(format!("{x} coordinates, {v} velocities, {m} masses and {t} types for {home} home atoms{source}")));
    }
    Ok(home)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_integration_stream_is_named_halo_or_local() {
        for on in [IntegrationStream::Halo, IntegrationStream::Local] {
            assert_eq!(IntegrationStream::parse(on.name()).unwrap(), on);
        }
        assert_eq!(IntegrationStream::default(), IntegrationStream::Halo);
        let e = IntegrationStream::parse("update").unwrap_err().to_string();
        assert!(e.contains("`update`") && e.contains("choose auto, halo or local"), "{e}");
        assert_eq!(IntegrationStream::parse_choice("auto").unwrap(), None);
        assert_eq!(IntegrationStream::parse_choice("local").unwrap(), Some(IntegrationStream::Local));
        assert!(IntegrationStream::parse_choice("update").is_err());
        assert_eq!(IntegrationStream::for_ranks(true), IntegrationStream::Halo);
        assert_eq!(IntegrationStream::for_ranks(false), IntegrationStream::Local);
    }

    #[test]
    fn home_arrays_must_all_hold_the_home_atoms() {
        assert_eq!(home_arrays_fit(0, [0; 4], false).unwrap(), 0);
        assert_eq!(home_arrays_fit(22_500, [22_500; 4], false).unwrap(), 22_500);
        for short in 0..4 {
            let mut lens = [7; 4];
            lens[short] = 6;
            let e = home_arrays_fit(7, lens, false).unwrap_err().to_string();
            assert!(e.contains("for 7 home atoms"), "{e}");
            lens[short] = 8;
            assert!(home_arrays_fit(7, lens, false).is_err(), "one array too long");
        }
    }

    #[test]
    fn with_the_grid_on_the_gpu_only_velocities_come_from_the_host() {
        assert_eq!(home_arrays_fit(0, [0; 4], true).unwrap(), 0);
        assert_eq!(home_arrays_fit(22_500, [0, 22_500, 0, 0], true).unwrap(), 22_500);
        // Host coordinates, masses or types would be ignored: refused instead.
        let e = home_arrays_fit(7, [7; 4], true).unwrap_err().to_string();
        assert!(e.contains("7 coordinates") && e.contains("from the GPU's grid"), "{e}");
        assert!(home_arrays_fit(7, [0, 7, 0, 7], true).is_err(), "types from the host");
        assert!(home_arrays_fit(7, [0, 7, 7, 0], true).is_err(), "masses from the host");
        assert!(home_arrays_fit(7, [0, 6, 0, 0], true).is_err(), "a velocity short");
        assert!(home_arrays_fit(7, [0, 8, 0, 0], true).is_err(), "a velocity too many");
        assert!(home_arrays_fit(7, [0, 7, 0, 0], false).is_err(), "host lists need host coordinates");
    }
}
