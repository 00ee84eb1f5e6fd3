//! The memory an exchange needs, checked before anything is allocated, so that running out of
//! it ends every rank at once with a message that names the need and the fix, instead of one PE
//! failing inside a collective allocation while the others wait for it.
//!
//! - **NVSHMEM's symmetric heap.** halo keeps its symmetric buffers within
//!   `NVSHMEM_SYMMETRIC_SIZE` itself ([`HeapConfig`], [`check_heap`]). NVSHMEM 3.4.5 does not:
//!   with CUDA VMM (its default on x86) the heap is a reservation of `NVSHMEM_MAX_MEMORY_PER_GPU`
//!   that grows on demand in steps of `NVSHMEM_CUMEM_GRANULARITY` (512 MiB), so the variable
//!   bounds nothing; with `NVSHMEM_DISABLE_CUDA_VMM=1` the heap is allocated once at start-up,
//!   `NVSHMEM_SYMMETRIC_SIZE` plus NVSHMEM's own buffers rounded up to 2 GiB, so at least
//!   `NVSHMEM_SYMMETRIC_SIZE` is left for halo either way. The check is a pure function of the
//!   halos and the environment, so every PE reaches the same verdict with no communication, and
//!   [`Mem`](super::memory::Mem) charges every symmetric buffer against the same budget
//!   ([`check_allocation`]) as a backstop.
//! - **Device memory.** Each rank compares what its buffers need (and, under VMM, one growth step
//!   of the heap) with its GPU's free memory ([`check_device`]). Free memory differs between PEs,
//!   so the verdicts are agreed ([`agree`]) through `halo launch`'s rendezvous before anyone
//!   allocates: if one PE cannot, every PE returns the same error naming it. (Under mpiexec or srun
//!   there is no rendezvous: the PE that cannot returns its error and exits, and the launcher ends
//!   the job.)
//! - **Tests.** `HALO_TEST_RESERVE_GIB=G[:RANK]` makes `halo exchange-check` hold `G` GiB of the
//!   GPU first ([`reserve_for_test`]), so exhausted device memory can be tried on an H200.

use super::Element;
use super::rank::SharedSizes;
use crate::desc::RankHalo;
use crate::error::{HaloError, Result};
use crate::gpu::{CudaContext, DeviceBuffer, KernelModule};
use crate::launch::{LaunchError, Rendezvous};
use kernels_gpu::abi::{COUNTERS_PER_PULSE, ProtocolState, PulseMeta, SIGNAL_SLOTS_PER_PULSE, WaitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// NVSHMEM's heap size variable.
pub const SYMMETRIC_SIZE_ENV: &str = "NVSHMEM_SYMMETRIC_SIZE";
/// NVSHMEM's switch from the growing (CUDA VMM) heap to a static one.
pub const DISABLE_VMM_ENV: &str = "NVSHMEM_DISABLE_CUDA_VMM";
/// NVSHMEM's growth step of the VMM heap.
pub const GRANULARITY_ENV: &str = "NVSHMEM_CUMEM_GRANULARITY";
/// Test only: GiB of device memory `halo exchange-check` holds before it builds the exchange.
pub const RESERVE_ENV: &str = "HALO_TEST_RESERVE_GIB";

/// `NVSHMEM_SYMMETRIC_SIZE` when unset (1 GiB).
pub const DEFAULT_SYMMETRIC_SIZE: u64 = 1 << 30;
/// `NVSHMEM_CUMEM_GRANULARITY` when unset (512 MiB).
pub const DEFAULT_GRANULARITY: u64 = 512 << 20;
/// The largest growth step NVSHMEM uses, whatever the variable says (2 GiB).
pub const MAX_GRANULARITY: u64 = 2 << 30;
/// What one symmetric allocation may cost beyond its bytes: halo aligns to 256 bytes, and the
/// allocator keeps a header per chunk.
pub const ALLOC_SLACK: u64 = 512;
/// Device memory [`reserve_for_test`] always leaves free (the context's own needs).
const RESERVE_LEAVES_FREE: u64 = 256 << 20;

/// `bytes` for people: `512 B`, `3.0 KiB`, `23.4 MiB`, `1.50 GiB`.
pub fn human(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if bytes < 1024 {
        format!("{bytes} B")
    } else if b < KIB * KIB {
        format!("{:.1} KiB", b / KIB)
    } else if b < KIB * KIB * KIB {
        format!("{:.1} MiB", b / (KIB * KIB))
    } else {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    }
}

/// Parses a size as NVSHMEM reads its size variables: a number (decimals allowed, `.5` too),
/// then at most one of `k`, `m`, `g`, `t` (either case, powers of 1024), the product rounded up;
/// NVSHMEM ignores anything after the multiplier, and so does this.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, rest) = s.split_at(end);
    let value: f64 = number.parse().map_err(|_| format!("`{s}` is not a size: write bytes, or a number with k, m, g or t, e.g. 512M or 2G"))?;
    let multiplier: u64 = match rest.chars().next().map(|c| c.to_ascii_lowercase()) {
        None => 1,
        Some('k') => 1 << 10,
        Some('m') => 1 << 20,
        Some('g') => 1 << 30,
        Some('t') => 1 << 40,
        Some(c) => return Err(format!("`{s}` is not a size: `{c}` is not a multiplier (k, m, g or t), e.g. 512M or 2G")),
    };
    let bytes = (value * multiplier as f64).ceil();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("`{s}` is too large a size"));
    }
    Ok(bytes as u64)
}

/// A size to suggest for `NVSHMEM_SYMMETRIC_SIZE` when `bytes` are needed: a quarter more, rounded
/// up to a power of two in MiB below 1 GiB, to whole GiB above (`8M`, `3G`).
pub fn suggest_size(bytes: u64) -> String {
    let want = bytes.saturating_add(bytes / 4);
    let mib = want.div_ceil(1 << 20).max(1);
    if mib <= 1024 { format!("{}M", mib.next_power_of_two()) } else { format!("{}G", want.div_ceil(1 << 30)) }
}

/// How NVSHMEM's heap is configured here, from its variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapConfig {
    /// The budget for halo's symmetric buffers: `NVSHMEM_SYMMETRIC_SIZE` in bytes.
    pub symmetric_size: u64,
    /// `NVSHMEM_SYMMETRIC_SIZE` as written (`None`: unset).
    pub symmetric_setting: Option<String>,
    /// Whether the heap grows through CUDA VMM (NVSHMEM's default; off with `NVSHMEM_DISABLE_CUDA_VMM=1`).
    pub vmm: bool,
    /// The growth step of a VMM heap.
    pub granularity: u64,
}

/// Whether NVSHMEM reads `value` of a boolean variable as true.
fn nvshmem_true(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "y" | "yes" | "t" | "true" | "on")
}

impl HeapConfig {
    /// From the values of [`SYMMETRIC_SIZE_ENV`], [`DISABLE_VMM_ENV`] and [`GRANULARITY_ENV`].
    pub fn from_values(symmetric: Option<&str>, disable_vmm: Option<&str>, granularity: Option<&str>) -> Result<Self> {
        let bad = |name: &str, e: String| HaloError::InvalidInput(format!("{name}: {e}"));
        let symmetric = symmetric.map(str::trim).filter(|s| !s.is_empty());
        let symmetric_size = symmetric.map(parse_size).transpose().map_err(|e| bad(SYMMETRIC_SIZE_ENV, e))?.unwrap_or(DEFAULT_SYMMETRIC_SIZE);
        let granularity = granularity.map(str::trim).filter(|s| !s.is_empty()).map(parse_size).transpose().map_err(|e| bad(GRANULARITY_ENV, e))?;
        Ok(Self {
            symmetric_size,
            symmetric_setting: symmetric.map(str::to_string),
            vmm: !disable_vmm.is_some_and(nvshmem_true),
            granularity: granularity.unwrap_or(DEFAULT_GRANULARITY).clamp(1, MAX_GRANULARITY),
        })
    }

    /// From this process's environment.
    pub fn from_env() -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok();
        Self::from_values(var(SYMMETRIC_SIZE_ENV).as_deref(), var(DISABLE_VMM_ENV).as_deref(), var(GRANULARITY_ENV).as_deref())
    }

    /// `NVSHMEM_SYMMETRIC_SIZE=1M (1.0 MiB)`, or that it is unset.
    pub fn setting(&self) -> String {
        match &self.symmetric_setting {
            Some(s) => format!("{SYMMETRIC_SIZE_ENV}={s} ({})", human(self.symmetric_size)),
            None => format!("{SYMMETRIC_SIZE_ENV} is unset (NVSHMEM's default, {})", human(self.symmetric_size)),
        }
    }
}

/// One buffer of an exchange: what it holds and its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// What it holds.
    pub what: &'static str,
    /// Its size.
    pub bytes: u64,
}

/// The buffers one rank's exchange allocates: those that are symmetric across PEs (on NVSHMEM's
/// heap; plain device memory in one process) and the plain ones (index maps, metadata).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// `x`, `f`, the staging and receive slots, the signals: the same sizes on every rank.
    pub symmetric: Vec<Buffer>,
    /// This rank's index maps, pulse metadata and protocol state.
    pub plain: Vec<Buffer>,
}

impl Footprint {
    /// What `RankExchange::new` allocates for `halo` with `sizes` and elements of type `T`.
    pub fn of<T: Element>(sizes: SharedSizes, halo: &RankHalo) -> Self {
        let elem = size_of::<T>() as u64;
        let n = sizes.pulses.max(1) as u64;
        let slots = 2 * n * sizes.slot_atoms as u64 * elem;
        let recv_slots = super::rank::RECV_SLOT_FACTOR as u64 * slots;
        let atoms = sizes.atoms as u64 * elem;
        let maps: u64 = halo.pulses.iter().map(|p| p.index_map.len() as u64 * 4).sum();
        Self {
            symmetric: vec![
                Buffer { what: "coordinates", bytes: atoms },
                Buffer { what: "forces", bytes: atoms },
                Buffer { what: "coordinate staging slots", bytes: slots },
                Buffer { what: "force staging slots", bytes: slots },
                Buffer { what: "force receive slots", bytes: recv_slots },
                Buffer { what: "coordinate receive slots", bytes: recv_slots },
                Buffer { what: "signals", bytes: SIGNAL_SLOTS_PER_PULSE as u64 * n * 8 },
            ],
            plain: vec![
                Buffer { what: "index maps", bytes: maps.max(1) },
                Buffer {
                    what: "pulse metadata and protocol state",
                    bytes: n * size_of::<PulseMeta>() as u64
                        + size_of::<ProtocolState>() as u64
                        + COUNTERS_PER_PULSE as u64 * n * 4
                        + size_of::<WaitStatus>() as u64,
                },
            ],
        }
    }

    /// What `PeExchange::new` allocates on this PE's symmetric heap: [`Self::of`] plus the
    /// record the host-driven transports' links publish while they are set up
    /// (`pe_links::record_bytes`; freed at the end of the set-up, and of a replan that
    /// sets the links up again).
    pub fn of_pe<T: Element>(sizes: SharedSizes, halo: &RankHalo) -> Self {
        let mut f = Self::of::<T>(sizes, halo);
        f.symmetric.push(Buffer { what: "host-driven link record (set-up only)", bytes: super::pe_links::record_bytes(halo.pulses.len()) });
        f
    }

    /// This footprint without `x` and `f`: what an exchange on the caller's coordinates and forces
    /// allocates (`RankExchange::with_buffers`).
    pub fn without_caller_arrays(mut self) -> Self {
        self.symmetric.retain(|b| b.what != "coordinates" && b.what != "forces");
        self
    }

    /// The symmetric buffers' bytes as allocated ([`charged`] each).
    pub fn symmetric_bytes(&self) -> u64 {
        self.symmetric.iter().map(|b| charged(b.bytes)).sum()
    }

    /// The symmetric buffers' bytes, exactly as requested.
    pub fn symmetric_requested(&self) -> u64 {
        self.symmetric.iter().map(|b| b.bytes).sum()
    }

    /// The plain buffers' bytes.
    pub fn plain_bytes(&self) -> u64 {
        self.plain.iter().map(|b| b.bytes).sum()
    }

    /// `coordinates 23.4 MiB, forces 23.4 MiB, ...` for the symmetric buffers.
    pub fn describe_symmetric(&self) -> String {
        self.symmetric.iter().map(|b| format!("{} {}", b.what, human(b.bytes))).collect::<Vec<_>>().join(", ")
    }
}

/// What a symmetric buffer of `bytes` costs on the heap: rounded up to halo's 256-byte alignment,
/// plus [`ALLOC_SLACK`].
pub fn charged(bytes: u64) -> u64 {
    bytes.max(1).next_multiple_of(256) + ALLOC_SLACK
}

/// Bytes of NVSHMEM's symmetric heap halo holds in this process ([`charged`] per buffer).
static SYMMETRIC_IN_USE: AtomicU64 = AtomicU64::new(0);

/// Bytes of NVSHMEM's symmetric heap halo's buffers hold in this process.
pub fn symmetric_in_use() -> u64 {
    SYMMETRIC_IN_USE.load(Ordering::Relaxed)
}

/// Charges a symmetric buffer of `bytes` against the budget before it is allocated: an error
/// (the same on every PE, whose allocations are the same sequence) when it would not fit.
pub(crate) fn charge_symmetric(bytes: u64) -> Result<()> {
    let cfg = HeapConfig::from_env()?;
    let cost = charged(bytes);
    let mut held = SYMMETRIC_IN_USE.load(Ordering::Relaxed);
    loop {
        check_allocation(&cfg, held, bytes).map_err(HaloError::Nvshmem)?;
        match SYMMETRIC_IN_USE.compare_exchange_weak(held, held + cost, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Ok(()),
            Err(now) => held = now,
        }
    }
}

/// Gives back what [`charge_symmetric`] charged for `bytes`.
pub(crate) fn release_symmetric(bytes: u64) {
    let cost = charged(bytes);
    let _ = SYMMETRIC_IN_USE.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| Some(held.saturating_sub(cost)));
}

/// The backstop of every symmetric allocation: one buffer of `bytes` when halo already holds
/// `held`.
pub fn check_allocation(cfg: &HeapConfig, held: u64, bytes: u64) -> std::result::Result<(), String> {
    let total = held.saturating_add(charged(bytes));
    if total <= cfg.symmetric_size {
        return Ok(());
    }
    Err(format!(
        "a symmetric buffer of {} does not fit in NVSHMEM's symmetric heap: halo already holds {} of the {} that {} allows; \
         raise {SYMMETRIC_SIZE_ENV} to at least {} (for example {SYMMETRIC_SIZE_ENV}={}), or put fewer atoms on each rank",
        human(bytes),
        human(held),
        human(cfg.symmetric_size),
        cfg.setting(),
        human(total),
        suggest_size(total)
    ))
}

/// Whether the exchange of `rank` (`need`) fits in the symmetric heap beside the `held` bytes
/// halo already has there. Pure, so every PE decides alike.
pub fn check_heap(cfg: &HeapConfig, held: u64, need: &Footprint, rank: usize) -> std::result::Result<(), String> {
    let total = held.saturating_add(need.symmetric_bytes());
    if total <= cfg.symmetric_size {
        return Ok(());
    }
    let already = if held > 0 { format!(", beside the {} halo already holds there", human(held)) } else { String::new() };
    Err(format!(
        "the halo exchange of rank {rank} needs {} of NVSHMEM's symmetric heap ({}){already}, but {} allows {}: \
         raise {SYMMETRIC_SIZE_ENV} to at least {} (for example {SYMMETRIC_SIZE_ENV}={}), or put fewer atoms on each rank (more ranks and GPUs)",
        human(need.symmetric_bytes()),
        need.describe_symmetric(),
        cfg.setting(),
        human(cfg.symmetric_size),
        human(total),
        suggest_size(total)
    ))
}

/// What a check of device memory knows about one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRoom {
    /// The GPU's ordinal.
    pub gpu: usize,
    /// Its free memory.
    pub free: u64,
    /// Memory [`reserve_for_test`] holds on it.
    pub held_for_test: u64,
}

/// Whether `needs` (the exchange footprints of `ranks`, all on one GPU) fit in that GPU's free
/// memory. `symmetric_grows`: the symmetric buffers come from a VMM heap that may have to grow
/// by one `granularity` step to hold them (PEs under CUDA VMM); in one process they are plain
/// device memory.
pub fn check_device(room: DeviceRoom, ranks: &[usize], needs: &[Footprint], symmetric_grows: Option<u64>) -> std::result::Result<(), String> {
    let plain: u64 = needs.iter().map(|n| n.plain_bytes()).sum();
    let symmetric: u64 = needs.iter().map(Footprint::symmetric_bytes).sum();
    let need = match symmetric_grows {
        Some(step) => plain + symmetric.next_multiple_of(step.max(1)),
        None => plain + symmetric,
    };
    if need <= room.free {
        return Ok(());
    }
    let who = match ranks {
        [r] => format!("rank {r}"),
        _ => format!("ranks {}", ranks.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    };
    let each = needs.first().map_or(String::new(), |n| format!("{}, index maps and metadata {}", n.describe_symmetric(), human(n.plain_bytes())));
    let heap = match symmetric_grows {
        Some(step) => format!(
            "; NVSHMEM's heap grows in steps of {} ({GRANULARITY_ENV}), so up to {} of it may be new",
            human(step),
            human(symmetric.next_multiple_of(step.max(1)))
        ),
        None => String::new(),
    };
    let held = if room.held_for_test > 0 { format!(" ({RESERVE_ENV} holds {} of it)", human(room.held_for_test)) } else { String::new() };
    let granularity = if symmetric_grows.is_some() { format!(", a smaller {GRANULARITY_ENV} (e.g. 2M)") } else { String::new() };
    Err(format!(
        "GPU {} is out of memory for the halo exchange of {who}: it needs {} of device memory ({}{each}{heap}), \
         and GPU {} has {} free{held}: put fewer atoms on each rank (more ranks and GPUs), fewer ranks on this GPU{granularity}, \
         or free the GPU of other work",
        room.gpu,
        human(need),
        if needs.len() > 1 { "each rank: " } else { "" },
        room.gpu,
        human(room.free),
    ))
}

/// One message for the verdicts of every PE (`verdicts[pe]`: `None` if that PE can go on):
/// `Ok` when all can, else an error naming each PE that cannot and why.
pub fn combine_verdicts(verdicts: &[Option<String>]) -> std::result::Result<(), String> {
    let failed: Vec<(usize, &String)> = verdicts.iter().enumerate().filter_map(|(pe, v)| v.as_ref().map(|v| (pe, v))).collect();
    if failed.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = failed.iter().map(|(pe, _)| pe.to_string()).collect();
    let reasons: Vec<String> = failed.iter().map(|(pe, why)| format!("PE {pe}: {why}")).collect();
    Err(format!(
        "{} {} cannot build the halo exchange, so no PE allocates it. {}",
        if failed.len() == 1 { "PE" } else { "PEs" },
        list.join(", "),
        reasons.join(" ")
    ))
}

/// Agreements so far in this process: every PE builds the same exchanges in the same order, so
/// the count names the same agreement on every PE.
static AGREEMENTS: AtomicU64 = AtomicU64::new(0);

/// Every PE's verdict about building an exchange, agreed through `halo launch`'s rendezvous:
/// `Ok` only if every PE can. Without a rendezvous (mpiexec, srun, a single process) this PE's own
/// verdict stands (its launcher ends the job when it exits with the error).
pub fn agree(mine: std::result::Result<(), String>) -> Result<()> {
    let n = AGREEMENTS.fetch_add(1, Ordering::Relaxed);
    let rendezvous = match Rendezvous::from_env() {
        Ok(r) => r,
        Err(LaunchError::NoRendezvous) => return mine.map_err(HaloError::InvalidInput),
        Err(e) => return Err(HaloError::InvalidInput(format!("agreeing on the exchange's memory: {e}"))),
    };
    agree_through(&rendezvous, &format!("exchange-memory-{n}"), mine, crate::launch::rendezvous::DEFAULT_TIMEOUT)
}

/// [`agree`] over `rendezvous` under `tag` (each PE's verdict travels as its error text, empty
/// for none), waiting at most `timeout` for the slowest PE.
pub fn agree_through(rendezvous: &Rendezvous, tag: &str, mine: std::result::Result<(), String>, timeout: std::time::Duration) -> Result<()> {
    let bytes = mine.err().unwrap_or_default().into_bytes();
    let all = rendezvous.all_gather(tag, &bytes, timeout).map_err(|e| HaloError::InvalidInput(format!("agreeing on the exchange's memory: {e}")))?;
    let verdicts: Vec<Option<String>> = all.into_iter().map(|b| (!b.is_empty()).then(|| String::from_utf8_lossy(&b).into_owned())).collect();
    combine_verdicts(&verdicts).map_err(HaloError::InvalidInput)
}

/// Bytes [`reserve_for_test`] holds in this process, per GPU ordinal (for the messages).
static HELD_FOR_TEST: std::sync::Mutex<Vec<(usize, u64)>> = std::sync::Mutex::new(Vec::new());

fn held_for_test(gpu: usize) -> u64 {
    HELD_FOR_TEST.lock().map(|h| h.iter().filter(|(g, _)| *g == gpu).map(|(_, b)| b).sum()).unwrap_or(0)
}

/// The free memory of `ctx`'s GPU and what the test reservation holds there.
fn room(ctx: &CudaContext) -> Result<DeviceRoom> {
    let (free, _) = ctx.mem_get_info().map_err(|source| HaloError::Cuda { what: "reading the GPU's free memory".into(), source })?;
    Ok(DeviceRoom { gpu: ctx.ordinal(), free: free as u64, held_for_test: held_for_test(ctx.ordinal()) })
}

/// The check `PeExchange::new` runs before it allocates anything: this PE's symmetric buffers
/// against the heap budget (the same verdict on every PE), then its device memory, agreed across
/// PEs ([`agree`]).
/// `caller_arrays`: `x` and `f` are the caller's, already allocated, and not counted.
pub fn precheck_pe<T: Element>(ctx: &CudaContext, halos: &[RankHalo], me: usize, sizes: SharedSizes, caller_arrays: bool) -> Result<()> {
    let need = Footprint::of_pe::<T>(sizes, &halos[me]);
    let need = if caller_arrays { need.without_caller_arrays() } else { need };
    let cfg = HeapConfig::from_env()?;
    check_heap(&cfg, symmetric_in_use(), &need, me).map_err(HaloError::Nvshmem)?;
    let grows = cfg.vmm.then_some(cfg.granularity);
    agree(room(ctx).map_err(|e| e.to_string()).and_then(|room| check_device(room, &[me], &[need], grows)))
}

/// The check `LocalRanks::new` runs before it allocates anything: per GPU, the footprints of the
/// ranks placed there (rank `r` on `modules[r % modules.len()]`) against its free memory
/// (`caller_arrays`: `x` and `f` are the caller's, already allocated, and not counted).
pub fn precheck_local<T: Element>(modules: &[Arc<KernelModule>], halos: &[RankHalo], sizes: SharedSizes, caller_arrays: bool) -> Result<()> {
    for (g, module) in modules.iter().enumerate() {
        let ranks: Vec<usize> = (0..halos.len()).filter(|r| r % modules.len() == g).collect();
        let need = |r: usize| {
            let f = Footprint::of::<T>(sizes, &halos[r]);
            if caller_arrays { f.without_caller_arrays() } else { f }
        };
        let needs: Vec<Footprint> = ranks.iter().map(|&r| need(r)).collect();
        check_device(room(module.context())?, &ranks, &needs, None).map_err(HaloError::InvalidInput)?;
    }
    Ok(())
}

/// `HALO_TEST_RESERVE_GIB=G[:RANK]`: `G` GiB to hold, and optionally the only rank that holds
/// them. `Ok(None)` when unset or empty.
pub fn parse_reserve(s: &str) -> std::result::Result<Option<(f64, Option<usize>)>, String> {
    const FORM: &str = "write G[:RANK], e.g. 200:1 (rank 1 holds 200 GiB, or all its GPU has but 256 MiB)";
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    let (gib, rank) = match s.split_once(':') {
        Some((g, r)) => (g, Some(r.trim().parse::<usize>().map_err(|_| format!("`{r}` is not a rank: {FORM}"))?)),
        None => (s, None),
    };
    let gib: f64 = gib.trim().parse().map_err(|_| format!("`{gib}` is not a number of GiB: {FORM}"))?;
    if !gib.is_finite() || gib <= 0.0 {
        return Err(format!("`{gib}` GiB: {FORM}"));
    }
    Ok(Some((gib, rank)))
}

/// Device memory held for a test until dropped ([`reserve_for_test`]).
pub struct Reservation {
    gpu: usize,
    bytes: u64,
    _buf: DeviceBuffer<u8>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Ok(mut held) = HELD_FOR_TEST.lock()
            && let Some(i) = held.iter().position(|&(g, b)| g == self.gpu && b == self.bytes)
        {
            held.swap_remove(i);
        }
    }
}

/// Test only ([`RESERVE_ENV`]): when it asks for this `rank` (or names none), holds its GiB of
/// `ctx`'s GPU, or all but 256 MiB of the free memory when that is less, so that the exchange
/// built next finds the GPU (nearly) full. Says on stderr what it holds.
pub fn reserve_for_test(ctx: &Arc<CudaContext>, rank: usize) -> Result<Option<Reservation>> {
    let Some(value) = std::env::var(RESERVE_ENV).ok() else { return Ok(None) };
    let Some((gib, only)) = parse_reserve(&value).map_err(|e| HaloError::InvalidInput(format!("{RESERVE_ENV}: {e}")))? else { return Ok(None) };
    if only.is_some_and(|r| r != rank) {
        return Ok(None);
    }
    let room = room(ctx)?;
    let bytes = ((gib * (1u64 << 30) as f64) as u64).min(room.free.saturating_sub(RESERVE_LEAVES_FREE));
    let buf = DeviceBuffer::<u8>::uninit(ctx, bytes as usize)?;
    if let Ok(mut held) = HELD_FOR_TEST.lock() {
        held.push((room.gpu, bytes));
    }
    eprintln!(
        "halo: {RESERVE_ENV}={value}: rank {rank} holds {} of GPU {} for this test ({} left free)",
        human(bytes),
        room.gpu,
        human(room.free.saturating_sub(bytes))
    );
    Ok(Some(Reservation { gpu: room.gpu, bytes, _buf: buf }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::synthetic::{self, SyntheticShape};
    use kernels_gpu::abi::Float3;

    #[test]
    fn sizes_parse_as_nvshmem_reads_them() {
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("20m").unwrap(), 20 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("1t").unwrap(), 1 << 40);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        // NVSHMEM's own examples: '3.1M' is 3250586 (rounded up), '.5m' is '0.5m', '20kk' is '20k'.
        assert_eq!(parse_size("3.1M").unwrap(), 3_250_586);
        assert_eq!(parse_size(".5m").unwrap(), 1 << 19);
        assert_eq!(parse_size("20kk").unwrap(), 20 << 10);
        for bad in ["", "M", "abc", "1x", "-1M", "1.2.3G"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains("is not a size") || e.contains("multiplier"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_heap_config_reads_nvshmem_variables() {
        let c = HeapConfig::from_values(None, None, None).unwrap();
        assert_eq!((c.symmetric_size, c.vmm, c.granularity), (DEFAULT_SYMMETRIC_SIZE, true, DEFAULT_GRANULARITY));
        assert_eq!(c.setting(), "NVSHMEM_SYMMETRIC_SIZE is unset (NVSHMEM's default, 1.00 GiB)");
        let c = HeapConfig::from_values(Some("1M"), Some("1"), Some("2M")).unwrap();
        assert_eq!((c.symmetric_size, c.vmm, c.granularity), (1 << 20, false, 2 << 20));
        assert_eq!(c.setting(), "NVSHMEM_SYMMETRIC_SIZE=1M (1.0 MiB)");
        assert!(HeapConfig::from_values(None, Some("0"), None).unwrap().vmm);
        assert!(!HeapConfig::from_values(None, Some("true"), None).unwrap().vmm);
        assert_eq!(HeapConfig::from_values(None, None, Some("8G")).unwrap().granularity, MAX_GRANULARITY, "NVSHMEM caps the step at 2 GiB");
        let e = HeapConfig::from_values(Some("lots"), None, None).unwrap_err().to_string();
        assert!(e.contains("NVSHMEM_SYMMETRIC_SIZE") && e.contains("`lots` is not a size"), "{e}");
    }

    #[test]
    fn suggestions_leave_headroom_in_round_sizes() {
        assert_eq!(suggest_size(1), "1M");
        assert_eq!(suggest_size(6 << 20), "8M");
        assert_eq!(suggest_size(7 << 20), "16M", "a quarter more than 7 MiB is above 8 MiB");
        assert_eq!(suggest_size(900 << 20), "2G");
        assert_eq!(suggest_size(3 << 30), "4G");
        for need in [1u64, 1000, 5 << 20, 700 << 20, 5 << 30] {
            assert!(parse_size(&suggest_size(need)).unwrap() >= need + need / 4, "{need}");
        }
    }

    fn two_ranks(home: usize) -> (Vec<RankHalo>, SharedSizes) {
        let halos = synthetic::halos(SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: home, send_fraction: 0.35, box_len: 7.7 }, 1);
        let sizes = SharedSizes::of(&halos);
        (halos, sizes)
    }

    #[test]
    fn the_footprint_counts_every_buffer_of_a_rank() {
        let (halos, sizes) = two_ranks(10_000);
        let f = Footprint::of::<Float3>(sizes, &halos[0]);
        let atoms = sizes.atoms as u64 * 12;
        let slots = 2 * sizes.slot_atoms as u64 * 12;
        // Two staging pairs, and two receive pairs that hold low-latency words (twice the bytes).
        assert_eq!(f.symmetric_requested(), 2 * atoms + 2 * slots + 2 * 2 * slots + 4 * 8);
        assert_eq!(f.symmetric_bytes(), f.symmetric.iter().map(|b| b.bytes.next_multiple_of(256) + ALLOC_SLACK).sum::<u64>());
        assert_eq!(f.plain[0].bytes, halos[0].pulses[0].index_map.len() as u64 * 4);
        let d = f.describe_symmetric();
        assert!(d.starts_with("coordinates ") && d.contains("forces ") && d.contains("signals 32 B"), "{d}");
        // Other element types scale the arrays, not the signals.
        let g = Footprint::of::<f64>(sizes, &halos[0]);
        assert_eq!(g.symmetric[0].bytes, sizes.atoms as u64 * 8);
        assert_eq!(g.symmetric[6], f.symmetric[6]);
        // On the caller's arrays halo allocates neither x nor f.
        let own = f.clone().without_caller_arrays();
        assert_eq!(own.symmetric_requested(), f.symmetric_requested() - 2 * atoms);
        assert!(!own.describe_symmetric().contains("coordinates") && !own.describe_symmetric().contains("forces "), "{own:?}");
        assert_eq!(own.plain, f.plain);
    }

    #[test]
    fn the_footprint_of_an_exchange_with_headroom_counts_the_headroom() {
        // The MD step allocates its exchange with 25% headroom (`Placement::exchange_with_headroom`);
        // the prechecks get the grown sizes, so a heap that holds the exact sizes can refuse them.
        let (halos, sizes) = two_ranks(50_000);
        let grown = sizes.with_headroom(0.25);
        let (exact, roomy) = (Footprint::of::<Float3>(sizes, &halos[0]), Footprint::of::<Float3>(grown, &halos[0]));
        assert_eq!(roomy.symmetric[0].bytes, grown.atoms as u64 * 12);
        assert_eq!(roomy.symmetric[2].bytes, 2 * grown.slot_atoms as u64 * 12);
        assert!(roomy.symmetric_requested() as f64 >= 1.24 * exact.symmetric_requested() as f64, "{roomy:?} vs {exact:?}");
        assert_eq!(roomy.plain, exact.plain, "index maps are allocated for the halo itself");
        let cfg = HeapConfig { symmetric_size: exact.symmetric_bytes(), ..HeapConfig::from_values(None, None, None).unwrap() };
        check_heap(&cfg, 0, &exact, 0).unwrap();
        assert!(check_heap(&cfg, 0, &roomy, 0).is_err());
    }

    #[test]
    fn a_heap_too_small_names_the_need_the_setting_and_the_fix() {
        let (halos, sizes) = two_ranks(200_000);
        let need = Footprint::of::<Float3>(sizes, &halos[1]);
        let cfg = HeapConfig::from_values(Some("1M"), None, None).unwrap();
        let e = check_heap(&cfg, 0, &need, 1).unwrap_err();
        let suggested = suggest_size(need.symmetric_bytes());
        for part in [
            format!("the halo exchange of rank 1 needs {} of NVSHMEM's symmetric heap", human(need.symmetric_bytes())),
            format!("(coordinates {}", human(need.symmetric[0].bytes)),
            "NVSHMEM_SYMMETRIC_SIZE=1M (1.0 MiB) allows 1.0 MiB".to_string(),
            format!("raise NVSHMEM_SYMMETRIC_SIZE to at least {}", human(need.symmetric_bytes())),
            format!("(for example NVSHMEM_SYMMETRIC_SIZE={suggested})"),
            "fewer atoms on each rank".to_string(),
        ] {
            assert!(e.contains(&part), "missing `{part}` in: {e}");
        }
        // The suggestion really fits, and what halo already holds counts.
        let raised = HeapConfig::from_values(Some(&suggested), None, None).unwrap();
        check_heap(&raised, 0, &need, 1).unwrap();
        let e = check_heap(&raised, raised.symmetric_size, &need, 1).unwrap_err();
        assert!(e.contains("beside the") && e.contains("halo already holds there"), "{e}");
        // Default heap: fits.
        check_heap(&HeapConfig::from_values(None, None, None).unwrap(), 0, &need, 1).unwrap();
    }

    #[test]
    fn the_allocation_backstop_refuses_what_the_budget_cannot_hold() {
        let cfg = HeapConfig::from_values(Some("64k"), None, None).unwrap();
        check_allocation(&cfg, 0, 60_000).unwrap();
        let e = check_allocation(&cfg, 10_000, 60_000).unwrap_err();
        assert!(e.contains("a symmetric buffer of 58.6 KiB does not fit") && e.contains("halo already holds 9.8 KiB of the 64.0 KiB"), "{e}");
        assert!(e.contains("NVSHMEM_SYMMETRIC_SIZE=64k (64.0 KiB) allows") && e.contains("for example NVSHMEM_SYMMETRIC_SIZE=1M"), "{e}");
    }

    #[test]
    fn device_memory_checks_name_the_gpu_the_need_and_the_fix() {
        let (halos, sizes) = two_ranks(200_000);
        let need = Footprint::of::<Float3>(sizes, &halos[0]);
        let total = need.symmetric_bytes() + need.plain_bytes();
        let room = |free| DeviceRoom { gpu: 1, free, held_for_test: 0 };
        check_device(room(total), &[0], std::slice::from_ref(&need), None).unwrap();
        let e = check_device(room(total - 1), &[0], std::slice::from_ref(&need), None).unwrap_err();
        assert!(e.starts_with("GPU 1 is out of memory for the halo exchange of rank 0: it needs"), "{e}");
        assert!(e.contains(&format!("and GPU 1 has {} free", human(total - 1))) && e.contains("fewer atoms on each rank"), "{e}");
        assert!(!e.contains("NVSHMEM_CUMEM_GRANULARITY"), "no heap growth in one process: {e}");
        // A growing heap may need a whole new step: 512 MiB more than the buffers.
        let e = check_device(room(total + (100 << 20)), &[0], std::slice::from_ref(&need), Some(DEFAULT_GRANULARITY)).unwrap_err();
        assert!(
            e.contains("grows in steps of 512.0 MiB (NVSHMEM_CUMEM_GRANULARITY)") && e.contains("a smaller NVSHMEM_CUMEM_GRANULARITY (e.g. 2M)"),
            "{e}"
        );
        check_device(room(1 << 30), &[0], std::slice::from_ref(&need), Some(DEFAULT_GRANULARITY)).unwrap();
        // Several ranks on one GPU add up; a test reservation is named.
        let two = [need.clone(), need.clone()];
        let e = check_device(DeviceRoom { gpu: 0, free: total + 1, held_for_test: 140 << 30 }, &[0, 2], &two, None).unwrap_err();
        assert!(
            e.contains("ranks 0, 2") && e.contains("each rank: coordinates") && e.contains("HALO_TEST_RESERVE_GIB holds 140.00 GiB of it"),
            "{e}"
        );
    }

    #[test]
    fn verdicts_combine_into_one_message_naming_every_pe_that_cannot() {
        assert_eq!(combine_verdicts(&[None, None, None]), Ok(()));
        let e = combine_verdicts(&[None, Some("GPU 1 is out of memory".into()), None]).unwrap_err();
        assert_eq!(e, "PE 1 cannot build the halo exchange, so no PE allocates it. PE 1: GPU 1 is out of memory");
        let e = combine_verdicts(&[Some("a".into()), None, Some("b".into())]).unwrap_err();
        assert!(e.starts_with("PEs 0, 2 cannot") && e.ends_with("PE 0: a PE 2: b"), "{e}");
    }

    #[test]
    fn agreement_without_a_rendezvous_is_this_pes_own_verdict() {
        // No `halo launch` here (unit tests never set HALO_RENDEZVOUS_DIR).
        assert!(std::env::var_os("HALO_RENDEZVOUS_DIR").is_none());
        agree(Ok(())).unwrap();
        let e = agree(Err("GPU 0 is out of memory".into())).unwrap_err().to_string();
        assert!(e.contains("GPU 0 is out of memory"), "{e}");
    }

    #[test]
    fn agreement_through_a_rendezvous_fails_every_pe_when_one_cannot() {
        // Three PEs of one `halo launch`, as threads over one rendezvous directory.
        let dir = std::env::temp_dir().join(format!("halo-agree-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let verdict = |pe: usize| if pe == 1 { Err("GPU 1 is out of memory".to_string()) } else { Ok(()) };
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|pe| {
                    let dir = dir.clone();
                    s.spawn(move || {
                        agree_through(&Rendezvous::new(dir, pe, 3), "exchange-memory-test", verdict(pe), std::time::Duration::from_secs(10))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let _ = std::fs::remove_dir_all(&dir);
        for r in results {
            let e = r.unwrap_err().to_string();
            assert!(e.ends_with("PE 1 cannot build the halo exchange, so no PE allocates it. PE 1: GPU 1 is out of memory"), "{e}");
        }
        // All can: all go on.
        let dir = std::env::temp_dir().join(format!("halo-agree-ok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::thread::scope(|s| {
            for pe in 0..2 {
                let dir = dir.clone();
                s.spawn(move || agree_through(&Rendezvous::new(dir, pe, 2), "t", Ok(()), std::time::Duration::from_secs(10)).unwrap());
            }
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_test_reservation_parses_gib_and_an_optional_rank() {
        assert_eq!(parse_reserve("").unwrap(), None);
        assert_eq!(parse_reserve("200").unwrap(), Some((200.0, None)));
        assert_eq!(parse_reserve("0.5:1").unwrap(), Some((0.5, Some(1))));
        for bad in ["x", "0", "-3", "5:x", "inf"] {
            assert!(parse_reserve(bad).unwrap_err().contains("G[:RANK]"), "{bad}");
        }
    }

    #[test]
    fn humans_read_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 10), "3.0 KiB");
        assert_eq!(human(23 << 20), "23.0 MiB");
        assert_eq!(human(3 << 29), "1.50 GiB");
    }
}
