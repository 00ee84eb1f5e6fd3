//! `--jitter-us` and `--fault`: the flags that stand for `HALO_JITTER_US` and `HALO_FAULT`
//! (`halo::exchange::perturb`), shared by the subcommands that build exchanges.

use anyhow::Result;
use halo::exchange::perturb::{self, FAULT_ENV, JITTER_ENV, Perturbation};
use std::sync::Arc;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct PerturbArgs {
    /// Test only: before about half of the launches of every rank, wait up to MAX_US µs on the
    /// host and hold the rank's stream as long on the GPU (random, reproducible from SEED; SIDE:
    /// host, gpu or both). Overrides HALO_JITTER_US.
    #[arg(long, value_name = "MAX_US[:SEED[:SIDE]]")]
    pub jitter_us: Option<String>,
    /// Test only: kill@STEP:RANK makes rank RANK kill itself (SIGKILL) right after enqueueing step
    /// STEP's coordinate halo. Negative controls, which every check must catch:
    /// corrupt-atom:rank=R,pulse=P[,slot=K][,step=S] overwrites one atom rank R received in pulse P
    /// (slot K of that pulse, default the middle one) on the GPU after step S's halo (default 0);
    /// drop-atom:... leaves it at the previous step's value instead (step S >= 1, default 1).
    /// Overrides HALO_FAULT.
    #[arg(long, value_name = "FAULT")]
    pub fault: Option<String>,
}

impl PerturbArgs {
    /// Fixes this process's jitter and fault (each flag overriding its variable) before any
    /// exchange is built, prints what they do, and returns them.
    pub fn install(&self) -> Result<Option<Arc<Perturbation>>> {
        let pick = |flag: &Option<String>, name: &'static str, var: &'static str| match flag {
            Some(v) => (Some(v.clone()), name),
            None => (std::env::var(var).ok(), var),
        };
        let (jitter, jitter_name) = pick(&self.jitter_us, "--jitter-us", JITTER_ENV);
        let (fault, fault_name) = pick(&self.fault, "--fault", FAULT_ENV);
        let p = Perturbation::parse(jitter.as_deref(), fault.as_deref(), (jitter_name, fault_name))?;
        perturb::install(p.clone())?;
        for line in p.iter().flat_map(|p| p.describe()) {
            println!("{line}");
        }
        Ok(p)
    }
}
