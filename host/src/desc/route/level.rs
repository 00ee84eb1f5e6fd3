//! Distance levels between two PEs, nearest first.

use super::RouteError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How many distance levels there are (the length of [`DistanceLevel::ALL`]).
pub const LEVELS: usize = 8;

/// How far apart two PEs are. The order is the order of the variants: nearer levels compare less.
///
/// Levels are cumulative: a PE within [`DistanceLevel::NvLink`] is also within every level above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum DistanceLevel {
    /// Both PEs run on the same GPU (or it is the PE itself).
    SameGpu = 0,
    /// Different GPUs joined by NVLink.
    #[serde(rename = "nvlink")]
    NvLink = 1,
    /// Same node, no NVLink, but peer-to-peer access over PCIe works.
    Pcie = 2,
    /// Same node without peer-to-peer access: data has to pass through host memory or the NIC.
    SameNodeNoP2p = 3,
    /// Different nodes in the same rack.
    Rack = 4,
    /// Different racks under the same leaf switch.
    Leaf = 5,
    /// Different leaf switches of the same cluster: traffic crosses the spine tier (one spine
    /// switch, or spine and core switches in a three-tier fat-tree).
    Spine = 6,
    /// Different clusters, or nothing is known about the pair.
    CrossCluster = 7,
}

impl DistanceLevel {
    /// Every level, nearest first.
    pub const ALL: [DistanceLevel; LEVELS] = [
        DistanceLevel::SameGpu,
        DistanceLevel::NvLink,
        DistanceLevel::Pcie,
        DistanceLevel::SameNodeNoP2p,
        DistanceLevel::Rack,
        DistanceLevel::Leaf,
        DistanceLevel::Spine,
        DistanceLevel::CrossCluster,
    ];

    /// Position in [`DistanceLevel::ALL`] (0 = nearest); also the bitmap index.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The level at `index` in [`DistanceLevel::ALL`], if there is one.
    pub fn from_index(index: usize) -> Option<Self> {
        Self::ALL.get(index).copied()
    }

    /// The name used in logs, tables, files and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            DistanceLevel::SameGpu => "same-gpu",
            DistanceLevel::NvLink => "nvlink",
            DistanceLevel::Pcie => "pcie",
            DistanceLevel::SameNodeNoP2p => "same-node-no-p2p",
            DistanceLevel::Rack => "rack",
            DistanceLevel::Leaf => "leaf",
            DistanceLevel::Spine => "spine",
            DistanceLevel::CrossCluster => "cross-cluster",
        }
    }

    /// True when both PEs sit on one node (shared host memory, possibly peer access).
    pub const fn is_intra_node(self) -> bool {
        (self as u8) <= (DistanceLevel::SameNodeNoP2p as u8)
    }
}

impl fmt::Display for DistanceLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DistanceLevel {
    type Err = RouteError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|l| l.name() == s).ok_or_else(|| RouteError::Parse {
            what: "distance level",
            value: s.to_owned(),
            reason: format!("expected one of {}", Self::ALL.map(|l| l.name()).join(", ")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_nearest_first_and_round_trips() {
        for w in DistanceLevel::ALL.windows(2) {
            assert!(w[0] < w[1]);
        }
        for (i, l) in DistanceLevel::ALL.into_iter().enumerate() {
            assert_eq!(l.index(), i);
            assert_eq!(DistanceLevel::from_index(i), Some(l));
            assert_eq!(l.name().parse::<DistanceLevel>().ok(), Some(l));
        }
        assert!(DistanceLevel::SameNodeNoP2p.is_intra_node());
        assert!(!DistanceLevel::Rack.is_intra_node());
        assert!("far".parse::<DistanceLevel>().is_err());
    }
}
