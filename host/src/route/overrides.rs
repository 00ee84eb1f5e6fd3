//! User overrides of the router's choice: one transport for everything, or one per PE pair.
//!
//! NVSHMEM only offers global switches (disable P2P, pick the one remote transport); users ask
//! for NVLink on some pairs and the NIC on others. `--route-override 0-1=nvshmem-put` (or
//! `HALO_ROUTE_OVERRIDE=0-1=nvshmem-put,2-3=staged`) forces a transport for both directions of
//! one pair; `HALO_FORCE_TRANSPORT=name` forces it for every pair. A per-pair override beats the
//! global one.

use super::config::{Sourced, WeightSource};
use super::{RouteError, Transport};
use std::fmt;

/// A transport forced for one unordered pair of PEs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PairOverride {
    /// One PE of the pair.
    pub a: usize,
    /// The other PE.
    pub b: usize,
    /// The transport to use between them, in both directions.
    pub transport: Transport,
}

impl PairOverride {
    /// Whether this override covers traffic between `x` and `y` (either direction).
    pub fn matches(&self, x: usize, y: usize) -> bool {
        (self.a == x && self.b == y) || (self.a == y && self.b == x)
    }
}

impl fmt::Display for PairOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}={}", self.a, self.b, self.transport)
    }
}

/// Parses one override, `A-B=transport` (e.g. `0-1=nvshmem-put`).
pub fn parse_route_override(spec: &str) -> Result<PairOverride, RouteError> {
    let bad = |reason: String| RouteError::Parse {
        what: "route override",
        value: spec.to_owned(),
        reason: format!("{reason}; write PE-PE=transport, e.g. 0-1=nvshmem-put"),
    };
    let (pair, name) = spec.trim().split_once('=').ok_or_else(|| bad("no '='".into()))?;
    let (a, b) = pair.split_once('-').ok_or_else(|| bad("no '-' between the two PEs".into()))?;
    let pe = |s: &str| s.trim().parse::<usize>().map_err(|_| bad(format!("{s:?} is not a PE number")));
    let transport = name.parse::<Transport>().map_err(|e| bad(e.to_string()))?;
    Ok(PairOverride { a: pe(a)?, b: pe(b)?, transport })
}

/// Parses a comma-separated list of overrides (the form of `HALO_ROUTE_OVERRIDE`); empty items are skipped.
pub fn parse_route_overrides(list: &str) -> Result<Vec<PairOverride>, RouteError> {
    list.split(',').filter(|s| !s.trim().is_empty()).map(parse_route_override).collect()
}

/// The overrides in force, each with where it came from.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// Transport forced for every pair (`HALO_FORCE_TRANSPORT`).
    pub global: Option<Sourced<Transport>>,
    /// Per-pair overrides; for the same pair the last one wins (command line after environment after file).
    pub pairs: Vec<Sourced<PairOverride>>,
}

impl Overrides {
    /// The transport forced between `x` and `y`, if any, and what forced it.
    pub fn forced(&self, x: usize, y: usize) -> Option<(Transport, &WeightSource)> {
        self.pairs
            .iter()
            .rev()
            .find(|o| o.value.matches(x, y))
            .map(|o| (o.value.transport, &o.source))
            .or_else(|| self.global.as_ref().map(|g| (g.value, &g.source)))
    }

    /// Whether nothing is forced.
    pub fn is_empty(&self) -> bool {
        self.global.is_none() && self.pairs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let o = parse_route_override("0-1=nvshmem-put").expect("valid");
        assert_eq!(o, PairOverride { a: 0, b: 1, transport: Transport::NvshmemPut });
        assert!(o.matches(1, 0) && !o.matches(0, 2));
        assert_eq!(o.to_string(), "0-1=nvshmem-put");
        for bad in ["0-1", "0=staged", "x-1=staged", "0-1=tcp", ""] {
            assert!(parse_route_override(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_route_overrides("0-1=staged, 2-3=nccl,").map(|v| v.len()).ok(), Some(2));
    }
}
