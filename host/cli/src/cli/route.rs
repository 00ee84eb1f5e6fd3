//! `halo route`: the router's choice for every PE pair, with levels and scores.

use anyhow::{Context, Result};
use halo::route::{
    Decision, DistanceLevel, EXCHANGE_TRANSPORTS, Op, PerfTable, RouteConfig, Router, Topology, Transport, TransportSet, format_size, gpu_facts,
    parse_size, single_node, topology_from_facts, topology_from_file,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

/// Above this many PEs the table is printed one pair per line instead of as a matrix.
const MATRIX_MAX_PES: usize = 8;

#[derive(clap::Args)]
pub struct RouteArgs {
    /// Topology file (TOML: [node] shape, spines -> leaves -> racks -> nodes). Without it: one
    /// node of --pes GPUs, all NVLink-connected.
    #[arg(long)]
    topology: Option<PathBuf>,
    /// PEs of the synthetic single node (ignored with --topology).
    #[arg(long, default_value_t = 8)]
    pes: usize,
    /// Use the synthetic single node even when GPUs are present (default: discover the GPUs,
    /// one PE per visible GPU, or one per rank under `halo launch`).
    #[arg(long)]
    synthetic: bool,
    /// Message size: 1024, 16KiB, 1MiB, ...
    #[arg(long, default_value = "1KiB", value_parser = parse_size_arg)]
    size: u64,
    /// Operation: put, signal, amo or get.
    #[arg(long, default_value = "put", value_parser = parse_op_arg)]
    op: Op,
    /// Print JSON (every pair with every candidate) instead of tables.
    #[arg(long)]
    json: bool,
    /// Force a transport for one pair, both directions: 0-1=nvshmem-put (repeatable, or comma-separated).
    #[arg(long = "route-override", value_name = "A-B=TRANSPORT")]
    route_override: Vec<String>,
    /// Route config file (TOML; default: $HALO_ROUTE_CONFIG). Environment variables beat it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Score only these transports, as a caller that implements only them would see it:
    /// `all`, `exchange` (the halo exchange's: nvlink-store, nvlink-tma, nvshmem-put, staged) or
    /// a comma-separated list.
    #[arg(long, default_value = "all", value_parser = parse_among_arg)]
    among: TransportSet,
    /// Under a launcher without GPUs: each rank contributes synthetic facts (its host, one
    /// synthetic GPU per local rank) over the launch's CPU channel (`halo launch`'s rendezvous or
    /// PMI-1, e.g. MPICH's `mpiexec`); every rank prints its rank environment and the gathered
    /// topology's hash, rank 0 the table. A test of rank detection and fact gathering.
    #[arg(long)]
    gather: bool,
}

fn parse_among_arg(s: &str) -> Result<TransportSet, String> {
    if s.trim().eq_ignore_ascii_case("exchange") {
        return Ok(EXCHANGE_TRANSPORTS);
    }
    s.parse().map_err(|e: halo::route::RouteError| e.to_string())
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

fn parse_op_arg(s: &str) -> Result<Op, String> {
    s.parse().map_err(|e: halo::route::RouteError| e.to_string())
}

/// One cell of the table: the decision, or why there is none.
type Cell = Result<Decision, String>;

/// The topology to route over: a file, the discovered GPUs, or the synthetic node; also a
/// description, and whether this process prints the table (one rank of a launch does).
fn topology(args: &RouteArgs) -> Result<(Topology, String, bool)> {
    if let Some(path) = &args.topology {
        let (t, _, fabric) = topology_from_file(path).with_context(|| format!("loading {}", path.display()))?;
        let hosts = fabric.hosts().len();
        return Ok((t, format!("{} ({hosts} nodes)", path.display()), true));
    }
    let synthetic = |why: &str| -> Result<(Topology, String, bool)> {
        anyhow::ensure!(args.pes >= 1, "--pes must be at least 1");
        Ok((single_node(args.pes)?, format!("synthetic: one node, {} PEs all NVLink-connected ({why})", args.pes), true))
    };
    if args.gather {
        return gathered_synthetic(args);
    }
    if args.synthetic {
        return synthetic("--synthetic");
    }
    if let Some(reason) = halo::gpu::gpu_unavailable_reason() {
        return synthetic(&format!("no GPU discovery: {reason}"));
    }
    match halo::launch::RankEnv::from_env() {
        Some(env) if env.nranks > 1 => {
            let found = gpu_facts::discover(env.device).with_context(|| format!("discovering GPU {}", env.device))?;
            print_discovery(&format!("PE {} of {}: ", env.rank, env.nranks), &found);
            let facts = gpu_facts::gather("route-facts", &found.facts)?;
            let topo = topology_from_facts(&facts, fabric(args)?.as_ref())?;
            Ok((topo, format!("discovered: {} PEs under {}", env.nranks, env.source), env.rank == 0))
        }
        _ => {
            let gpus = halo::gpu::device_count();
            let (facts, found) = gpu_facts::local_rank_facts(gpus, gpus).context("discovering the GPUs")?;
            for f in &found {
                print_discovery("", f);
            }
            Ok((
                topology_from_facts(&facts, fabric(args)?.as_ref())?,
                format!("discovered: one PE per visible GPU ({gpus}) on {}", gpu_facts::hostname()),
                true,
            ))
        }
    }
}

/// `--gather`: this rank's environment, synthetic facts gathered from every rank over the
/// launch's CPU channel, and the topology they give (the same hash on every rank).
fn gathered_synthetic(args: &RouteArgs) -> Result<(Topology, String, bool)> {
    let env = halo::launch::RankEnv::try_from_env()?.unwrap_or_else(halo::launch::RankEnv::single);
    println!(
        "rank {} of {} (local rank {}, device {}), started by {}, NVSHMEM bootstrap {}",
        env.rank,
        env.nranks,
        env.local_rank,
        env.device,
        env.source,
        env.bootstrap.describe()
    );
    let facts = gpu_facts::gather("route-facts", &gpu_facts::synthetic_rank_facts(env.local_rank)).context("gathering the facts")?;
    halo::launch::pmi::finalize()?;
    anyhow::ensure!(facts.len() == env.nranks, "gathered {} facts from {} ranks", facts.len(), env.nranks);
    let topo = topology_from_facts(&facts, fabric(args)?.as_ref())?;
    let hosts: std::collections::BTreeSet<&str> = facts.iter().map(|f| f.host.as_str()).collect();
    println!("rank {}: gathered the facts of {} ranks on {} host(s): topology hash {}", env.rank, facts.len(), hosts.len(), topo.hash_hex());
    Ok((topo, format!("synthetic facts gathered from {} ranks under {}", env.nranks, env.source), env.rank == 0))
}

/// Where the nodes sit, when the route config names a topology (HALO_ROUTE_TOPOLOGY: a halo TOML
/// file or Slurm's topology.conf / scontrol show topology output).
fn fabric(args: &RouteArgs) -> Result<Option<halo::route::Fabric>> {
    Ok(RouteConfig::load(args.config.as_deref(), &|k| std::env::var(k).ok())?.fabric()?)
}

/// One GPU's discovery: UUID, and how every other GPU is reached, with the evidence.
fn print_discovery(prefix: &str, d: &gpu_facts::GpuDiscovery) {
    println!(
        "{prefix}GPU {} {} {} on {}{}",
        d.ordinal,
        d.name,
        d.facts.gpu_uuid,
        d.facts.host,
        match &d.nvml {
            Ok(()) => String::new(),
            Err(e) => format!(" (NVML unavailable: {e}; NVLink inferred from P2P native atomics)"),
        }
    );
    for l in &d.links {
        println!("{prefix}  -> {l}");
    }
}

pub fn run(args: RouteArgs) -> Result<()> {
    let (topo, described, prints) = topology(&args)?;
    if !prints {
        return Ok(());
    }
    let mut config = RouteConfig::load(args.config.as_deref(), &|k| std::env::var(k).ok())?;
    config.add_cli_overrides("--route-override", &args.route_override)?;
    config.validate()?;
    let perf = Arc::new(match &config.calibration {
        Some(c) => PerfTable::load_calibration(&c.value)?,
        None => PerfTable::defaults(),
    });
    let topo = Arc::new(topo);
    let n = topo.n_pes();
    let mut cells: Vec<Vec<Cell>> = Vec::with_capacity(n);
    for src in 0..n {
        let mut router = Router::with_perf(src, Arc::clone(&topo), config.clone(), Arc::clone(&perf))?;
        let mut row = Vec::with_capacity(n);
        for dst in 0..n {
            // route() first so HALO_ROUTE_DEBUG prints its block and a one-sided bitmap warns.
            row.push(
                router
                    .route_among(dst, args.op, args.size, args.among)
                    .and_then(|_| router.decide_among(dst, args.op, args.size, args.among))
                    .map_err(|e| e.to_string()),
            );
        }
        cells.push(row);
    }
    if args.json {
        print_json(&topo, &described, &config, &args, &cells)?;
    } else {
        let text = render_text(&topo, &described, &config, &args, &cells, perf.calibrated_pairs())?;
        std::io::stdout().write_all(text.as_bytes()).context("writing the table")?;
    }
    Ok(())
}

fn render_text(
    topo: &Topology,
    described: &str,
    config: &RouteConfig,
    args: &RouteArgs,
    cells: &[Vec<Cell>],
    calibrated: usize,
) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    let n = topo.n_pes();
    let w = config.weights.at(halo::route::class_bytes(halo::route::size_class(args.size)));
    writeln!(out, "topology: {described}")?;
    writeln!(out, "  {topo}")?;
    writeln!(
        out,
        "operation: {} of {} (weights: latency {:.2}, bandwidth {:.2}, topology {:.2}, capability {:.2}, reliability {:.2})",
        args.op,
        format_size(args.size),
        w.latency,
        w.bandwidth,
        w.topology,
        w.capability,
        w.reliability
    )?;
    if calibrated == 0 {
        writeln!(out, "performance numbers: default, not measured (run `halo calibrate` on the GPUs)")?;
    } else {
        writeln!(
            out,
            "performance numbers: {calibrated} transport/level pairs calibrated, the rest default \
             (a default-only transport is a candidate only where no measured one can serve the pair)"
        )?;
    }
    if args.among != TransportSet::ALL {
        writeln!(out, "candidates: {} (--among)", args.among)?;
    }
    for line in config.describe().iter().filter(|l| !l.contains("(default)") && !l.starts_with("calibration = none")) {
        writeln!(out, "  {line}")?;
    }
    writeln!(out)?;
    if n <= MATRIX_MAX_PES {
        write_matrix(&mut out, "level (row: source PE, column: destination PE)", cells, |d| format!(" {:>17}", d.distance.level.name()))?;
        writeln!(out)?;
        write_matrix(&mut out, "transport score", cells, |d| format!(" {:>12} {:.2}{}", d.route.transport.name(), d.route.score, mark(d)))?;
        if cells.iter().flatten().any(|c| c.as_ref().is_ok_and(|d| d.forced_by.is_some())) {
            writeln!(out, "(* forced by an override)")?;
        }
    } else {
        writeln!(out, "{:>6} {:>6} {:>17} {:>12} {:>6}", "src", "dst", "level", "transport", "score")?;
        for (src, row) in cells.iter().enumerate() {
            for (dst, c) in row.iter().enumerate() {
                match c {
                    Ok(d) => writeln!(
                        out,
                        "{src:>6} {dst:>6} {:>17} {:>12} {:>6.3}{}",
                        d.distance.level.name(),
                        d.route.transport.name(),
                        d.route.score,
                        mark(d)
                    )?,
                    Err(e) => writeln!(out, "{src:>6} {dst:>6} error: {e}")?,
                }
            }
        }
    }
    let mut counts: BTreeMap<(DistanceLevel, Transport), usize> = BTreeMap::new();
    let mut errors = Vec::new();
    for (src, row) in cells.iter().enumerate() {
        for (dst, c) in row.iter().enumerate() {
            match c {
                Ok(d) => *counts.entry((d.distance.level, d.route.transport)).or_default() += 1,
                Err(e) => errors.push(format!("{src} -> {dst}: {e}")),
            }
        }
    }
    writeln!(out)?;
    writeln!(out, "pairs by level and transport:")?;
    for ((level, t), k) in counts {
        writeln!(out, "  {:>17} -> {:<12} {k}", level.name(), t.name())?;
    }
    if !errors.is_empty() {
        writeln!(out, "{} pairs have no usable route:", errors.len())?;
        for e in errors.iter().take(20) {
            writeln!(out, "  {e}")?;
        }
    }
    Ok(out)
}

/// One PE x PE table: a title, a header of destination PEs, then a row per source PE whose cells
/// `cell` formats (failed decisions print `error`).
fn write_matrix(out: &mut String, title: &str, cells: &[Vec<Cell>], cell: impl Fn(&Decision) -> String) -> std::fmt::Result {
    writeln!(out, "{title}")?;
    write!(out, "{:>5}", "")?;
    for dst in 0..cells.len() {
        write!(out, " {dst:>17}")?;
    }
    writeln!(out)?;
    for (src, row) in cells.iter().enumerate() {
        write!(out, "{src:>5}")?;
        for c in row {
            match c {
                Ok(d) => out.push_str(&cell(d)),
                Err(_) => write!(out, " {:>17}", "error")?,
            }
        }
        writeln!(out)?;
    }
    Ok(())
}

fn mark(d: &Decision) -> &'static str {
    if d.forced_by.is_some() { "*" } else { " " }
}

fn print_json(topo: &Topology, described: &str, config: &RouteConfig, args: &RouteArgs, cells: &[Vec<Cell>]) -> Result<()> {
    let mut pairs = Vec::new();
    for (src, row) in cells.iter().enumerate() {
        for (dst, c) in row.iter().enumerate() {
            pairs.push(match c {
                Ok(d) => json!({
                    "src": src,
                    "dst": dst,
                    "level": d.distance.level,
                    "bitmap_hit": d.distance.hit.map(|l| l.index()),
                    "one_sided": d.distance.one_sided.map(|(l, by)| json!({"level": l, "claimed_by": by})),
                    "transport": d.route.transport,
                    "score": d.route.score,
                    "reason": format!("{:?}", d.route.reason),
                    "forced_by": d.forced_by.as_ref().map(|s| s.to_string()),
                    "candidates": d.scoring.candidates.iter().map(|c| json!({
                        "transport": c.transport,
                        "latency_us": c.latency_us,
                        "bandwidth_gbs": c.bandwidth_gbs,
                        "calibrated": c.calibrated,
                        "score": c.score,
                        "excluded": c.excluded.map(|e| e.to_string()),
                    })).collect::<Vec<_>>(),
                }),
                Err(e) => json!({"src": src, "dst": dst, "error": e}),
            });
        }
    }
    let out = json!({
        "topology": {"source": described, "n_pes": topo.n_pes(), "epoch": topo.epoch(), "hash": topo.hash_hex()},
        "op": args.op,
        "size": args.size,
        "among": args.among.iter().map(|t| t.name()).collect::<Vec<_>>(),
        "config": config.describe(),
        "pairs": pairs,
    });
    let mut text = serde_json::to_string_pretty(&out)?;
    text.push('\n');
    std::io::stdout().write_all(text.as_bytes()).context("writing JSON")?;
    Ok(())
}
