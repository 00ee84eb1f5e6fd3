//! Which rank this process is: from `halo launch`'s variables or from the usual MPI/Slurm ones.
//!
//! Every launcher exports rank and size under its own names. We read ours first, because `halo launch`
//! may itself run inside a Slurm allocation or an `mpirun` (whose variables the children then inherit
//! but which describe the launcher, not them), then the MPI launchers, then Slurm, whose variables are
//! also present under `mpirun` inside an allocation and describe the batch step instead.

use super::LaunchError;

/// `halo launch` sets this to the rank of the child.
pub const ENV_RANK: &str = "HALO_RANK";
/// `halo launch` sets this to the number of ranks.
pub const ENV_NRANKS: &str = "HALO_NRANKS";
/// `halo launch` sets this to the rank's index among the ranks of its node.
pub const ENV_LOCAL_RANK: &str = "HALO_LOCAL_RANK";
/// `halo launch` sets this to the CUDA device ordinal the rank should use; honoured under any launcher.
pub const ENV_DEVICE: &str = "HALO_DEVICE";
/// `halo launch` sets this to its private rendezvous directory (see [`super::rendezvous`]).
pub const ENV_RENDEZVOUS_DIR: &str = "HALO_RENDEZVOUS_DIR";
/// `halo launch` sets this to the number of ranks that share this rank's GPU; set it yourself
/// under mpirun/srun when several ranks share a GPU (see [`pes_per_gpu`]).
pub const ENV_PES_PER_GPU: &str = "HALO_PES_PER_GPU";

/// How many ranks share this rank's GPU: [`ENV_PES_PER_GPU`] when set (1 when it is not a
/// positive number), else what the process learnt itself ([`set_pes_per_gpu`]), else 1. The
/// exchange divides the GPU's resident blocks among them, so that the spinning kernels of every
/// rank on the GPU fit at once when they run concurrently (MPS).
pub fn pes_per_gpu() -> usize {
    match std::env::var(ENV_PES_PER_GPU) {
        Ok(v) => parse_pes_per_gpu(Some(&v)),
        Err(_) => LEARNT_PES_PER_GPU.get().copied().unwrap_or(1),
    }
}

/// The ranks sharing this rank's GPU as the process found them (its MPI communicator:
/// `PeSession::init_with_mpi`, where no launcher sets [`ENV_PES_PER_GPU`]).
static LEARNT_PES_PER_GPU: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Records that `n` ranks share this rank's GPU, for [`pes_per_gpu`] (the environment variable,
/// when set, still wins). The first record of the process stays.
pub fn set_pes_per_gpu(n: usize) {
    let _ = LEARNT_PES_PER_GPU.set(n.max(1));
}

/// [`pes_per_gpu`] from the variable's value.
pub fn parse_pes_per_gpu(value: Option<&str>) -> usize {
    value.and_then(|v| v.trim().parse::<usize>().ok()).filter(|&n| n > 0).unwrap_or(1)
}

/// How the NVSHMEM processes of a run find each other, implied by whoever started them.
///
/// halo only reports it: the NVSHMEM runtime picks its init path from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bootstrap {
    /// Started by `halo launch`: rank 0 creates NVSHMEM's unique id and hands it to the others
    /// through [`super::rendezvous`]; NVSHMEM is then initialised with the unique-id attributes.
    UniqueId,
    /// Started by `mpirun` (Open MPI, MVAPICH2): NVSHMEM's MPI bootstrap plugin (`NVSHMEM_BOOTSTRAP=MPI`).
    Mpi,
    /// Started by a PMI-1/PMI-2 process manager (`srun` with its default or `--mpi=pmi2` plugin,
    /// MPICH's Hydra): NVSHMEM's PMI bootstrap (`NVSHMEM_BOOTSTRAP=PMI`, `NVSHMEM_BOOTSTRAP_PMI=PMI` or `PMI-2`).
    Pmi,
    /// Started by a PMIx server (`srun --mpi=pmix`, PRRTE): NVSHMEM's PMI bootstrap in its PMIx flavour
    /// (`NVSHMEM_BOOTSTRAP=PMI`, `NVSHMEM_BOOTSTRAP_PMI=PMIX`).
    Pmix,
    /// A single process that no launcher started: no bootstrap is needed for one rank.
    None,
}

impl Bootstrap {
    /// A short human-readable name, for `halo info` and error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Bootstrap::UniqueId => "unique id (halo launch)",
            Bootstrap::Mpi => "MPI",
            Bootstrap::Pmi => "PMI",
            Bootstrap::Pmix => "PMIx",
            Bootstrap::None => "none (single process)",
        }
    }
}

/// Rank, size, node-local rank and GPU of this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEnv {
    /// This process's rank, `0..nranks`.
    pub rank: usize,
    /// Number of ranks in the run.
    pub nranks: usize,
    /// Index among the ranks on this node; equals `rank` when the launcher does not say.
    pub local_rank: usize,
    /// CUDA device ordinal to use (an index into the devices this process can see).
    pub device: usize,
    /// How NVSHMEM should bootstrap, implied by the launcher.
    pub bootstrap: Bootstrap,
    /// Which launcher's variables were read, e.g. `"halo launch"` or `"Slurm"`.
    pub source: &'static str,
}

/// One launcher's variable names, in the order [`RankEnv::from_vars`] tries them.
struct Flavour {
    source: &'static str,
    rank: &'static str,
    size: &'static str,
    /// `None` where the launcher has no node-local rank of its own.
    local_rank: Option<&'static str>,
    bootstrap: Bootstrap,
}

const FLAVOURS: &[Flavour] = &[
    Flavour { source: "halo launch", rank: ENV_RANK, size: ENV_NRANKS, local_rank: Some(ENV_LOCAL_RANK), bootstrap: Bootstrap::UniqueId },
    Flavour {
        source: "Open MPI",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
        bootstrap: Bootstrap::Mpi,
    },
    Flavour {
        source: "MVAPICH2",
        rank: "MV2_COMM_WORLD_RANK",
        size: "MV2_COMM_WORLD_SIZE",
        local_rank: Some("MV2_COMM_WORLD_LOCAL_RANK"),
        bootstrap: Bootstrap::Mpi,
    },
    // MPICH's Hydra and Intel MPI export PMI_RANK/PMI_SIZE and the node-local rank as MPI_LOCALRANKID.
    Flavour { source: "PMI (MPICH Hydra)", rank: "PMI_RANK", size: "PMI_SIZE", local_rank: Some("MPI_LOCALRANKID"), bootstrap: Bootstrap::Pmi },
    // srun: the bootstrap (PMI vs PMIx) depends on its --mpi plugin, decided in `slurm_bootstrap`.
    Flavour { source: "Slurm", rank: "SLURM_PROCID", size: "SLURM_NTASKS", local_rank: Some("SLURM_LOCALID"), bootstrap: Bootstrap::Pmi },
];

impl RankEnv {
    /// Reads this process's rank from the environment; `None` when no launcher started it (or its
    /// variables are malformed, which is logged as a warning — use [`RankEnv::try_from_env`] to get
    /// the error instead).
    ///
    /// See [`RankEnv::from_vars`] for the variables and their precedence.
    pub fn from_env() -> Option<RankEnv> {
        match Self::try_from_env() {
            Ok(env) => env,
            Err(e) => {
                tracing::warn!("ignoring the launcher's environment: {e}");
                None
            }
        }
    }

    /// Like [`RankEnv::from_env`], but malformed values (a rank that is not a number, a rank without a
    /// size, a rank not below the size) are an error instead of `None`.
    pub fn try_from_env() -> Result<Option<RankEnv>, LaunchError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Rank 0 of 1 on device `HALO_DEVICE` (default 0): what a process started without a launcher is.
    pub fn single() -> RankEnv {
        let device = std::env::var(ENV_DEVICE).ok().and_then(|d| d.trim().parse().ok()).unwrap_or(0);
        RankEnv { rank: 0, nranks: 1, local_rank: 0, device, bootstrap: Bootstrap::None, source: "none" }
    }

    /// [`RankEnv::from_env`], falling back to [`RankEnv::single`].
    pub fn from_env_or_single() -> RankEnv {
        Self::from_env().unwrap_or_else(Self::single)
    }

    /// Parses the variables as `get` returns them (a seam for tests; [`RankEnv::try_from_env`] passes
    /// the process environment).
    ///
    /// Precedence: `HALO_RANK`/`HALO_NRANKS`/`HALO_LOCAL_RANK` (our launcher, [`Bootstrap::UniqueId`]),
    /// `OMPI_COMM_WORLD_*` (Open MPI, [`Bootstrap::Mpi`]), `MV2_COMM_WORLD_*` (MVAPICH2, [`Bootstrap::Mpi`]),
    /// `PMI_RANK`/`PMI_SIZE` with `MPI_LOCALRANKID` (Hydra, [`Bootstrap::Pmi`]),
    /// `SLURM_PROCID`/`SLURM_NTASKS`/`SLURM_LOCALID` (srun, [`Bootstrap::Pmix`] when `PMIX_RANK` is set
    /// or `SLURM_MPI_TYPE` starts with `pmix`, else [`Bootstrap::Pmi`]). A launcher without a local
    /// rank gets the rank as its local rank.
    ///
    /// The device is `HALO_DEVICE` when set. Otherwise it is the local rank, wrapped modulo the number
    /// of entries in `CUDA_VISIBLE_DEVICES` when that is set, because `srun --gpus-per-task=1` leaves
    /// each task exactly one visible GPU (ordinal 0) whatever its local rank.
    pub fn from_vars<F>(get: F) -> Result<Option<RankEnv>, LaunchError>
    where
        F: Fn(&str) -> Option<String>,
    {
        let Some((flavour, rank_text)) = FLAVOURS.iter().find_map(|f| get(f.rank).map(|r| (f, r))) else {
            return Ok(None);
        };
        let rank = parse_index(flavour.rank, &rank_text)?;
        let size_text = get(flavour.size).ok_or(LaunchError::BadRankEnv {
            variable: flavour.size,
            value: String::new(),
            reason: format!("{} is set but {} is not", flavour.rank, flavour.size),
        })?;
        let nranks = parse_index(flavour.size, &size_text)?;
        if nranks == 0 || rank >= nranks {
            return Err(LaunchError::BadRankEnv {
                variable: flavour.rank,
                value: rank_text,
                reason: format!("the rank must be below {}={nranks}", flavour.size),
            });
        }
        let local_rank = match flavour.local_rank.and_then(|name| get(name).map(|v| (name, v))) {
            Some((name, text)) => parse_index(name, &text)?,
            None => rank,
        };
        let device = match get(ENV_DEVICE) {
            Some(text) => parse_index(ENV_DEVICE, &text)?,
            None => match get("CUDA_VISIBLE_DEVICES").map(|v| visible_device_count(&v)) {
                Some(n) if n > 0 => local_rank % n,
                _ => local_rank,
            },
        };
        let bootstrap = if flavour.source == "Slurm" { slurm_bootstrap(&get) } else { flavour.bootstrap };
        Ok(Some(RankEnv { rank, nranks, local_rank, device, bootstrap, source: flavour.source }))
    }
}

/// srun starts tasks through its `--mpi` plugin; only the PMIx one exports `PMIX_RANK`.
fn slurm_bootstrap<F: Fn(&str) -> Option<String>>(get: &F) -> Bootstrap {
    let pmix_type = get("SLURM_MPI_TYPE").is_some_and(|t| t.trim().to_ascii_lowercase().starts_with("pmix"));
    if pmix_type || get("PMIX_RANK").is_some() { Bootstrap::Pmix } else { Bootstrap::Pmi }
}

/// Entries of a `CUDA_VISIBLE_DEVICES` list (indices, UUIDs or MIG names, comma separated).
fn visible_device_count(list: &str) -> usize {
    list.split(',').filter(|e| !e.trim().is_empty()).count()
}

fn parse_index(variable: &'static str, text: &str) -> Result<usize, LaunchError> {
    text.trim().parse::<usize>().map_err(|e| LaunchError::BadRankEnv {
        variable,
        value: text.to_owned(),
        reason: format!("not a non-negative integer ({e})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<Option<RankEnv>, LaunchError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        RankEnv::from_vars(|k| map.get(k).cloned())
    }

    fn ok(vars: &[(&str, &str)]) -> RankEnv {
        match parse(vars) {
            Ok(Some(env)) => env,
            other => panic!("expected a rank environment from {vars:?}, got {other:?}"),
        }
    }

    #[test]
    fn pes_per_gpu_defaults_to_one() {
        assert_eq!(parse_pes_per_gpu(None), 1);
        assert_eq!(parse_pes_per_gpu(Some("4")), 4);
        assert_eq!(parse_pes_per_gpu(Some("0")), 1);
        assert_eq!(parse_pes_per_gpu(Some("two")), 1);
    }

    #[test]
    fn nothing_set_is_none() {
        assert!(matches!(parse(&[("PATH", "/bin")]), Ok(None)));
    }

    #[test]
    fn halo_launch_variables() {
        let env = ok(&[("HALO_RANK", "2"), ("HALO_NRANKS", "4"), ("HALO_LOCAL_RANK", "2"), ("HALO_DEVICE", "1")]);
        assert_eq!((env.rank, env.nranks, env.local_rank, env.device), (2, 4, 2, 1));
        assert_eq!(env.bootstrap, Bootstrap::UniqueId);
        assert_eq!(env.source, "halo launch");
    }

    #[test]
    fn halo_launch_wins_over_inherited_slurm_and_mpi() {
        let env = ok(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "1"),
            ("HALO_RANK", "1"),
            ("HALO_NRANKS", "2"),
        ]);
        assert_eq!((env.rank, env.nranks, env.local_rank, env.device), (1, 2, 1, 1));
        assert_eq!(env.bootstrap, Bootstrap::UniqueId);
    }

    #[test]
    fn open_mpi() {
        let env = ok(&[
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            // mpirun inside an allocation: Slurm's variables describe the batch step, not this rank.
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ]);
        assert_eq!((env.rank, env.nranks, env.local_rank, env.device), (5, 8, 1, 1));
        assert_eq!(env.bootstrap, Bootstrap::Mpi);
        assert_eq!(env.source, "Open MPI");
    }

    #[test]
    fn mvapich2() {
        let env = ok(&[("MV2_COMM_WORLD_RANK", "3"), ("MV2_COMM_WORLD_SIZE", "4"), ("MV2_COMM_WORLD_LOCAL_RANK", "3")]);
        assert_eq!((env.rank, env.nranks, env.local_rank, env.device), (3, 4, 3, 3));
        assert_eq!(env.bootstrap, Bootstrap::Mpi);
    }

    #[test]
    fn hydra_pmi_with_and_without_local_rank() {
        let env = ok(&[("PMI_RANK", "6"), ("PMI_SIZE", "8"), ("MPI_LOCALRANKID", "2")]);
        assert_eq!((env.rank, env.nranks, env.local_rank, env.device), (6, 8, 2, 2));
        assert_eq!(env.bootstrap, Bootstrap::Pmi);
        let env = ok(&[("PMI_RANK", "1"), ("PMI_SIZE", "2")]);
        assert_eq!((env.local_rank, env.device), (1, 1));
    }

    #[test]
    fn slurm_pmi_and_pmix() {
        let env = ok(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "1")]);
        assert_eq!((env.rank, env.nranks, env.local_rank, env.device), (5, 8, 1, 1));
        assert_eq!(env.bootstrap, Bootstrap::Pmi);
        assert_eq!(env.source, "Slurm");
        let env = ok(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "1"), ("PMIX_RANK", "5")]);
        assert_eq!(env.bootstrap, Bootstrap::Pmix);
        let env = ok(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_MPI_TYPE", "pmix_v4")]);
        assert_eq!(env.bootstrap, Bootstrap::Pmix);
    }

    #[test]
    fn one_visible_gpu_per_task_means_device_zero() {
        let env = ok(&[("SLURM_PROCID", "7"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "3"), ("CUDA_VISIBLE_DEVICES", "3")]);
        assert_eq!((env.local_rank, env.device), (3, 0));
        let env = ok(&[("SLURM_PROCID", "7"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "3"), ("CUDA_VISIBLE_DEVICES", "0,1,2,3")]);
        assert_eq!(env.device, 3);
        // HALO_DEVICE overrides under any launcher.
        let env = ok(&[("SLURM_PROCID", "7"), ("SLURM_NTASKS", "8"), ("HALO_DEVICE", "2")]);
        assert_eq!(env.device, 2);
    }

    #[test]
    fn malformed_values_are_errors() {
        let err = parse(&[("HALO_RANK", "one"), ("HALO_NRANKS", "2")]).unwrap_err();
        assert!(err.to_string().contains("HALO_RANK"), "{err}");
        let err = parse(&[("HALO_RANK", "0")]).unwrap_err();
        assert!(err.to_string().contains("HALO_NRANKS"), "{err}");
        let err = parse(&[("PMI_RANK", "2"), ("PMI_SIZE", "2")]).unwrap_err();
        assert!(err.to_string().contains("below PMI_SIZE=2"), "{err}");
        let err = parse(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "0")]).unwrap_err();
        assert!(err.to_string().contains("SLURM_PROCID"), "{err}");
        assert!(parse(&[("HALO_RANK", "0"), ("HALO_NRANKS", "1"), ("HALO_DEVICE", "-1")]).is_err());
    }
}
