//! The router's vocabulary, below the layers that use it: distances ([`level`]), transports,
//! operations and their performance model ([`transport`]), and the errors routing raises
//! ([`error`], [`path_error`]). The router (`halo::route`) is built on these and re-exports
//! them at their old paths (`halo::route::Transport`, `halo::route::PathError`, ...); the error
//! type ([`crate::error`]) takes [`PathError`] from here.

pub mod error;
pub mod level;
pub mod path_error;
pub mod transport;

pub use error::RouteError;
pub use level::{DistanceLevel, LEVELS};
pub use path_error::PathError;
pub use transport::{CalibrationEntry, CalibrationFile, Caps, Op, PerfPoint, PerfSource, PerfTable, Transport, TransportSet};
