//! Topology-aware transport router: which transport serves peer `j`, for this operation and size.
//!
//! The pieces, in the order data flows through them:
//!
//! | module | what it does |
//! |---|---|
//! | [`level`] | [`DistanceLevel`]: same GPU < NVLink < PCIe < same node without P2P < rack < leaf < spine < cross-cluster |
//! | [`bitmap`] | [`Topology`]: one [`PeBitmap`] per PE and level; distance = first level both PEs agree on; epoch and hash |
//! | [`discover`] | [`PeFacts`] gathered across PEs + a [`Fabric`] (TOML file or Slurm) → [`Topology`] |
//! | [`slurm`] | Slurm's `topology.conf` / `scontrol show topology` (tree and block plugins) → [`Fabric`] |
//! | [`transport`] | [`Transport`], [`Caps`], reach per level, [`PerfTable`] (defaults or a calibration file) |
//! | [`config`] | [`RouteConfig`]: weights, thresholds, overrides, each with its [`WeightSource`] |
//! | [`score`] | the scoring pass over all candidates for one (level, op, size) |
//! | [`reliability`] | failures and timeouts per (peer, transport), decaying with a half-life |
//! | [`overrides`] | `HALO_FORCE_TRANSPORT` and per-pair `--route-override a-b=name` |
//! | [`gpu_facts`] | this PE's [`PeFacts`] from the CUDA driver (and NVML), gathered across PEs |
//! | [`paths`] | [`RoutedPaths`]: the halo exchange's per-peer path from the router, pulse by pulse; [`RoutedSummary`] |
//! | [`feedback`] | failures recorded by drivers, agreed across PEs at safe points so both ends switch together; `HALO_INJECT_FAILURE` |
//! | [`calibrate`] | `halo calibrate`'s model: measurements → calibration file |
//! | [`router`] | [`Router`]: per-peer cache, failover, `HALO_ROUTE_DEBUG` blocks, the finalize summary |
//!
//! A caller asks `router.route(peer, Op::Put, bytes)?` and gets a [`Route`] back; after an attempt
//! fails it calls `router.record(peer, transport, Outcome::Failure)` and asks again. A caller that
//! implements only some transports asks `router.route_among(peer, op, bytes, allowed)` so that
//! the others are never chosen (the halo exchange passes [`EXCHANGE_TRANSPORTS`]).
//! `docs/routing.md` explains the model.

pub mod bitmap;
pub mod calibrate;
pub mod config;
pub mod discover;
pub mod feedback;
pub mod gpu_facts;
pub use crate::desc::route::level;
mod log;
pub mod overrides;
pub mod paths;
pub mod reliability;
pub mod router;
pub mod score;
pub mod size;
pub mod slurm;
pub use crate::desc::route::transport;

pub use crate::desc::route::RouteError;
pub use bitmap::{ClaimSet, DistanceInfo, NO_GROUP, PeBitmap, PeCoord, Topology};
pub use config::{EffectiveWeights, LIMITS, Limit, Limits, RouteConfig, Sourced, WeightSource, Weights};
pub use discover::{
    Fabric, IntraNodeLink, NvlinkDomain, PeFacts, Placement, TopologyFile, load_fabric, single_node, synthetic_facts, topology_from_facts,
    topology_from_file,
};
pub use feedback::{
    Agreement, AgreementChange, AllGather, FailureInjection, FailureReport, Feedback, PairRecord, SafePoint, SafePointRecord, agree, agree_local,
    agree_through_bootstrap, agree_via, safe_point_local, safe_point_through_bootstrap, safe_point_via,
};
pub use level::{DistanceLevel, LEVELS};
pub use overrides::{Overrides, PairOverride, parse_route_override, parse_route_overrides};
pub use paths::{
    EXCHANGE_TRANSPORTS, LOCAL_EXCHANGE_TRANSPORTS, LocalPlan, PathError, PeerRoute, PulseChoice, PulsePath, RouteSource, RoutedPaths, RoutedSummary,
    TopologyStamp, local_routers, plan_local_ranks, plan_local_with,
};
pub use reliability::{Clock, Count, Decay, ManualClock, Outcome, Reliability, SystemClock};
pub use router::{Decision, Route, RouteReason, RouteSummary, Router};
pub use score::{Candidate, Exclusion, Factors, ReliabilityState, Scoring, score_candidates, score_candidates_among};
pub use size::{class_bytes, format_size, parse_size, size_class};
pub use slurm::parse_slurm_topology;
pub use transport::{CalibrationEntry, CalibrationFile, Caps, Op, PerfPoint, PerfSource, PerfTable, Transport, TransportSet};
