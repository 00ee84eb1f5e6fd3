//! Why routed paths cannot be used by the halo exchange ([`PathError`]).

use super::{RouteError, Transport};

/// Why routed paths cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The router failed to decide.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// The router chose something the exchange cannot do.
    #[error("PE {self_pe} -> PE {peer}: the router chose {transport}, which the halo exchange cannot use: {why}")]
    Unsupported {
        /// Deciding PE.
        self_pe: usize,
        /// Peer.
        peer: usize,
        /// Chosen transport.
        transport: Transport,
        /// Why not.
        why: String,
    },
    /// The two ends of a pair chose differently.
    #[error("the two ends of a pair disagree: {0}")]
    Asymmetric(String),
    /// No PE's plan was given.
    #[error("no routed plans to combine")]
    Empty,
}
