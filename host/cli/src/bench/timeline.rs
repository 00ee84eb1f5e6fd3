//! `halo timeline`: one run that says where the microseconds of the fused halo go.
//!
//! The fused coordinate and force kernels are run in their instrumented instantiation
//! (`fused_coords_timeline`, `fused_forces_timeline`: the same protocol, plus `%globaltimer`
//! stamps at each point a pulse passes, [`kernels_gpu::abi::timeline`]) for the three phases
//! (X only, F only, X+F), launched one by one and replayed as captured graphs. The host stamps
//! each launch call (`CLOCK_REALTIME` before and after `cuLaunchKernel` / `cuGraphLaunch`). Every
//! rank's records are gathered, and the report gives, per phase and rank, the median, mean and 90th
//! percentile of each interval between stamps, the GPU gap between consecutive kernels (one's end
//! to the next one's first block), the host side, and the same loops with the plain kernels timed
//! by events (the probe's own cost). The resolution of `%globaltimer` is measured first: below its
//! update period single intervals are quantised, and the means (over hundreds of steps, out of
//! phase with the timer) are the numbers to read.
//!
//! Before the loops and after them, one step of the plain and one of the stamped kernels on random
//! data is compared with the CPU reference (coordinates bit-exact, forces within 1e-5); a mismatch
//! ends the run with no timeline.
//!
//! The analysis ([`analyse`], [`render`]) is pure and tested on synthetic stamps.

use super::graph::{self, Phase};
use super::{HaloSource, build_halos, floor, step};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::exchange::pe::PathPolicy;
use crate::exchange::rank::timeline::{Record, TimelineRing, TimerResolution, globaltimer_resolution};
use crate::exchange::{Exchange, Placement, RankHalo, Transport};
use crate::gpu::{self, KernelModule};
use crate::launch::RankEnv;
use crate::session::PeSession;
use kernels_gpu::abi::Float3;
use kernels_gpu::abi::timeline::{self as layout, coords as xp, forces as fp, pulse_slot};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What to run.
#[derive(Clone, Debug)]
pub struct TimelineConfig {
    /// System size (atoms).
    pub atoms: usize,
    /// Rank grid.
    pub grid: [usize; 3],
    /// Measured steps per loop.
    pub steps: usize,
    /// Steps run (and stamped) before the measured ones, then left out.
    pub warmup: usize,
    /// Where the halos come from.
    pub halos: HaloSource,
    /// Cutoff of the decomposition (nm).
    pub cutoff: f32,
    /// Seed of the system or synthetic halos.
    pub seed: u64,
    /// GPUs to spread the ranks over in one process (0: one per rank, as many as visible).
    pub gpus: usize,
    /// Deadline of every device wait.
    pub wait_timeout: Duration,
    /// NVSHMEM host library (default: discovered).
    pub nvshmem_lib: Option<PathBuf>,
}

/// Reads of `%globaltimer` for the resolution probe (a few ms on an H200).
const RESOLUTION_POLLS: u32 = 1 << 18;

/// One host call that enqueued work: a kernel launch, or a graph replay of `kernels` kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostLaunch {
    /// `CLOCK_REALTIME` (ns) just before the call.
    pub call_ns: u64,
    /// `CLOCK_REALTIME` (ns) just after it returned.
    pub return_ns: u64,
    /// GPU launches it enqueued on the rank's stream (1, or 2 for a replayed X+F step).
    pub kernels: u32,
}

/// One rank's data of one loop.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankLoop {
    /// Global rank.
    pub rank: usize,
    /// One record per coordinate launch (ring order).
    pub coords: Vec<Record>,
    /// One record per force launch.
    pub forces: Vec<Record>,
    /// Every launch call of the loop, in order.
    pub host: Vec<HostLaunch>,
    /// The measured steps of the stamped loop, between two events (µs per step).
    pub stamped_us_per_step: f64,
    /// The same loop with the plain kernels (µs per step).
    pub plain_us_per_step: f64,
}

/// One loop (a phase, launched or replayed) on every rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoopRun {
    /// The loop runs coordinate halos.
    pub coords: bool,
    /// The loop runs force halos.
    pub forces: bool,
    /// Steps replayed as captured graphs (one graph per step and rank).
    pub graph: bool,
    /// Warm-up steps at the start of the records (left out).
    pub warmup: usize,
    /// Measured steps.
    pub steps: usize,
    /// Every rank, indexed by rank.
    pub ranks: Vec<RankLoop>,
}

impl LoopRun {
    /// `X only, plain launches`, ...
    pub fn title(&self) -> String {
        let what = match (self.coords, self.forces) {
            (true, false) => "X only",
            (false, true) => "F only",
            _ => "X+F",
        };
        format!("{what}, {}", if self.graph { "graph replays" } else { "plain launches" })
    }
}

/// `%globaltimer` as one rank's GPU showed it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankTimer {
    /// Global rank.
    pub rank: usize,
    /// Smallest nonzero step (ns).
    pub smallest_step_ns: Option<u64>,
    /// Mean time between changes (ns).
    pub mean_step_ns: Option<f64>,
    /// Changes seen.
    pub changes: u64,
}

impl RankTimer {
    fn new(rank: usize, r: TimerResolution) -> Self {
        Self { rank, smallest_step_ns: r.smallest_step_ns, mean_step_ns: r.mean_step_ns(), changes: r.changes }
    }
}

/// Everything a run measured (rank 0 holds it; `--json` writes it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelineData {
    /// Where it ran.
    pub mode: String,
    /// Atoms of the system.
    pub atoms: usize,
    /// `2x1x1`, ...
    pub grid: String,
    /// Per rank and pulse: (`send_rank`, `recv_rank`).
    pub peers: Vec<Vec<(usize, usize)>>,
    /// The timer on every rank's GPU.
    pub timers: Vec<RankTimer>,
    /// Every loop.
    pub loops: Vec<LoopRun>,
}

// ----------------------------------------------------------------------------------------------
// Analysis (pure).

/// Median, mean and 90th percentile of a set of intervals, in µs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// Number of intervals.
    pub n: usize,
    /// Median (µs).
    pub median: f64,
    /// Mean (µs).
    pub mean: f64,
    /// 90th percentile, nearest rank (µs).
    pub p90: f64,
}

impl Spread {
    /// From intervals in ns; `None` when there are none.
    pub fn of_ns(v: &[i64]) -> Option<Self> {
        if v.is_empty() {
            return None;
        }
        let mut s: Vec<f64> = v.iter().map(|&x| x as f64 / 1000.0).collect();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { 0.5 * (s[n / 2 - 1] + s[n / 2]) };
        let p90 = s[((9 * n).div_ceil(10)).clamp(1, n) - 1];
        Some(Self { n, median, mean: s.iter().sum::<f64>() / n as f64, p90 })
    }
}

/// One line of a section: a label and each rank's spread (`None`: not measured there).
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// What the interval is.
    pub label: String,
    /// Indexed by rank.
    pub ranks: Vec<Option<Spread>>,
}

/// The analysis of one loop.
#[derive(Clone, Debug, PartialEq)]
pub struct Section {
    /// [`LoopRun::title`] and the step counts.
    pub title: String,
    /// Per step, from events: the plain kernels and the stamped ones (slowest rank, µs).
    pub per_step_us: (f64, f64),
    /// The rows, in report order.
    pub rows: Vec<Row>,
}

/// A word of a record: launch-wide, or a point of the pulse being reported.
#[derive(Clone, Copy, Debug)]
enum Word {
    Global(usize),
    Pulse(usize),
}

use Word::{Global as G, Pulse as P};

/// The intervals within one coordinate launch.
const X_INTERVALS: &[(&str, Word, Word)] = &[
    ("blocks enter: first -> last", G(layout::ENTRY_FIRST), G(layout::ENTRY_LAST)),
    ("first entry -> credit checked", G(layout::ENTRY_FIRST), P(xp::CREDIT)),
    ("credit -> pass 1 packed", P(xp::CREDIT), P(xp::PACKED)),
    ("pass 1 -> dependency wait done", P(xp::PACKED), P(xp::DEPS)),
    ("pass 1 -> delivered (words: stored)", P(xp::PACKED), P(xp::DELIVERED)),
    ("pass 1 -> last block elected (put)", P(xp::PACKED), P(xp::ELECTED)),
    ("first entry -> elected block's entry (put)", G(layout::ENTRY_FIRST), P(xp::ELECTED_ENTRY)),
    ("elected -> signal issued (put)", P(xp::ELECTED), P(xp::DELIVERED)),
    ("delivered -> own pulse in", P(xp::DELIVERED), P(xp::RECEIVED)),
    ("own pulse in -> kernel end", P(xp::RECEIVED), G(layout::END)),
    ("kernel: first entry -> end", G(layout::ENTRY_FIRST), G(layout::END)),
];

/// The intervals within one force launch.
const F_INTERVALS: &[(&str, Word, Word)] = &[
    ("blocks enter: first -> last", G(layout::ENTRY_FIRST), G(layout::ENTRY_LAST)),
    ("first entry -> chain released", G(layout::ENTRY_FIRST), P(fp::CHAIN)),
    ("chain -> pushed (words: stored; put: elected)", P(fp::CHAIN), P(fp::PUSHED)),
    ("first entry -> push elected block's entry (put)", G(layout::ENTRY_FIRST), P(fp::ELECTED_ENTRY)),
    ("push elected -> signal issued (put)", P(fp::PUSHED), P(fp::SIGNALLED)),
    ("delivered -> peer's push in", P(fp::SIGNALLED), P(fp::RECEIVED)),
    ("push in -> accumulated", P(fp::RECEIVED), P(fp::ACCUMULATED)),
    ("accumulated -> row done", P(fp::ACCUMULATED), P(fp::ROW_DONE)),
    ("row done -> kernel end", P(fp::ROW_DONE), G(layout::END)),
    ("kernel: first entry -> end", G(layout::ENTRY_FIRST), G(layout::END)),
];

/// The stamp at `w` for pulse `pulse`, `None` when never stamped.
fn stamp(r: &Record, w: Word, pulse: u32) -> Option<u64> {
    let i = match w {
        Word::Global(i) => i,
        Word::Pulse(p) => pulse_slot(pulse, p)?,
    };
    let v = r[i];
    (v != 0 && v != u64::MAX).then_some(v)
}

/// `b - a` in ns when both are stamped.
fn diff(a: Option<u64>, b: Option<u64>) -> Option<i64> {
    Some(b? as i64 - a? as i64)
}

/// One rank's launches of a loop in time order, warm-up left out.
struct RankLaunches<'a> {
    /// Coordinate and force records, each in time order, measured steps only.
    coords: Vec<&'a Record>,
    forces: Vec<&'a Record>,
    /// Every GPU launch in time order (`true`: forces), warm-up included.
    all: Vec<(bool, &'a Record)>,
    /// Index in `all` of the first measured launch.
    first: usize,
}

fn sorted(records: &[Record]) -> Vec<&Record> {
    let mut v: Vec<&Record> = records.iter().collect();
    v.sort_by_key(|r| r[layout::ENTRY_FIRST]);
    v
}

impl<'a> RankLaunches<'a> {
    fn of(run: &LoopRun, rl: &'a RankLoop) -> std::result::Result<Self, String> {
        let launches = run.warmup + run.steps;
        for (on, what, got) in [(run.coords, "coordinate", rl.coords.len()), (run.forces, "force", rl.forces.len())] {
            let want = if on { launches } else { 0 };
            if got != want {
                return Err(format!(
                    "{}: rank {} has {got} stamped {what} launches, {want} were made (a ring too small, or launches that never ran)",
                    run.title(),
                    rl.rank
                ));
            }
        }
        let (xs, fs) = (sorted(&rl.coords), sorted(&rl.forces));
        let mut all: Vec<(bool, &Record)> = xs.iter().map(|r| (false, *r)).chain(fs.iter().map(|r| (true, *r))).collect();
        all.sort_by_key(|(_, r)| r[layout::ENTRY_FIRST]);
        let per_step = usize::from(run.coords) + usize::from(run.forces);
        let skip = |v: Vec<&'a Record>| v.into_iter().skip(run.warmup).collect();
        Ok(Self { coords: skip(xs), forces: skip(fs), all, first: run.warmup * per_step })
    }
}

/// Pulses a record holds stamps for, for `peers` pulses.
fn stamped_pulses(pulses: usize) -> u32 {
    pulses.min(layout::MAX_PULSES as usize) as u32
}

/// The rows of the intervals inside each launch of one direction.
fn launch_rows(table: &[(&str, Word, Word)], per_rank: &[Vec<&Record>], pulses: u32, prefix: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let spread = |from: Word, to: Word, p: u32| -> Vec<Option<Spread>> {
        per_rank.iter().map(|recs| Spread::of_ns(&recs.iter().filter_map(|r| diff(stamp(r, from, p), stamp(r, to, p))).collect::<Vec<_>>())).collect()
    };
    for &(label, from, to) in table {
        let global = matches!((from, to), (Word::Global(_), Word::Global(_)));
        for p in 0..if global { 1 } else { pulses } {
            let pulse = if global || pulses == 1 { String::new() } else { format!("p{p} ") };
            let ranks = spread(from, to, p);
            if ranks.iter().any(Option::is_some) {
                rows.push(Row { label: format!("{prefix}{pulse}{label}"), ranks });
            }
        }
    }
    rows
}

/// Cross-rank rows of one direction: for each rank and pulse, the peer's signal (`sent`, on the
/// peer's clock) to its arrival here (`seen`, on this GPU's clock), which includes the two clocks'
/// offset; where the peer's own pulse comes back from this rank, the mean of both directions
/// (offset cancelled) and half their difference (the offset, this GPU minus the peer's).
fn cross_rows(
    per_rank: &[Vec<&Record>],
    peer_of: &dyn Fn(usize, usize) -> Option<usize>,
    pulses: u32,
    sent: usize,
    seen: usize,
    prefix: &str,
) -> Vec<Row> {
    let n = per_rank.len();
    let mut rows = Vec::new();
    for p in 0..pulses {
        let hop = |r: usize| -> Option<Vec<i64>> {
            let q = peer_of(r, p as usize)?;
            let (mine, theirs) = (per_rank.get(r)?, per_rank.get(q)?);
            Some(mine.iter().zip(theirs).filter_map(|(m, t)| diff(stamp(t, P(sent), p), stamp(m, P(seen), p))).collect())
        };
        let pulse = if pulses == 1 { String::new() } else { format!("p{p} ") };
        let hops: Vec<Option<Vec<i64>>> = (0..n).map(hop).collect();
        let row = |label: &str, ranks: Vec<Option<Spread>>| Row { label: format!("{prefix}{pulse}{label}"), ranks };
        rows.push(row("peer's signal -> seen here (+ clock offset)", hops.iter().map(|h| h.as_deref().and_then(Spread::of_ns)).collect()));
        // The reverse hop: the peer q's pulse p comes from r.
        let paired = |r: usize, f: fn(i64, i64) -> i64| -> Option<Spread> {
            let q = peer_of(r, p as usize)?;
            (peer_of(q, p as usize)? == r).then_some(())?;
            let (a, b) = (hops[r].as_ref()?, hops[q].as_ref()?);
            Spread::of_ns(&a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect::<Vec<_>>())
        };
        if (0..n).any(|r| paired(r, |x, y| (x + y) / 2).is_some()) {
            rows.push(row("one-way hop, offset cancelled (pair mean)", (0..n).map(|r| paired(r, |x, y| (x + y) / 2)).collect()));
            rows.push(row("clock offset, this GPU - peer's", (0..n).map(|r| paired(r, |x, y| (x - y) / 2)).collect()));
        }
    }
    rows
}

/// Host clocks further apart than this from the GPU's make "host call -> GPU entry" meaningless.
const COMPARABLE_CLOCKS_NS: i64 = 1_000_000_000;

/// Gaps between consecutive kernels on each rank's stream and the host side of the launches.
fn stream_rows(run: &LoopRun, ranks: &[RankLaunches]) -> Vec<Row> {
    let n = ranks.len();
    let mut rows = Vec::new();
    let kinds = [(false, false, "X -> X"), (true, true, "F -> F"), (false, true, "X -> F"), (true, false, "F -> X")];
    for (a, b, name) in kinds {
        let per: Vec<Option<Spread>> = ranks
            .iter()
            .map(|rl| {
                let gaps: Vec<i64> = (rl.first + 1..rl.all.len())
                    .filter(|&i| rl.all[i - 1].0 == a && rl.all[i].0 == b)
                    .filter_map(|i| diff(stamp(rl.all[i - 1].1, G(layout::END), 0), stamp(rl.all[i].1, G(layout::ENTRY_FIRST), 0)))
                    .collect();
                Spread::of_ns(&gaps)
            })
            .collect();
        if per.iter().any(Option::is_some) {
            rows.push(Row { label: format!("GPU gap {name}: end -> next first entry"), ranks: per });
        }
    }
    let call = if run.graph { "cuGraphLaunch" } else { "cuLaunchKernel" };
    let mut durations = vec![None; n];
    let mut between = vec![None; n];
    let mut submit = vec![None; n];
    let mut offset_s = None;
    for (i, (rl, data)) in ranks.iter().zip(&run.ranks).enumerate() {
        // Host call k enqueued the next `kernels` GPU launches, in order: its first is `gpu_index`.
        let (mut gpu_index, mut measured, mut to_entry) = (0, Vec::new(), Vec::new());
        for (k, h) in data.host.iter().enumerate() {
            if gpu_index >= rl.first {
                measured.push(k);
                if let Some(e) = rl.all.get(gpu_index).and_then(|(_, rec)| stamp(rec, G(layout::ENTRY_FIRST), 0)) {
                    to_entry.push(e as i64 - h.call_ns as i64);
                }
            }
            gpu_index += h.kernels as usize;
        }
        durations[i] = Spread::of_ns(&measured.iter().map(|&k| data.host[k].return_ns as i64 - data.host[k].call_ns as i64).collect::<Vec<_>>());
        between[i] = Spread::of_ns(&measured.windows(2).map(|w| data.host[w[1]].call_ns as i64 - data.host[w[0]].call_ns as i64).collect::<Vec<_>>());
        let s = Spread::of_ns(&to_entry);
        match s {
            Some(s) if (s.median * 1e3).abs() > COMPARABLE_CLOCKS_NS as f64 => offset_s = Some(s.median * 1e-6),
            _ => submit[i] = s,
        }
    }
    rows.push(Row { label: format!("host: {call} call"), ranks: durations });
    rows.push(Row { label: format!("host: between {call} calls"), ranks: between });
    let label = match offset_s {
        Some(s) => format!("host call -> GPU first entry: clocks differ by {s:.1} s, not comparable"),
        None => "host call -> GPU first entry (CLOCK_REALTIME vs %globaltimer)".to_string(),
    };
    rows.push(Row { label, ranks: submit });
    rows
}

/// The analysis of one loop: every interval per rank. `peers[r][p]` = (`send_rank`, `recv_rank`)
/// of rank `r`'s pulse `p`. Fails (naming the loop and rank) when the records do not match the
/// launches made.
pub fn analyse(run: &LoopRun, peers: &[Vec<(usize, usize)>]) -> std::result::Result<Section, String> {
    let ranks = run.ranks.iter().map(|rl| RankLaunches::of(run, rl)).collect::<std::result::Result<Vec<_>, _>>()?;
    let pulses = stamped_pulses(peers.iter().map(Vec::len).max().unwrap_or(0));
    let mut rows = Vec::new();
    if run.coords {
        let per: Vec<Vec<&Record>> = ranks.iter().map(|r| r.coords.clone()).collect();
        rows.extend(launch_rows(X_INTERVALS, &per, pulses, "X: "));
        let recv_of = |r: usize, p: usize| peers.get(r)?.get(p).map(|&(_, recv)| recv);
        rows.extend(cross_rows(&per, &recv_of, pulses, xp::DELIVERED, xp::RECEIVED, "X: "));
    }
    if run.forces {
        let per: Vec<Vec<&Record>> = ranks.iter().map(|r| r.forces.clone()).collect();
        rows.extend(launch_rows(F_INTERVALS, &per, pulses, "F: "));
        let send_of = |r: usize, p: usize| peers.get(r)?.get(p).map(|&(send, _)| send);
        rows.extend(cross_rows(&per, &send_of, pulses, fp::SIGNALLED, fp::RECEIVED, "F: "));
    }
    rows.extend(stream_rows(run, &ranks));
    let slowest = |f: fn(&RankLoop) -> f64| run.ranks.iter().map(f).fold(0.0, f64::max);
    Ok(Section {
        title: format!("{}: {} steps after {} warm-up", run.title(), run.steps, run.warmup),
        per_step_us: (slowest(|r| r.plain_us_per_step), slowest(|r| r.stamped_us_per_step)),
        rows,
    })
}

/// The report: the timer, then one table per loop.
pub fn render(data: &TimelineData) -> std::result::Result<String, String> {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "halo timeline: {} atoms on {}, {}", data.atoms, data.grid, data.mode);
    for t in &data.timers {
        let smallest = t.smallest_step_ns.map_or("never changed".into(), |s| format!("{s} ns"));
        let mean = t.mean_step_ns.map_or("-".into(), |m| format!("{m:.0} ns"));
        let _ =
            writeln!(out, "%globaltimer, rank {}'s GPU: smallest nonzero step {smallest}, mean update period {mean} ({} changes)", t.rank, t.changes);
    }
    let _ = writeln!(
        out,
        "Single intervals are multiples of the update period; the means over many steps (out of phase with the timer) resolve \
         far below it. Cross-rank rows compare two GPUs' clocks: read the pair mean."
    );
    for run in &data.loops {
        let s = analyse(run, &data.peers)?;
        let width = s.rows.iter().map(|r| r.label.chars().count()).max().unwrap_or(0) + 2;
        let _ = writeln!(
            out,
            "\n== {}; per step (events, slowest rank): plain kernels {:.2} µs, stamped {:.2} µs",
            s.title, s.per_step_us.0, s.per_step_us.1
        );
        let _ = write!(out, "{:width$}", "µs: median / mean / p90");
        for r in &run.ranks {
            let _ = write!(out, "  {:>26}", format!("rank {}", r.rank));
        }
        out.push('\n');
        for row in &s.rows {
            let _ = write!(out, "{:width$}", row.label);
            for cell in &row.ranks {
                let text = cell.map_or("-".to_string(), |c| format!("{:.3} / {:.3} / {:.3}", c.median, c.mean, c.p90));
                let _ = write!(out, "  {text:>26}");
            }
            out.push('\n');
        }
    }
    Ok(out)
}

// ----------------------------------------------------------------------------------------------
// Measurement.

/// `CLOCK_REALTIME` in ns (what `%globaltimer` is usually set from).
fn realtime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes one timespec; CLOCK_REALTIME is always available.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The directions of one step of `phase` (`true`: forces), in launch order.
fn directions(phase: Phase) -> Vec<bool> {
    let mut v = Vec::new();
    phase
        .repeat(1, |forces| {
            v.push(forces);
            Ok::<(), ()>(())
        })
        .ok();
    v
}

/// Each local rank's (coordinate, force) rings.
type Rings = Vec<(TimelineRing, TimelineRing)>;

/// Elapsed µs per step between `starts` and `ends` on each local rank.
fn per_step_us(starts: &[cudarc::driver::CudaEvent], ends: &[cudarc::driver::CudaEvent], steps: usize) -> Result<Vec<f64>> {
    starts.iter().zip(ends).map(|(a, b)| Ok(a.elapsed_ms(b).during("reading a timing event")? as f64 * 1e3 / steps as f64)).collect()
}

/// Runs `warmup + steps` steps of `phase` (stamped into `rings` when given), launched or replayed;
/// returns each local rank's host launches and µs per measured step.
fn run_loop(
    x: &mut Box<dyn Exchange<Float3>>,
    rings: Option<&Rings>,
    phase: Phase,
    replay: bool,
    cfg: &TimelineConfig,
) -> Result<(Vec<Vec<HostLaunch>>, Vec<f64>)> {
    x.finish()?;
    if let Some(rings) = rings {
        for (rx, rf) in rings {
            rx.clear()?;
            rf.clear()?;
        }
    }
    x.barrier()?;
    let streams = x.streams().to_vec();
    let dirs = directions(phase);
    let enqueue = |rank: &mut crate::exchange::RankExchange<Float3>, r: usize, forces: bool| -> Result<()> {
        match (rings, forces) {
            (Some(rings), false) => rank.launch_coordinates_timeline(&streams[r], &rings[r].0),
            (Some(rings), true) => rank.launch_forces_timeline(&streams[r], &rings[r].1),
            (None, false) => rank.launch_coordinates(Transport::Fused, &streams[r]),
            (None, true) => rank.launch_forces(&streams[r]),
        }
    };
    let graphs = if replay {
        let ranks = x.local_ranks_mut();
        ranks
            .iter_mut()
            .enumerate()
            .map(|(r, rank)| graph::capture_with(&streams[r], || dirs.iter().try_for_each(|&f| enqueue(rank, r, f))))
            .collect::<Result<Vec<_>>>()?
    } else {
        Vec::new()
    };
    let mut host: Vec<Vec<HostLaunch>> = vec![Vec::with_capacity((cfg.warmup + cfg.steps) * dirs.len()); streams.len()];
    let mut starts = Vec::new();
    for step in 0..cfg.warmup + cfg.steps {
        if step == cfg.warmup {
            starts = streams.iter().map(|s| floor::timing_event(s)).collect::<Result<Vec<_>>>()?;
        }
        if replay {
            for (r, g) in graphs.iter().enumerate() {
                let call_ns = realtime_ns();
                g.launch().during("replaying a captured step")?;
                host[r].push(HostLaunch { call_ns, return_ns: realtime_ns(), kernels: dirs.len() as u32 });
            }
        } else {
            for &forces in &dirs {
                for (r, rank) in x.local_ranks_mut().iter_mut().enumerate() {
                    let call_ns = realtime_ns();
                    enqueue(rank, r, forces)?;
                    host[r].push(HostLaunch { call_ns, return_ns: realtime_ns(), kernels: 1 });
                }
            }
        }
    }
    let ends = streams.iter().map(|s| floor::timing_event(s)).collect::<Result<Vec<_>>>()?;
    x.finish()?;
    let us = per_step_us(&starts, &ends, cfg.steps)?;
    drop(graphs);
    Ok((host, us))
}

/// One full step (coordinates, then forces) of the fused kernels, stamped into `rings` when given,
/// on fresh random data from `seed`, compared with the CPU reference; the verdict agreed by every
/// process (collective). A mismatch is an error: the timeline then reports nothing.
fn check_step(
    x: &mut Box<dyn Exchange<Float3>>,
    rings: Option<&Rings>,
    halos: &[RankHalo],
    placement: &Placement,
    seed: u64,
    when: &str,
) -> Result<()> {
    x.finish()?;
    if let Some(rings) = rings {
        for (rx, rf) in rings {
            rx.clear()?;
            rf.clear()?;
        }
    }
    let mine = step::checked_step_with(x.as_mut(), halos, seed, |x| {
        let streams = x.streams().to_vec();
        for forces in [false, true] {
            for (r, rank) in x.local_ranks_mut().iter_mut().enumerate() {
                match (rings, forces) {
                    (Some(rings), false) => rank.launch_coordinates_timeline(&streams[r], &rings[r].0)?,
                    (Some(rings), true) => rank.launch_forces_timeline(&streams[r], &rings[r].1)?,
                    (None, false) => rank.launch_coordinates(Transport::Fused, &streams[r])?,
                    (None, true) => rank.launch_forces(&streams[r])?,
                }
            }
        }
        Ok(())
    })?;
    let kernels = if rings.is_some() { "stamped" } else { "plain" };
    step::agree(placement, &format!("timeline-check-{when}"), &mine)?.map(|_| ()).map_err(|why| {
        HaloError::InvalidInput(format!(
            "the {kernels} fused step {when} the measured loops does not match the CPU reference, so no timeline is reported: {why}"
        ))
    })
}

/// Every loop on the ranks `placement` puts here; every rank's data on every process. Before the
/// loops and after them one step of the plain and of the stamped kernels is checked against the
/// CPU reference; the loops run on the random data the checks leave.
fn measure(cfg: &TimelineConfig, placement: &Placement, halos: Vec<RankHalo>) -> Result<Vec<LoopRun>> {
    let mut x = placement.exchange::<Float3>(halos.clone())?;
    x.set_wait_timeout(cfg.wait_timeout);
    x.check_transport(Transport::Fused)?;
    let launches = cfg.warmup + cfg.steps;
    let rings: Rings = x
        .local_ranks()
        .iter()
        .map(|r| Ok((TimelineRing::new(r.context(), launches)?, TimelineRing::new(r.context(), launches)?)))
        .collect::<Result<_>>()?;
    let seed = cfg.seed.wrapping_add(77);
    check_step(&mut x, None, &halos, placement, seed, "before")?;
    check_step(&mut x, Some(&rings), &halos, placement, seed.wrapping_add(1), "before")?;
    let mut loops = Vec::new();
    for replay in [false, true] {
        for phase in Phase::ALL {
            let (_, plain) = run_loop(&mut x, None, phase, replay, cfg)?;
            let (host, stamped) = run_loop(&mut x, Some(&rings), phase, replay, cfg)?;
            let mine = x
                .local_ranks()
                .iter()
                .zip(&rings)
                .enumerate()
                .map(|(i, (rank, (rx, rf)))| {
                    let data = RankLoop {
                        rank: rank.rank(),
                        coords: rx.read()?,
                        forces: rf.read()?,
                        host: host[i].clone(),
                        stamped_us_per_step: stamped[i],
                        plain_us_per_step: plain[i],
                    };
                    serde_json::to_vec(&data).map_err(|e| HaloError::InvalidInput(format!("encoding the timeline: {e}")))
                })
                .collect::<Result<Vec<_>>>()?;
            let tag = format!("timeline-{}-{}", loops.len(), if replay { "graph" } else { "launch" });
            let ranks = placement
                .all_gather(&tag, mine)?
                .iter()
                .map(|b| serde_json::from_slice(b).map_err(|e| HaloError::InvalidInput(format!("decoding a rank's timeline: {e}"))))
                .collect::<Result<Vec<RankLoop>>>()?;
            loops.push(LoopRun {
                coords: phase != Phase::Forces,
                forces: phase != Phase::Coordinates,
                graph: replay,
                warmup: cfg.warmup,
                steps: cfg.steps,
                ranks,
            });
        }
    }
    check_step(&mut x, None, &halos, placement, seed.wrapping_add(2), "after")?;
    check_step(&mut x, Some(&rings), &halos, placement, seed.wrapping_add(3), "after")?;
    drop(rings);
    Ok(loops)
}

/// Each local rank's GPU timer, gathered from every process (indexed by rank).
fn timers(placement: &Placement, modules: &[(usize, Arc<KernelModule>)]) -> Result<Vec<RankTimer>> {
    let mine = modules
        .iter()
        .map(|(rank, m)| {
            let stream = m.context().new_stream().during("creating a probe stream")?;
            let t = RankTimer::new(*rank, globaltimer_resolution(m, &stream, RESOLUTION_POLLS)?);
            serde_json::to_vec(&t).map_err(|e| HaloError::InvalidInput(format!("encoding the timer: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    placement
        .all_gather("timeline-timer", mine)?
        .iter()
        .map(|b| serde_json::from_slice(b).map_err(|e| HaloError::InvalidInput(format!("decoding a rank's timer: {e}"))))
        .collect()
}

/// Runs every loop: in one process, or under a launcher one rank per process. Returns the data on
/// rank 0 (and in one process), `None` on the other ranks.
pub fn run(cfg: &TimelineConfig) -> Result<Option<TimelineData>> {
    if cfg.steps == 0 || cfg.warmup + cfg.steps > crate::exchange::rank::timeline::MAX_RECORDS {
        return Err(HaloError::InvalidInput(format!(
            "--steps must be at least 1 and --warmup + --steps at most {} (one record per launch)",
            crate::exchange::rank::timeline::MAX_RECORDS
        )));
    }
    let halos = build_halos(cfg.halos, cfg.atoms, cfg.grid, cfg.cutoff, cfg.seed)?;
    let peers: Vec<Vec<(usize, usize)>> = halos.iter().map(|h| h.pulses.iter().map(|p| (p.send_rank, p.recv_rank)).collect()).collect();
    let nranks: usize = cfg.grid.iter().product();
    let grid = format!("{}x{}x{}", cfg.grid[0], cfg.grid[1], cfg.grid[2]);
    let (mode, placement, modules, me, _session) = match RankEnv::from_env() {
        Some(env) if env.nranks > 1 => {
            let session = PeSession::start(env, cfg.nvshmem_lib.as_deref())?;
            let (me, npes) = (session.nvshmem.my_pe(), session.nvshmem.n_pes());
            if npes != nranks {
                return Err(HaloError::InvalidInput(format!("--ranks {grid} has {nranks} ranks but {npes} processes run")));
            }
            let placement = Placement::pe(&session, PathPolicy::Auto);
            let modules = vec![(me, session.module.clone())];
            (format!("{npes} processes, one GPU each (NVSHMEM)"), placement, modules, me, Some(session))
        }
        _ => {
            if let Some(reason) = gpu::gpu_unavailable_reason() {
                return Err(HaloError::NoGpu(format!("halo timeline needs a GPU: {reason}")));
            }
            let want = if cfg.gpus == 0 { nranks.min(gpu::device_count()) } else { cfg.gpus.min(gpu::device_count()) }.max(1);
            let artifacts = crate::artifacts::KernelArtifacts::locate(crate::artifacts::DEFAULT_ARCH)?;
            let loaded = (0..want).map(|i| Ok(Arc::new(KernelModule::load(&gpu::open_device(i)?, &artifacts)?))).collect::<Result<Vec<_>>>()?;
            // Rank r runs on GPU r % want (the exchange's placement); one timer per rank.
            let modules = (0..nranks).map(|r| (r, loaded[r % want].clone())).collect();
            (format!("one process on {want} GPU(s)"), Placement::Local(loaded), modules, 0, None)
        }
    };
    let timers = timers(&placement, &modules)?;
    let loops = measure(cfg, &placement, halos)?;
    Ok((me == 0).then_some(TimelineData { mode, atoms: cfg.atoms, grid, peers, timers, loops }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stamps of one launch: the global words, then pulse 0's points at the given offsets (ns)
    /// from `t0`; 0 = not stamped.
    fn record(t0: u64, entry_last: u64, end: u64, points: &[(usize, u64)]) -> Record {
        let mut r = layout::initial_record();
        r[layout::ENTRY_FIRST] = t0;
        r[layout::ENTRY_LAST] = t0 + entry_last;
        r[layout::END] = t0 + end;
        for &(p, dt) in points {
            r[pulse_slot(0, p).unwrap()] = t0 + dt;
        }
        r
    }

    /// A coordinate launch at `t0`: packed +300, elected +500, delivered +600, received +2600,
    /// end +2700 (credit +100, no dependency wait).
    fn x_launch(t0: u64, received: u64) -> Record {
        record(
            t0,
            40,
            received + 100,
            &[(xp::CREDIT, 100), (xp::PACKED, 300), (xp::ELECTED, 500), (xp::ELECTED_ENTRY, 20), (xp::DELIVERED, 600), (xp::RECEIVED, received)],
        )
    }

    fn rank_loop(rank: usize, coords: Vec<Record>, forces: Vec<Record>, host: Vec<HostLaunch>) -> RankLoop {
        RankLoop { rank, coords, forces, host, stamped_us_per_step: 8.0, plain_us_per_step: 7.5 }
    }

    fn row<'a>(s: &'a Section, label: &str) -> &'a Row {
        s.rows
            .iter()
            .find(|r| r.label == label)
            .unwrap_or_else(|| panic!("no row `{label}` in {:#?}", s.rows.iter().map(|r| &r.label).collect::<Vec<_>>()))
    }

    /// Asserts the median of `label` on `rank` is `want` µs.
    #[track_caller]
    fn median(s: &Section, label: &str, rank: usize, want: f64) {
        let got = row(s, label).ranks[rank].unwrap_or_else(|| panic!("`{label}` not measured on rank {rank}")).median;
        assert!((got - want).abs() < 1e-9, "`{label}` on rank {rank}: median {got} µs, expected {want}");
    }

    /// Two ranks, X only, one pulse each way; rank 1's clock is 5 µs ahead of rank 0's. Each
    /// step starts 10 µs after the previous one; the signal takes 1.3 µs from one GPU to the other.
    fn two_rank_x_loop(warmup: usize, steps: usize) -> LoopRun {
        let offset = 5_000u64;
        let mut ranks = Vec::new();
        for rank in 0..2u64 {
            let coords = (0..(warmup + steps) as u64)
                .rev() // ring order is not time order
                .map(|k| {
                    let t0 = 1_000_000 + k * 10_000;
                    // Both deliver at t0 + 600 (true time); each sees the other's at t0 + 1900.
                    x_launch(t0 + rank * offset, 1_900)
                })
                .collect();
            let host = (0..(warmup + steps) as u64)
                .map(|k| HostLaunch { call_ns: 1_000_000 + k * 10_000 - 3_000, return_ns: 1_000_000 + k * 10_000 - 1_000, kernels: 1 })
                .collect();
            ranks.push(rank_loop(rank as usize, coords, vec![], host));
        }
        LoopRun { coords: true, forces: false, graph: false, warmup, steps, ranks }
    }

    const PEERS_2X1X1: [(usize, usize); 2] = [(1, 1), (0, 0)];

    fn peers() -> Vec<Vec<(usize, usize)>> {
        PEERS_2X1X1.iter().map(|&p| vec![p]).collect()
    }

    #[test]
    fn spreads_of_known_intervals() {
        let s = Spread::of_ns(&[1000, 3000, 2000, 10_000]).unwrap();
        assert_eq!((s.n, s.median, s.mean, s.p90), (4, 2.5, 4.0, 10.0));
        let s = Spread::of_ns(&[-500]).unwrap();
        assert_eq!((s.median, s.p90), (-0.5, -0.5));
        assert!(Spread::of_ns(&[]).is_none());
        // Nearest-rank p90 of 1..=10 µs is 9 µs.
        let s = Spread::of_ns(&(1..=10).map(|i| i * 1000).collect::<Vec<_>>()).unwrap();
        assert_eq!(s.p90, 9.0);
    }

    #[test]
    fn intervals_inside_a_launch_come_from_the_stamps() {
        let run = two_rank_x_loop(3, 20);
        let s = analyse(&run, &peers()).unwrap();
        for rank in 0..2 {
            median(&s, "X: blocks enter: first -> last", rank, 0.04);
            median(&s, "X: first entry -> credit checked", rank, 0.1);
            median(&s, "X: credit -> pass 1 packed", rank, 0.2);
            median(&s, "X: pass 1 -> last block elected (put)", rank, 0.2);
            median(&s, "X: pass 1 -> delivered (words: stored)", rank, 0.3);
            median(&s, "X: first entry -> elected block's entry (put)", rank, 0.02);
            median(&s, "X: elected -> signal issued (put)", rank, 0.1);
            median(&s, "X: delivered -> own pulse in", rank, 1.3);
            median(&s, "X: own pulse in -> kernel end", rank, 0.1);
            median(&s, "X: kernel: first entry -> end", rank, 2.0);
            assert_eq!(row(&s, "X: kernel: first entry -> end").ranks[rank].unwrap().n, 20, "warm-up left out");
        }
        // No block waited for dependencies: no such row.
        assert!(s.rows.iter().all(|r| !r.label.contains("dependency")));
        assert_eq!(s.per_step_us, (7.5, 8.0));
        assert!(s.title.starts_with("X only, plain launches: 20 steps after 3 warm-up"), "{}", s.title);
    }

    #[test]
    fn the_pair_mean_cancels_the_clock_offset_between_gpus() {
        let s = analyse(&two_rank_x_loop(0, 10), &peers()).unwrap();
        // Rank 0 sees rank 1's signal 1.3 µs after it left, but rank 1's clock is 5 µs ahead.
        median(&s, "X: peer's signal -> seen here (+ clock offset)", 0, -3.7);
        median(&s, "X: peer's signal -> seen here (+ clock offset)", 1, 6.3);
        for rank in 0..2 {
            median(&s, "X: one-way hop, offset cancelled (pair mean)", rank, 1.3);
        }
        median(&s, "X: clock offset, this GPU - peer's", 0, -5.0);
        median(&s, "X: clock offset, this GPU - peer's", 1, 5.0);
    }

    #[test]
    fn gaps_and_host_rows_follow_the_stream_order() {
        let s = analyse(&two_rank_x_loop(2, 8), &peers()).unwrap();
        // Launch k ends at t0 + 2000, launch k+1 starts at t0 + 10 000.
        median(&s, "GPU gap X -> X: end -> next first entry", 0, 8.0);
        assert_eq!(row(&s, "GPU gap X -> X: end -> next first entry").ranks[0].unwrap().n, 7, "gaps between measured launches only");
        median(&s, "host: cuLaunchKernel call", 0, 2.0);
        median(&s, "host: between cuLaunchKernel calls", 1, 10.0);
        median(&s, "host call -> GPU first entry (CLOCK_REALTIME vs %globaltimer)", 0, 3.0);
        median(&s, "host call -> GPU first entry (CLOCK_REALTIME vs %globaltimer)", 1, 8.0);
        assert!(!s.rows.iter().any(|r| r.label.starts_with("GPU gap F")));
    }

    #[test]
    fn a_replayed_step_of_two_kernels_is_one_host_call() {
        // One rank (a ring of one: its own peer), X+F replayed: each host call enqueues X then F.
        let (warmup, steps) = (1usize, 4usize);
        let mut coords = Vec::new();
        let mut forces = Vec::new();
        let mut host = Vec::new();
        for k in 0..(warmup + steps) as u64 {
            let t0 = 50_000 + k * 20_000;
            coords.push(x_launch(t0, 1_900));
            let f = record(
                t0 + 2_500,
                10,
                3_000,
                &[
                    (fp::CHAIN, 100),
                    (fp::PUSHED, 400),
                    (fp::ELECTED_ENTRY, 5),
                    (fp::SIGNALLED, 450),
                    (fp::RECEIVED, 2_000),
                    (fp::ACCUMULATED, 2_300),
                    (fp::ROW_DONE, 2_400),
                ],
            );
            forces.push(f);
            host.push(HostLaunch { call_ns: t0 - 4_000, return_ns: t0 - 2_500, kernels: 2 });
        }
        let run = LoopRun { coords: true, forces: true, graph: true, warmup, steps, ranks: vec![rank_loop(0, coords, forces, host)] };
        let s = analyse(&run, &[vec![(0, 0)]]).unwrap();
        median(&s, "host: cuGraphLaunch call", 0, 1.5);
        assert_eq!(row(&s, "host: cuGraphLaunch call").ranks[0].unwrap().n, steps);
        // The host call is matched with the step's first kernel (X), not with F.
        median(&s, "host call -> GPU first entry (CLOCK_REALTIME vs %globaltimer)", 0, 4.0);
        median(&s, "GPU gap X -> F: end -> next first entry", 0, 0.5);
        median(&s, "GPU gap F -> X: end -> next first entry", 0, 20.0 - 5.5);
        median(&s, "F: delivered -> peer's push in", 0, 1.55);
        median(&s, "F: push in -> accumulated", 0, 0.3);
        median(&s, "F: row done -> kernel end", 0, 0.6);
        median(&s, "F: kernel: first entry -> end", 0, 3.0);
        // Its own peer: the hop and its reverse are the same launch, the offset is zero.
        median(&s, "F: clock offset, this GPU - peer's", 0, 0.0);
    }

    #[test]
    fn clocks_that_are_not_comparable_are_named() {
        let mut run = two_rank_x_loop(0, 5);
        for rl in &mut run.ranks {
            for h in &mut rl.host {
                h.call_ns += 3_000_000_000;
                h.return_ns += 3_000_000_000;
            }
        }
        let s = analyse(&run, &peers()).unwrap();
        let r = s.rows.iter().find(|r| r.label.starts_with("host call -> GPU first entry")).unwrap();
        assert!(r.label.contains("clocks differ by -3.0 s, not comparable"), "{}", r.label);
        assert!(r.ranks.iter().all(Option::is_none));
    }

    #[test]
    fn missing_records_are_an_error_naming_the_loop_and_rank() {
        let mut run = two_rank_x_loop(2, 5);
        run.ranks[1].coords.pop();
        let e = analyse(&run, &peers()).unwrap_err();
        assert!(e.contains("X only, plain launches: rank 1 has 6 stamped coordinate launches, 7 were made"), "{e}");
    }

    #[test]
    fn the_report_lists_every_rank_and_the_timer() {
        let data = TimelineData {
            mode: "one process on 2 GPU(s)".into(),
            atoms: 45_000,
            grid: "2x1x1".into(),
            peers: peers(),
            timers: vec![RankTimer { rank: 0, smallest_step_ns: Some(32), mean_step_ns: Some(1000.0), changes: 900 }],
            loops: vec![two_rank_x_loop(1, 4)],
        };
        let text = render(&data).unwrap();
        assert!(text.contains("smallest nonzero step 32 ns, mean update period 1000 ns (900 changes)"), "{text}");
        assert!(
            text.contains(
                "== X only, plain launches: 4 steps after 1 warm-up; per step (events, slowest rank): plain kernels 7.50 µs, stamped 8.00 µs"
            ),
            "{text}"
        );
        assert!(text.contains("rank 0") && text.contains("rank 1"), "{text}");
        assert!(text.lines().any(|l| l.starts_with("X: delivered -> own pulse in") && l.contains("1.300 / 1.300 / 1.300")), "{text}");
        // The raw data round-trips through JSON (what --json writes and the PEs exchange).
        let back: TimelineData = serde_json::from_str(&serde_json::to_string(&data).unwrap()).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn a_step_of_each_phase_launches_its_directions_in_order() {
        assert_eq!(directions(Phase::Coordinates), [false]);
        assert_eq!(directions(Phase::Forces), [true]);
        assert_eq!(directions(Phase::Step), [false, true]);
    }
}
