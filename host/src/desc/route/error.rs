//! The router's error type. Every variant names what was wrong and, where there is one, the fix.

use super::{DistanceLevel, Op, Transport};
use std::path::PathBuf;

/// Errors from building topologies, loading route configuration and choosing routes.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// A value (size, level, transport, number) could not be parsed.
    #[error("invalid {what} {value:?}: {reason}")]
    Parse {
        /// What kind of value it was.
        what: &'static str,
        /// The text as given.
        value: String,
        /// Why it was rejected, with the accepted forms.
        reason: String,
    },
    /// An environment variable holds a value the router cannot use.
    #[error("environment variable {var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A PE index outside the topology.
    #[error("PE {pe} is outside the topology of {n_pes} PEs")]
    PeOutOfRange {
        /// The index given.
        pe: usize,
        /// How many PEs the topology has.
        n_pes: usize,
    },
    /// A route setting is out of range or inconsistent with another one.
    #[error("{setting} ({what}): {problem}; {fix}")]
    Config {
        /// Where the value came from and what it is: `HALO_ROUTE_HALF_LIFE_S=1e300`, or
        /// `` `[reliability] half_life_s = 1e300` in route.toml ``.
        setting: String,
        /// What the setting means.
        what: &'static str,
        /// What is wrong with it.
        problem: String,
        /// What to set instead, naming the variable and the config-file key.
        fix: String,
    },
    /// The PEs' failure records cannot be agreed on (see the router's `feedback` module).
    #[error("failure agreement: {0}")]
    Agreement(String),
    /// The topology or the facts it is built from are inconsistent.
    #[error("invalid topology: {0}")]
    InvalidTopology(String),
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Io {
        /// What the file was for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file was read but its contents are wrong.
    #[error("{what} {path}: {reason}")]
    BadFile {
        /// What the file was for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong, with the position where the parser knows it.
        reason: String,
    },
    /// Slurm's topology environment is present but cannot be read.
    #[error("Slurm topology: {0}")]
    Slurm(String),
    /// No transport can carry this operation to this peer.
    #[error("no transport can carry {op} from PE {self_pe} to PE {peer} at distance {level}: {reasons}")]
    NoRoute {
        /// The calling PE.
        self_pe: usize,
        /// The destination PE.
        peer: usize,
        /// The operation.
        op: Op,
        /// Their distance.
        level: DistanceLevel,
        /// Why each transport was excluded.
        reasons: String,
    },
    /// A transport forced by the user cannot serve this pair.
    #[error(
        "{transport} is forced by {by} for PE {self_pe} -> PE {peer} ({op}), but it cannot be used there: {reason}. \
         Force it only for the pairs it can serve (--route-override a-b=name) or remove the override"
    )]
    ForcedUnusable {
        /// The forced transport.
        transport: Transport,
        /// Which override forced it (variable or flag).
        by: String,
        /// The calling PE.
        self_pe: usize,
        /// The destination PE.
        peer: usize,
        /// The operation.
        op: Op,
        /// Why it cannot serve the pair.
        reason: String,
    },
}
