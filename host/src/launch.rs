//! What a rank of a multi-process run needs at run time: its place in the job ([`RankEnv`], from
//! `halo launch`, mpirun or srun) and the side channel ranks of one `halo launch` share
//! ([`rendezvous`]: NVSHMEM's unique id, small all-gathers). Starting and supervising the
//! processes is the `halo launch` command's job (crate `halo-cli`).

pub mod env;
pub mod pmi;
pub mod rendezvous;
pub mod ucx;

pub use env::{Bootstrap, RankEnv};
pub use rendezvous::{Rendezvous, RendezvousDir};

use std::path::PathBuf;
use std::time::Duration;

/// Errors of the launcher, the rank environment and the rendezvous.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The launch configuration makes no sense (zero ranks, no command, ...).
    #[error("invalid launch: {0}")]
    InvalidConfig(String),
    /// The path of the running executable could not be determined.
    #[error("cannot find the halo executable to start the ranks with: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// A rank's process could not be started.
    #[error("could not start rank {rank} ({program}): {source}")]
    Spawn {
        /// The rank.
        rank: usize,
        /// The program that was to run.
        program: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Watching a rank's process failed.
    #[error("could not wait for rank {rank}: {source}")]
    Wait {
        /// The rank.
        rank: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A thread forwarding a rank's output could not be started.
    #[error("could not start the output thread of rank {rank}: {source}")]
    Output {
        /// The rank.
        rank: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The launcher could not install its SIGINT/SIGTERM handlers.
    #[error("could not install the launcher's signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    /// A launcher variable of the rank environment is malformed.
    #[error("bad {variable}={value:?}: {reason}")]
    BadRankEnv {
        /// The variable.
        variable: &'static str,
        /// Its value (empty when missing).
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The process was not started by `halo launch`, so there is no rendezvous directory.
    #[error(
        "HALO_RENDEZVOUS_DIR is not set: the rendezvous only exists under `halo launch`; \
         under mpirun/srun NVSHMEM bootstraps through MPI/PMI instead"
    )]
    NoRendezvous,
    /// A rank other than 0 tried to publish the unique id.
    #[error("only rank 0 publishes the unique id, but this is rank {rank}")]
    NotRankZero {
        /// The rank that tried.
        rank: usize,
    },
    /// A rendezvous file was already written in this run.
    #[error("{} already exists: each rendezvous name is written once per run", .0.display())]
    AlreadyPublished(PathBuf),
    /// An all-gather tag that is not a plain file name.
    #[error("invalid all-gather tag {0:?}: use ASCII letters, digits, '-' and '_'")]
    BadTag(String),
    /// Some ranks did not contribute in time.
    #[error(
        "timed out after {:.1} s waiting for {what} from {} (in {}): did that rank fail to start or die?",
        .timeout.as_secs_f64(), rank_list(.missing), .dir.display()
    )]
    RendezvousTimeout {
        /// What was awaited.
        what: String,
        /// The ranks that did not deliver.
        missing: Vec<usize>,
        /// How long we waited.
        timeout: Duration,
        /// The rendezvous directory.
        dir: PathBuf,
    },
    /// The PMI-1 conversation with the launcher failed.
    #[error("PMI: {0}")]
    Pmi(String),
    /// Reading or writing the rendezvous directory failed.
    #[error("{what} {}: {source}", .path.display())]
    RendezvousIo {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// "rank 3" or "ranks 0, 2".
pub fn rank_list(ranks: &[usize]) -> String {
    let list: Vec<String> = ranks.iter().map(ToString::to_string).collect();
    format!("{} {}", if ranks.len() == 1 { "rank" } else { "ranks" }, list.join(", "))
}
