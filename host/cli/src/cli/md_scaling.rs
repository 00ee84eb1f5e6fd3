//! `halo md-scaling`: the strong-scaling table of the MD step in one command. It measures the
//! `halo md-bench` rows of 1 rank and of 2 ranks in this process, then starts `halo launch -n 2 --
//! md-bench` for the rows of 2 PEs, on the GPUs present: on one GPU both ranks share it (the PEs
//! through CUDA MPS when it runs), on two or more the ranks get GPUs 0 and 1. All rows go into one
//! JSON document with, per size, transport and mode, the 2-rank step time over the 1-rank one. The
//! command fails, after writing the document, when any row did not pass its checks.

use super::md_bench::{self, MdBenchArgs};
use crate::bench::md::{self, MdBenchRow};
use anyhow::{Context, Result, bail};
use halo::decomp::RankGrid;
use halo::exchange::Transport;
use halo::gpu;
use halo::launch::RankEnv;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The document's format version (bumped when a field changes meaning).
pub const SCHEMA_VERSION: u32 = 1;

#[derive(clap::Args, Clone, Debug)]
pub struct MdScalingArgs {
    /// System sizes in atoms, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "45000,180000")]
    pub atoms: Vec<usize>,
    /// Transports, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "fused", value_parser = super::transport_parser())]
    pub transport: Vec<Transport>,
    /// Timed steps per repeat, a multiple of 100 (the list lifetime; search steps included).
    #[arg(long, default_value_t = 1000)]
    pub steps: u64,
    /// Timed repeats (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Untimed warm-up steps.
    #[arg(long, default_value_t = 200)]
    pub warmup: u64,
    /// GPUs for the 2-rank rows, 1 or 2 (default: 2 when two are visible, else 1; with 1, both
    /// ranks share GPU 0).
    #[arg(long)]
    pub gpus: Option<usize>,
    /// Where to write the rows, their ratios and the notes (JSON).
    #[arg(long, default_value = "docs/results/md-scaling/md-scaling.json")]
    pub out: PathBuf,
    /// NVSHMEM host library for the 2-PE rows (default: discovered).
    #[arg(long)]
    pub nvshmem_lib: Option<PathBuf>,
    /// Measure the 2-PE rows on one GPU without CUDA MPS (time-sliced: they then do not measure
    /// the split, and the document says so). Without it such a run is refused.
    #[arg(long)]
    pub allow_time_sliced: bool,
    /// Also time every row's phases on the GPU after its timed steps (`halo md-bench --phases`):
    /// where the step's time goes with 1 rank, 2 ranks in one process and 2 PEs, side by side.
    #[arg(long)]
    pub phases: bool,
    /// Also record where every row's search steps spend their host time, part by part (`halo
    /// md-bench --search-parts`).
    #[arg(long)]
    pub search_parts: bool,
    /// Every row on the same system with its atoms in an order drawn from the seed (`halo
    /// md-bench --shuffle-atoms`: ids without spatial locality, as after a long run).
    #[arg(long)]
    pub shuffle_atoms: bool,
}

/// The whole table: every row `halo md-bench` measured, the ratios and what the reader must know.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScalingDoc {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// GPUs the 2-rank rows ran on (1: both ranks on GPU 0).
    pub gpus: usize,
    /// Whether CUDA MPS ran when the 2 PEs started.
    pub mps: MpsState,
    /// What qualifies the rows (e.g. PEs sharing a GPU without MPS).
    pub notes: Vec<String>,
    /// The rows as `halo md-bench --json` writes them, by size, then 1 rank, 2 ranks in one
    /// process, 2 PEs.
    pub rows: Vec<MdBenchRow>,
    /// Per size, transport and 2-rank mode: its step time over the 1-rank one.
    pub ratios: Vec<Ratio>,
}

/// One 2-rank row beside the 1-rank row of the same size and transport.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    /// Atoms in the system.
    pub atoms: usize,
    /// Transport name (`+graph` when its steps were replayed as CUDA graphs).
    pub transport: String,
    /// The 2-rank row's mode (`one process`, `2 PEs (NVSHMEM) on 1 GPU(s)`, ...).
    pub mode: String,
    /// GPUs of the 2-rank row.
    pub gpus: usize,
    /// Its rank grid.
    pub ranks: String,
    /// The 1-rank step (µs, median).
    pub one_rank_step_us: f64,
    /// The 2-rank step (µs, median).
    pub step_us: f64,
    /// `step_us / one_rank_step_us` (below 1: the 2 ranks are faster).
    pub ratio: f64,
}

/// Whether a CUDA MPS daemon serves this machine's GPUs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MpsState {
    /// An `nvidia-cuda-mps-control` or `-server` process is visible here.
    pub daemon: bool,
    /// The MPS pipe directory (`CUDA_MPS_PIPE_DIRECTORY`, else `/tmp/nvidia-mps`).
    pub pipe_dir: String,
    /// Its `control` pipe exists.
    pub pipe_present: bool,
}

impl MpsState {
    /// Looks at the processes and the pipe directory.
    pub fn detect() -> MpsState {
        let me = std::process::id().to_string();
        let daemon = std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|e| {
            e.file_name().to_str() != Some(me.as_str())
                && std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim_end().starts_with("nvidia-cuda-mps"))
        });
        let pipe_dir = std::env::var("CUDA_MPS_PIPE_DIRECTORY").ok().filter(|d| !d.is_empty()).unwrap_or_else(|| "/tmp/nvidia-mps".into());
        let pipe_present = Path::new(&pipe_dir).join("control").exists();
        MpsState { daemon, pipe_dir, pipe_present }
    }

    /// Either sign of a running daemon.
    pub fn running(&self) -> bool {
        self.daemon || self.pipe_present
    }
}

/// The note for PEs that share one GPU without MPS, or `None` when it does not apply.
pub fn mps_note(gpus: usize, mps: &MpsState) -> Option<String> {
    (gpus == 1 && !mps.running()).then(|| {
        format!(
            "CUDA MPS is not running (no nvidia-cuda-mps process, no control pipe in {}): the 2 PEs sharing GPU 0 are time-sliced \
             instead of running side by side, so their rows do not measure the split; start it with `nvidia-cuda-mps-control -d` and run again",
            mps.pipe_dir
        )
    })
}

/// [`mps_note`] for rows that are allowed to be time-sliced (`allow`); otherwise such rows are
/// refused before anything is measured.
pub fn check_sharing(gpus: usize, mps: &MpsState, allow: bool) -> Result<Option<String>> {
    match mps_note(gpus, mps) {
        Some(n) if !allow => bail!("md-scaling: {n} (or pass --allow-time-sliced to measure them as they are)"),
        note => Ok(note),
    }
}

impl MdScalingArgs {
    /// The `halo md-bench` arguments (subcommand name first) of one set of rows: `ranks` ranks,
    /// `gpus` GPUs in one process when given, the rows written to `json` when given.
    pub fn md_bench_words(&self, ranks: RankGrid, gpus: Option<usize>, json: Option<&Path>) -> Vec<OsString> {
        let join = |v: Vec<String>| v.join(",");
        let mut w: Vec<OsString> = [
            "md-bench".to_string(),
            "--atoms".into(),
            join(self.atoms.iter().map(|a| a.to_string()).collect()),
            "--transport".into(),
            join(self.transport.iter().map(|t| t.to_string()).collect()),
            "--steps".into(),
            self.steps.to_string(),
            "--repeats".into(),
            self.repeats.to_string(),
            "--warmup".into(),
            self.warmup.to_string(),
            "--ranks".into(),
            ranks.to_string(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        if let Some(g) = gpus {
            w.extend(["--gpus".into(), g.to_string().into()]);
        }
        if let Some(p) = json {
            w.extend(["--json".into(), p.as_os_str().to_owned()]);
        }
        if let Some(lib) = &self.nvshmem_lib {
            w.extend(["--nvshmem-lib".into(), lib.as_os_str().to_owned()]);
        }
        if self.phases {
            w.push("--phases".into());
        }
        if self.search_parts {
            w.push("--search-parts".into());
        }
        if self.shuffle_atoms {
            w.push("--shuffle-atoms".into());
        }
        w
    }

    /// The `halo` arguments of the 2-PE rows: `launch -n 2 --gpus 0` (one GPU) or `0,1`, then
    /// md-bench writing its rows to `json`.
    pub fn launch_words(&self, gpus: usize, json: &Path) -> Vec<OsString> {
        let list = (0..gpus).map(|g| g.to_string()).collect::<Vec<_>>().join(",");
        let mut w: Vec<OsString> = ["launch", "-n", "2", "--gpus", &list, "--"].into_iter().map(OsString::from).collect();
        w.extend(self.md_bench_words(RankGrid { dims: [2, 1, 1] }, None, Some(json)));
        w
    }

    /// In-process md-bench options from `words` (as `halo md-bench` would parse them).
    fn md_bench_args(words: Vec<OsString>) -> Result<MdBenchArgs> {
        #[derive(clap::Parser)]
        struct MdBenchOnly {
            #[command(flatten)]
            args: MdBenchArgs,
        }
        Ok(<MdBenchOnly as clap::Parser>::try_parse_from(words).context("building the md-bench options")?.args)
    }
}

/// The 2-rank rows' step times over the 1-rank row of the same size and transport (checked rows
/// with times only).
pub fn ratios(rows: &[MdBenchRow]) -> Vec<Ratio> {
    let ranks = |r: &MdBenchRow| r.ranks.parse::<RankGrid>().map(|g| g.num_ranks()).ok();
    let timed = |r: &&MdBenchRow| r.checked && r.step_us_median.is_some();
    let name = |r: &MdBenchRow| if r.graph { format!("{}+graph", r.transport) } else { r.transport.clone() };
    rows.iter()
        .filter(timed)
        .filter(|r| ranks(r) == Some(2))
        .filter_map(|r| {
            let one =
                rows.iter().filter(timed).find(|b| ranks(b) == Some(1) && b.atoms == r.atoms && b.transport == r.transport && b.graph == r.graph)?;
            let (base, step) = (one.step_us_median?, r.step_us_median?);
            Some(Ratio {
                atoms: r.atoms,
                transport: name(r),
                mode: r.mode.clone(),
                gpus: r.gpus,
                ranks: r.ranks.clone(),
                one_rank_step_us: base,
                step_us: step,
                ratio: step / base,
            })
        })
        .collect()
}

/// The document of `parts` (the rows of each run, in order), sorted by size (stable: 1 rank, 2 ranks
/// in one process, 2 PEs within a size), with their ratios.
pub fn merge(gpus: usize, mps: MpsState, notes: Vec<String>, parts: Vec<Vec<MdBenchRow>>) -> ScalingDoc {
    let mut rows: Vec<MdBenchRow> = parts.into_iter().flatten().collect();
    rows.sort_by_key(|r| r.atoms);
    let ratios = ratios(&rows);
    ScalingDoc { schema_version: SCHEMA_VERSION, gpus, mps, notes, rows, ratios }
}

impl ScalingDoc {
    /// The machine, one table per mode, the ratios and the notes.
    pub fn text(&self) -> String {
        let mut s = String::new();
        if let Some(r) = self.rows.first() {
            s.push_str(&r.machine.text());
        }
        let mut modes: Vec<&str> = self.rows.iter().map(|r| r.mode.as_str()).collect();
        modes.sort();
        modes.dedup();
        // `one process` first (it holds the 1-rank rows), then the PEs.
        modes.sort_by_key(|m| *m != "one process");
        for mode in modes {
            let rows: Vec<MdBenchRow> = self.rows.iter().filter(|r| r.mode == mode).cloned().collect();
            s.push_str(&md::table(&rows));
        }
        let _ = writeln!(s, "2 ranks beside 1 rank (median step times; below 1.00x the 2 ranks are faster):");
        if self.ratios.is_empty() {
            let _ = writeln!(s, "  none: no size has both a checked 1-rank row and a checked 2-rank row");
        }
        for r in &self.ratios {
            let mode = if r.mode == "one process" { format!("one process on {} GPU(s)", r.gpus) } else { r.mode.clone() };
            let _ =
                writeln!(s, "  {:>7} atoms, {}, {mode}: {:.1} us / {:.1} us = {:.2}x", r.atoms, r.transport, r.step_us, r.one_rank_step_us, r.ratio);
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        s
    }

    /// An error naming every row that did not pass its checks, and a missing set of rows.
    pub fn passed(&self, expected_rows: usize) -> Result<()> {
        if let Some(why) = md::failures(&self.rows) {
            bail!("md-scaling: {why}");
        }
        if self.rows.len() < expected_rows {
            bail!("md-scaling: {} of the {expected_rows} rows were measured (see the notes above)", self.rows.len());
        }
        Ok(())
    }
}

/// The GPUs of the 2-rank rows: `asked` (1 or 2) or 2 when two are visible, else 1.
fn gpus_to_use(asked: Option<usize>, visible: usize) -> Result<usize> {
    match asked {
        None => Ok(visible.clamp(1, 2)),
        Some(g @ 1..=2) if g <= visible => Ok(g),
        Some(g @ 1..=2) => bail!("--gpus {g}: only {visible} GPU(s) visible; use --gpus {}", visible.clamp(1, 2)),
        Some(g) => bail!("--gpus {g}: the 2-rank rows use 1 GPU (both ranks on it) or 2"),
    }
}

/// Rows of the 2 PEs: `halo launch -n 2 ... -- md-bench --json TMP` as a child of this process
/// (its output passes through); the rows it wrote, and what went wrong when anything did.
fn pe_rows(args: &MdScalingArgs, gpus: usize) -> (Vec<MdBenchRow>, Option<String>) {
    let tmp = std::env::temp_dir().join(format!("halo-md-scaling-{}.json", std::process::id()));
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return (Vec::new(), Some(format!("finding the halo executable: {e}"))),
    };
    let words = args.launch_words(gpus, &tmp);
    eprintln!("md-scaling: {} {}", exe.display(), words.iter().map(|w| w.to_string_lossy()).collect::<Vec<_>>().join(" "));
    child_rows(&exe, &words, &tmp)
}

/// Runs `program words`, which writes md-bench rows to `json`; the rows read back (none when it
/// wrote none), and the problem when it failed, wrote none or wrote what does not read as rows.
fn child_rows(program: &Path, words: &[OsString], json: &Path) -> (Vec<MdBenchRow>, Option<String>) {
    let _ = std::fs::remove_file(json);
    let status = match std::process::Command::new(program).args(words).status() {
        Ok(status) => status,
        Err(e) => return (Vec::new(), Some(format!("starting {}: {e}", program.display()))),
    };
    let text = std::fs::read_to_string(json);
    let _ = std::fs::remove_file(json);
    let rows = match text.map(|t| md::MdBenchDoc::rows_of(&t)) {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => return (Vec::new(), Some(format!("the 2-PE rows it wrote do not read as md-bench rows: {e}"))),
        Err(_) => Vec::new(),
    };
    let problem = match (status.success(), rows.is_empty()) {
        (true, false) => None,
        (true, true) => Some("the 2-PE run wrote no rows".to_string()),
        (false, true) => Some(format!("the 2-PE run ended with {status} and wrote no rows")),
        (false, false) => Some(format!("the 2-PE run ended with {status}")),
    };
    (rows, problem)
}

pub fn run(args: MdScalingArgs) -> Result<()> {
    if args.atoms.is_empty() || args.transport.is_empty() {
        bail!("give at least one size (--atoms) and one transport (--transport)");
    }
    if RankEnv::from_env().is_some_and(|e| e.nranks > 1) {
        bail!("halo md-scaling starts its own 2 PEs: run it directly, not under `halo launch` or a process manager");
    }
    // Bad options are refused before the GPU is looked at, and the output folder made before any row runs.
    gpus_to_use(args.gpus, 2)?;
    let (one, two) = (RankGrid { dims: [1, 1, 1] }, RankGrid { dims: [2, 1, 1] });
    let single = MdScalingArgs::md_bench_args(args.md_bench_words(one, Some(1), None))?;
    single.validate()?;
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        bail!("halo md-scaling needs an NVIDIA GPU: {reason}");
    }
    let gpus = gpus_to_use(args.gpus, gpu::device_count())?;
    let split = MdScalingArgs::md_bench_args(args.md_bench_words(two, Some(gpus), None))?;
    let mps = MpsState::detect();
    let mut notes: Vec<String> = check_sharing(gpus, &mps, args.allow_time_sliced)?.into_iter().collect();
    for n in &notes {
        eprintln!("md-scaling: note: {n}");
    }
    let mut parts = vec![md_bench::local_rows(&single)?, md_bench::local_rows(&split)?];
    // The rows so far are written before the 2 PEs start, so that a run ended during theirs (a
    // time limit) still leaves them; the file is written again with every row below.
    let pending = [notes.clone(), vec!["2-PE rows: not measured yet (the run ended before they were)".to_string()]].concat();
    let partial = merge(gpus, mps.clone(), pending, parts.clone());
    std::fs::write(&args.out, serde_json::to_string_pretty(&partial)?).with_context(|| format!("writing {}", args.out.display()))?;
    let (pe, problem) = pe_rows(&args, gpus);
    parts.push(pe);
    notes.extend(problem.iter().map(|p| format!("2-PE rows: {p}")));
    let doc = merge(gpus, mps, notes, parts);
    print!("{}", doc.text());
    std::fs::write(&args.out, serde_json::to_string_pretty(&doc)?).with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    doc.passed(3 * args.atoms.len() * args.transport.len())?;
    match problem {
        Some(p) => bail!("md-scaling: {p}"),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: MdScalingArgs,
    }

    fn args(words: &[&str]) -> MdScalingArgs {
        Cli::try_parse_from(std::iter::once("md-scaling").chain(words.iter().copied())).unwrap().args
    }

    fn row(atoms: usize, ranks: &str, mode: &str, gpus: usize, us: f64) -> MdBenchRow {
        let mut r = md::tests::row("fused", atoms, us);
        (r.ranks, r.mode, r.gpus) = (ranks.into(), mode.into(), gpus);
        r
    }

    const PES: &str = "2 PEs (NVSHMEM) on 1 GPU(s)";

    fn one_gpu_rows() -> Vec<Vec<MdBenchRow>> {
        vec![
            vec![row(45_000, "1x1x1", "one process", 1, 65.1), row(180_000, "1x1x1", "one process", 1, 188.3)],
            vec![row(45_000, "2x1x1", "one process", 1, 87.7), row(180_000, "2x1x1", "one process", 1, 219.7)],
            vec![row(45_000, "2x1x1", PES, 1, 82.7), row(180_000, "2x1x1", PES, 1, 211.5)],
        ]
    }

    #[test]
    fn the_defaults_are_the_scaling_table() {
        let a = args(&[]);
        assert_eq!((a.atoms, a.transport, a.repeats, a.steps, a.warmup), (vec![45_000, 180_000], vec![Transport::Fused], 5, 1000, 200));
        assert_eq!((a.out, a.gpus), (PathBuf::from("docs/results/md-scaling/md-scaling.json"), None));
    }

    #[test]
    fn the_child_is_halo_launch_of_md_bench_with_the_same_options() {
        let a = args(&["--atoms", "6000,45000", "--transport", "fused,staged", "--steps", "500", "--repeats", "3", "--warmup", "100"]);
        let words = |w: Vec<OsString>| w.iter().map(|w| w.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ");
        let bench = "md-bench --atoms 6000,45000 --transport fused,staged --steps 500 --repeats 3 --warmup 100 --ranks 2x1x1";
        assert_eq!(words(a.launch_words(1, Path::new("/tmp/x.json"))), format!("launch -n 2 --gpus 0 -- {bench} --json /tmp/x.json"));
        assert_eq!(words(a.launch_words(2, Path::new("/tmp/x.json"))), format!("launch -n 2 --gpus 0,1 -- {bench} --json /tmp/x.json"));
        let lib = args(&["--nvshmem-lib", "/opt/libnvshmem_host.so.3"]);
        assert!(words(lib.launch_words(1, Path::new("o.json"))).ends_with("--json o.json --nvshmem-lib /opt/libnvshmem_host.so.3"));
        // The child's words are what `halo` itself parses: launch, then md-bench after `--`.
        let cli = crate::cli::command();
        let m = cli.try_get_matches_from(std::iter::once(OsString::from("halo")).chain(a.launch_words(2, Path::new("/tmp/x.json")))).unwrap();
        let (sub, launch) = m.subcommand().unwrap();
        assert_eq!(sub, "launch");
        let trailing: Vec<OsString> = launch.get_many::<OsString>("command").unwrap().cloned().collect();
        let bench_args = MdScalingArgs::md_bench_args(trailing).unwrap();
        assert_eq!((bench_args.atoms, bench_args.repeats, bench_args.steps, bench_args.warmup), (vec![6000, 45_000], 3, 500, 100));
        assert_eq!(bench_args.transport, vec![Transport::Fused, Transport::Staged]);
        assert_eq!((bench_args.ranks.map(|g| g.dims), bench_args.gpus, bench_args.json), (Some([2, 1, 1]), None, Some(PathBuf::from("/tmp/x.json"))));
        // The in-process rows: one rank on one GPU, two ranks on the GPUs asked for.
        let one = MdScalingArgs::md_bench_args(a.md_bench_words(RankGrid { dims: [1, 1, 1] }, Some(1), None)).unwrap();
        assert_eq!((one.ranks.map(|g| g.dims), one.gpus, one.json), (Some([1, 1, 1]), Some(1), None));
        assert!(!one.graph && one.step.nstlist == crate::cli::StepArgs::default().nstlist);
        assert!(!one.phases);
        // `--phases` reaches every md-bench child.
        let p = args(&["--phases"]);
        assert!(words(p.launch_words(1, Path::new("o.json"))).ends_with("--json o.json --phases"));
        assert!(MdScalingArgs::md_bench_args(p.md_bench_words(RankGrid { dims: [2, 1, 1] }, Some(1), None)).unwrap().phases);
        // So does `--search-parts`.
        assert!(!one.search_parts);
        let sp = args(&["--search-parts"]);
        assert!(words(sp.launch_words(1, Path::new("o.json"))).ends_with("--json o.json --search-parts"));
        assert!(MdScalingArgs::md_bench_args(sp.md_bench_words(RankGrid { dims: [2, 1, 1] }, Some(1), None)).unwrap().search_parts);
        // So does `--shuffle-atoms`, and only when asked.
        assert!(!one.step.shuffle_atoms);
        let s = args(&["--shuffle-atoms"]);
        assert!(words(s.launch_words(1, Path::new("o.json"))).ends_with("--json o.json --shuffle-atoms"));
        assert!(MdScalingArgs::md_bench_args(s.md_bench_words(RankGrid { dims: [2, 1, 1] }, Some(1), None)).unwrap().step.shuffle_atoms);
    }

    #[test]
    fn two_gpus_when_two_are_visible_and_never_more() {
        assert_eq!(gpus_to_use(None, 1).unwrap(), 1);
        assert_eq!(gpus_to_use(None, 2).unwrap(), 2);
        assert_eq!(gpus_to_use(None, 8).unwrap(), 2);
        assert_eq!(gpus_to_use(Some(1), 8).unwrap(), 1);
        let e = gpus_to_use(Some(2), 1).unwrap_err().to_string();
        assert!(e.contains("only 1 GPU(s) visible; use --gpus 1"), "{e}");
        let e = gpus_to_use(Some(4), 8).unwrap_err().to_string();
        assert!(e.contains("--gpus 4") && e.contains("or 2"), "{e}");
        assert!(gpus_to_use(Some(0), 8).is_err());
    }

    #[test]
    fn the_ratio_is_each_two_rank_step_over_the_one_rank_step_of_its_size() {
        let doc = merge(1, MpsState { daemon: true, ..MpsState::default() }, vec![], one_gpu_rows());
        assert_eq!(doc.schema_version, 1);
        let order: Vec<(usize, &str, &str)> = doc.rows.iter().map(|r| (r.atoms, r.ranks.as_str(), r.mode.as_str())).collect();
        assert_eq!(
            order,
            [
                (45_000, "1x1x1", "one process"),
                (45_000, "2x1x1", "one process"),
                (45_000, "2x1x1", PES),
                (180_000, "1x1x1", "one process"),
                (180_000, "2x1x1", "one process"),
                (180_000, "2x1x1", PES)
            ]
        );
        let got: Vec<(usize, &str, String)> = doc.ratios.iter().map(|r| (r.atoms, r.mode.as_str(), format!("{:.3}", r.ratio))).collect();
        assert_eq!(
            got,
            [
                (45_000, "one process", "1.347".to_string()),
                (45_000, PES, "1.270".to_string()),
                (180_000, "one process", "1.167".to_string()),
                (180_000, PES, "1.123".to_string())
            ]
        );
        assert_eq!((doc.ratios[0].one_rank_step_us, doc.ratios[0].step_us, doc.ratios[0].ranks.as_str()), (65.1, 87.7, "2x1x1"));
        assert!(doc.passed(6).is_ok());
        // Rows without a 1-rank row of their size and transport, or not checked, give no ratio.
        let mut rows = one_gpu_rows();
        rows[0][0].transport = "staged".into();
        rows[2][1].checked = false;
        let r = ratios(&rows.into_iter().flatten().collect::<Vec<_>>());
        assert_eq!(r.iter().map(|r| (r.atoms, r.mode.as_str())).collect::<Vec<_>>(), [(180_000, "one process")]);
    }

    #[test]
    fn the_document_has_the_rows_of_md_bench_and_reads_back() {
        let doc = merge(2, MpsState::default(), vec!["n".into()], one_gpu_rows());
        let v = serde_json::to_value(&doc).unwrap();
        assert_eq!((v["schema_version"].as_u64(), v["gpus"].as_u64(), v["rows"].as_array().map(Vec::len)), (Some(1), Some(2), Some(6)));
        for key in ["transport", "atoms", "gpus", "ranks", "mode", "step_us_median", "search_ms", "machine", "checked"] {
            assert!(v["rows"][0].get(key).is_some(), "missing {key}: {}", v["rows"][0]);
        }
        assert_eq!(v["ratios"][0]["ratio"].as_f64().map(|r| (r * 1000.0).round()), Some(1347.0));
        let back: ScalingDoc = serde_json::from_value(v).unwrap();
        assert_eq!((back.rows.len(), back.ratios.len(), &back.mps, &back.notes), (6, 4, &doc.mps, &doc.notes));
        assert_eq!((back.rows[2].mode.as_str(), back.ratios[1].mode.as_str()), (PES, PES));
    }

    #[test]
    fn the_table_separates_the_modes_and_ends_with_the_ratios_and_notes() {
        let doc = merge(1, MpsState::default(), vec!["CUDA MPS is not running".into()], one_gpu_rows());
        let t = doc.text();
        let pos = |needle: &str| t.find(needle).unwrap_or_else(|| panic!("no {needle:?} in {t}"));
        assert!(pos("halo md-bench: one process") < pos(&format!("halo md-bench: {PES}")), "{t}");
        assert!(pos(&format!("halo md-bench: {PES}")) < pos("2 ranks beside 1 rank"), "{t}");
        assert!(t.contains("   45000 atoms, fused, one process on 1 GPU(s): 87.7 us / 65.1 us = 1.35x"), "{t}");
        assert!(t.contains(&format!("  180000 atoms, fused, {PES}: 211.5 us / 188.3 us = 1.12x")), "{t}");
        assert!(t.trim_end().ends_with("note: CUDA MPS is not running"), "{t}");
        // The PE rows sit only in the PE table: its header line is followed by those rows alone.
        let pe_table = &t[pos(&format!("halo md-bench: {PES}"))..pos("2 ranks beside")];
        assert_eq!(pe_table.lines().filter(|l| l.contains("2x1x1")).count(), 2, "{pe_table}");
        assert!(!pe_table.contains("1x1x1"), "{pe_table}");
        let none = merge(1, MpsState::default(), vec![], vec![vec![row(45_000, "1x1x1", "one process", 1, 65.1)]]).text();
        assert!(none.contains("none: no size has both"), "{none}");
    }

    #[test]
    fn an_unchecked_or_missing_row_fails_the_command_naming_it() {
        let mut rows = one_gpu_rows();
        rows[2][0].checked = false;
        rows[2][0].check_failure = Some("verification failed at step 201: rank 1".into());
        let doc = merge(1, MpsState::default(), vec![], rows);
        let e = doc.passed(6).unwrap_err().to_string();
        assert!(e.contains("1 of 6 rows did not pass their checks") && e.contains(&format!("45000 atoms, fused, 2x1x1 ranks ({PES})")), "{e}");
        assert!(doc.text().contains("FAILED check: verification failed at step 201"));
        let mut rows = one_gpu_rows();
        rows.pop();
        let doc = merge(1, MpsState::default(), vec!["2-PE rows: the 2-PE run ended with exit status: 1 and wrote no rows".into()], rows);
        let e = doc.passed(6).unwrap_err().to_string();
        assert!(e.contains("4 of the 6 rows were measured"), "{e}");
    }

    #[test]
    fn pes_sharing_a_gpu_without_mps_are_named_in_a_note() {
        let off = MpsState { daemon: false, pipe_dir: "/tmp/nvidia-mps".into(), pipe_present: false };
        let note = mps_note(1, &off).expect("a note");
        assert!(
            note.starts_with("CUDA MPS is not running") && note.contains("/tmp/nvidia-mps") && note.contains("nvidia-cuda-mps-control -d"),
            "{note}"
        );
        assert_eq!(mps_note(2, &off), None, "PEs on their own GPUs need no MPS");
        // Time-sliced rows are refused unless allowed, and then carry the note.
        let e = check_sharing(1, &off, false).unwrap_err().to_string();
        assert!(e.contains("time-sliced") && e.contains("--allow-time-sliced"), "{e}");
        assert_eq!(check_sharing(1, &off, true).unwrap(), Some(note.clone()));
        assert_eq!(check_sharing(2, &off, false).unwrap(), None);
        assert_eq!(mps_note(1, &MpsState { daemon: true, ..off.clone() }), None);
        assert_eq!(mps_note(1, &MpsState { pipe_present: true, ..off.clone() }), None);
        // Here (no MPS on the machine that builds), detection finds neither sign unless a daemon runs.
        let here = MpsState::detect();
        assert_eq!(here.running(), here.daemon || here.pipe_present);
        assert!(!here.pipe_dir.is_empty());
    }

    #[test]
    fn the_child_rows_are_read_back_and_a_failed_or_silent_child_is_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        let (src, json) = (dir.path().join("src.json"), dir.path().join("rows.json"));
        let pes = one_gpu_rows().pop().unwrap();
        let doc = md::MdBenchDoc::new(pes);
        std::fs::write(&src, serde_json::to_string(&doc).unwrap()).unwrap();
        let sh = |script: &str| -> (Vec<MdBenchRow>, Option<String>) {
            let words: Vec<OsString> = vec!["-c".into(), script.into(), src.clone().into(), json.clone().into()];
            child_rows(Path::new("/bin/sh"), &words, &json)
        };
        let (rows, problem) = sh(r#"cp "$0" "$1""#);
        assert_eq!((rows.len(), rows[1].atoms, rows[1].mode.as_str(), problem), (2, 180_000, PES, None));
        assert!(!json.exists(), "the child's file is removed once read");
        let (rows, problem) = sh(r#"cp "$0" "$1"; exit 3"#);
        assert_eq!((rows.len(), problem.as_deref()), (2, Some("the 2-PE run ended with exit status: 3")));
        let (rows, problem) = sh("exit 1");
        assert_eq!((rows.len(), problem.as_deref()), (0, Some("the 2-PE run ended with exit status: 1 and wrote no rows")));
        let (rows, problem) = sh("true");
        assert_eq!((rows.len(), problem.as_deref()), (0, Some("the 2-PE run wrote no rows")));
        // A file left by an earlier run is not read as this run's rows.
        std::fs::copy(&src, &json).unwrap();
        assert_eq!(sh("true").0.len(), 0);
        let (rows, problem) = sh(r#"echo '{"rows": 1}' > "$1""#);
        assert!(
            rows.is_empty() && problem.as_deref().is_some_and(|p| p.starts_with("the 2-PE rows it wrote do not read as md-bench rows")),
            "{problem:?}"
        );
        let (_, problem) = child_rows(&dir.path().join("no-such-halo"), &[], &json);
        assert!(problem.as_deref().is_some_and(|p| p.starts_with("starting ") && p.contains("no-such-halo")), "{problem:?}");
    }
}
