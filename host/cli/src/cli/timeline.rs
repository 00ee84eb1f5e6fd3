//! `halo timeline`: the fused halo's kernels with `%globaltimer` stamps, and where each step's
//! time goes. In one process, or under `halo launch -n 2 -- timeline` (rank 0 prints;
//! every rank must get the same options). The work is in `bench::timeline`.

use crate::bench::timeline::{self, TimelineConfig};
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct TimelineArgs {
    /// System size in atoms.
    #[arg(long, default_value_t = 45_000)]
    pub atoms: usize,
    /// Rank grid, e.g. 2x1x1.
    #[arg(long, default_value = "2x1x1", value_parser = super::exchange_check::parse_grid)]
    pub ranks: [usize; 3],
    /// Measured steps per loop (six loops: X, F, X+F, launched and replayed as graphs).
    #[arg(long, default_value_t = 400)]
    pub steps: usize,
    /// Steps before the measured ones (stamped, then left out).
    #[arg(long, default_value_t = 50)]
    pub warmup: usize,
    /// The halos, their placement on GPUs and the wait deadline.
    #[command(flatten)]
    pub halo: super::bench::HaloArgs,
    /// Write every stamp and host launch (and the timer probe) as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// NVSHMEM host library to use (default: discovered).
    #[arg(long)]
    pub nvshmem_lib: Option<PathBuf>,
}

impl TimelineArgs {
    fn config(&self) -> TimelineConfig {
        TimelineConfig {
            atoms: self.atoms,
            grid: self.ranks,
            steps: self.steps,
            warmup: self.warmup,
            halos: self.halo.halos,
            cutoff: self.halo.cutoff,
            seed: self.halo.seed,
            gpus: self.halo.gpus,
            wait_timeout: Duration::from_millis(self.halo.wait_timeout_ms),
            nvshmem_lib: self.nvshmem_lib.clone(),
        }
    }
}

pub fn run(args: TimelineArgs) -> Result<()> {
    let Some(data) = timeline::run(&args.config()).context("running the timeline probe")? else {
        return Ok(()); // not rank 0
    };
    print!("{}", timeline::render(&data).map_err(anyhow::Error::msg).context("analysing the stamps")?);
    if let Some(path) = &args.json {
        let text = serde_json::to_string(&data).context("serialising the stamps")?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::HaloSource;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TimelineArgs,
    }

    #[test]
    fn defaults_and_options() {
        let a = Cli::try_parse_from(["timeline"]).unwrap().args;
        assert_eq!((a.atoms, a.ranks, a.steps, a.warmup), (45_000, [2, 1, 1], 400, 50));
        let a = Cli::try_parse_from(["timeline", "--atoms", "6000", "--ranks", "2x2x2", "--steps", "100", "--halos", "synthetic"]).unwrap().args;
        let c = a.config();
        assert_eq!((c.atoms, c.grid, c.steps, c.halos), (6000, [2, 2, 2], 100, HaloSource::Synthetic));
        assert!(Cli::try_parse_from(["timeline", "--ranks", "2x1"]).is_err());
    }
}
