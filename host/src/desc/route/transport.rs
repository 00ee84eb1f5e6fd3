//! Transports, what they can do, how far they reach, and how fast they are per level.
//!
//! Reach (a transport outside its reach is excluded with a reason):
//!
//! | transport | reaches | why |
//! |---|---|---|
//! | `nvlink-store` | same GPU, NVLink, PCIe with P2P | SM stores need the peer's memory mapped: CUDA peer access |
//! | `nvlink-tma` | same GPU, NVLink, PCIe with P2P | bulk copies to mapped peer memory, same requirement |
//! | `nvshmem-put` | every level | NVSHMEM picks P2P inside a node and its proxy/IBGDA transport outside |
//! | `staged` | one node (up to same node without P2P) | the host copies through its own memory; no network |
//! | `nccl` | every level | NCCL send/recv, launched from the host |
//!
//! The performance numbers built in are defaults, not measurements: they are order-of-magnitude
//! figures for H200 + NVLink 4 + 400 Gb/s InfiniBand and are marked `default` in every log until a
//! calibration file written by `halo calibrate` replaces them.

use super::{DistanceLevel, LEVELS, RouteError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// How many transports there are (the length of [`Transport::ALL`]).
pub const TRANSPORTS: usize = 5;

/// A way to move halo data to a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// The kernel's threads store into the peer's memory (NVLink or PCIe peer mapping).
    NvlinkStore,
    /// The kernel issues bulk (TMA) copies into the peer's mapped memory.
    NvlinkTma,
    /// NVSHMEM put from the kernel: P2P inside a node, proxy or IBGDA across the network.
    NvshmemPut,
    /// The host copies between GPUs (through host memory when there is no peer access).
    Staged,
    /// NCCL send/recv launched from the host.
    Nccl,
}

impl Transport {
    /// Every transport; ties in score go to the earlier one.
    pub const ALL: [Transport; TRANSPORTS] =
        [Transport::NvlinkStore, Transport::NvlinkTma, Transport::NvshmemPut, Transport::Staged, Transport::Nccl];

    /// Position in [`Transport::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The name used in logs, overrides and files.
    pub const fn name(self) -> &'static str {
        match self {
            Transport::NvlinkStore => "nvlink-store",
            Transport::NvlinkTma => "nvlink-tma",
            Transport::NvshmemPut => "nvshmem-put",
            Transport::Staged => "staged",
            Transport::Nccl => "nccl",
        }
    }

    /// What this transport can do.
    pub const fn caps(self) -> Caps {
        match self {
            Transport::NvlinkStore => Caps(Caps::LOAD_STORE.0 | Caps::PUT.0 | Caps::PUT_SIGNAL.0 | Caps::ATOMICS.0 | Caps::GET.0),
            // Bulk copies have no atomic form; the signal is a store after the copy completes.
            Transport::NvlinkTma => Caps(Caps::PUT.0 | Caps::PUT_SIGNAL.0 | Caps::GET.0),
            Transport::NvshmemPut => Caps(Caps::PUT.0 | Caps::PUT_SIGNAL.0 | Caps::ATOMICS.0 | Caps::GET.0),
            // The host can copy and then write a flag, and read back; it has no remote atomics.
            Transport::Staged => Caps(Caps::HOST_COPY.0 | Caps::PUT.0 | Caps::PUT_SIGNAL.0 | Caps::GET.0),
            // Send/recv completes as a pair, which serves as the signal; there is no one-sided get.
            Transport::Nccl => Caps(Caps::HOST_COPY.0 | Caps::PUT.0 | Caps::PUT_SIGNAL.0),
        }
    }

    /// The farthest level this transport reaches.
    pub const fn max_level(self) -> DistanceLevel {
        match self {
            Transport::NvlinkStore | Transport::NvlinkTma => DistanceLevel::Pcie,
            Transport::Staged => DistanceLevel::SameNodeNoP2p,
            Transport::NvshmemPut | Transport::Nccl => DistanceLevel::CrossCluster,
        }
    }

    /// Whether this transport reaches a peer at `level`.
    pub fn reaches(self, level: DistanceLevel) -> bool {
        level <= self.max_level()
    }

    /// How well the transport fits a level, 0..1, before normalisation (the topology factor):
    /// 1 for the path it was built for, less where it works but through a detour or extra layer.
    pub fn affinity(self, level: DistanceLevel) -> f64 {
        use DistanceLevel as L;
        match (self, level) {
            (Transport::NvlinkStore | Transport::NvlinkTma, L::SameGpu | L::NvLink) => 1.0,
            // PCIe peer mappings work but each store is a posted PCIe write.
            (Transport::NvlinkStore | Transport::NvlinkTma, _) => 0.6,
            (Transport::NvshmemPut, l) if l.is_intra_node() => 0.8,
            (Transport::NvshmemPut, _) => 1.0,
            (Transport::Staged, L::SameNodeNoP2p) => 0.8,
            (Transport::Staged, _) => 0.5,
            (Transport::Nccl, l) if l.is_intra_node() => 0.6,
            (Transport::Nccl, _) => 0.8,
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of transports: the candidates a caller can actually use (see
/// the router's `Router::route_among`). A one-byte bit set, so it is a cheap cache key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransportSet(u8);

impl TransportSet {
    /// Every transport (what the router's `Router::route` scores).
    pub const ALL: TransportSet = TransportSet((1 << TRANSPORTS) - 1);
    /// No transport.
    pub const EMPTY: TransportSet = TransportSet(0);

    /// The set of the given transports.
    pub const fn of(transports: &[Transport]) -> TransportSet {
        let mut bits = 0u8;
        let mut i = 0;
        // A `while` loop because `for` is not allowed in a `const fn`.
        while i < transports.len() {
            bits |= 1 << transports[i].index();
            i += 1;
        }
        TransportSet(bits)
    }

    /// This set plus `t`.
    pub const fn with(self, t: Transport) -> TransportSet {
        TransportSet(self.0 | 1 << t.index())
    }

    /// Whether `t` is in the set.
    pub const fn contains(self, t: Transport) -> bool {
        self.0 & (1 << t.index()) != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The members, in [`Transport::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Transport> {
        Transport::ALL.into_iter().filter(move |&t| self.contains(t))
    }
}

impl Default for TransportSet {
    fn default() -> Self {
        Self::ALL
    }
}

impl fmt::Display for TransportSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let names: Vec<&str> = self.iter().map(Transport::name).collect();
        f.write_str(&names.join(", "))
    }
}

impl fmt::Debug for TransportSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TransportSet({self})")
    }
}

/// Written as the list of its transports' names, as in files and logs.
impl Serialize for TransportSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for TransportSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let list = Vec::<Transport>::deserialize(d)?;
        Ok(list.into_iter().fold(TransportSet::EMPTY, TransportSet::with))
    }
}

impl FromStr for TransportSet {
    type Err = RouteError;

    /// A comma-separated list of transport names, or `all`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("all") {
            return Ok(Self::ALL);
        }
        let mut set = Self::EMPTY;
        for name in s.split(',').filter(|n| !n.trim().is_empty()) {
            set = set.with(name.parse()?);
        }
        if set.is_empty() {
            return Err(RouteError::Parse {
                what: "transport set",
                value: s.to_owned(),
                reason: "expected `all` or a comma-separated list of transports".into(),
            });
        }
        Ok(set)
    }
}

impl FromStr for Transport {
    type Err = RouteError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        Self::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(s) || t.name().replace('-', "_").eq_ignore_ascii_case(s)).ok_or_else(|| {
            RouteError::Parse {
                what: "transport",
                value: s.to_owned(),
                reason: format!("expected one of {}", Self::ALL.map(|t| t.name()).join(", ")),
            }
        })
    }
}

/// Capability flags (a small bit set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Caps(u8);

impl Caps {
    /// No capabilities.
    pub const NONE: Caps = Caps(0);
    /// The GPU loads and stores the peer's memory directly.
    pub const LOAD_STORE: Caps = Caps(1);
    /// One-sided put initiated by the GPU or the host.
    pub const PUT: Caps = Caps(1 << 1);
    /// Put followed by a signal the receiver can wait on, ordered after the data.
    pub const PUT_SIGNAL: Caps = Caps(1 << 2);
    /// Remote atomics.
    pub const ATOMICS: Caps = Caps(1 << 3);
    /// One-sided get.
    pub const GET: Caps = Caps(1 << 4);
    /// The host drives the copy (the kernel cannot start it itself).
    pub const HOST_COPY: Caps = Caps(1 << 5);

    const NAMES: [(Caps, &'static str); 6] = [
        (Caps::LOAD_STORE, "load-store"),
        (Caps::PUT, "put"),
        (Caps::PUT_SIGNAL, "put-signal"),
        (Caps::ATOMICS, "atomics"),
        (Caps::GET, "get"),
        (Caps::HOST_COPY, "host-copy"),
    ];

    /// Whether every flag of `other` is set here.
    pub const fn contains(self, other: Caps) -> bool {
        self.0 & other.0 == other.0
    }

    /// The flags of both.
    pub const fn union(self, other: Caps) -> Caps {
        Caps(self.0 | other.0)
    }

    /// The flags of `self` that `other` lacks.
    pub const fn minus(self, other: Caps) -> Caps {
        Caps(self.0 & !other.0)
    }

    /// The raw bits.
    pub const fn bits(self) -> u8 {
        self.0
    }
}

impl fmt::Display for Caps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<_> = Self::NAMES.iter().filter(|(c, _)| self.contains(*c)).map(|(_, n)| *n).collect();
        if names.is_empty() { f.write_str("none") } else { f.write_str(&names.join("+")) }
    }
}

/// A communication operation, as the router is asked about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Write data into the peer's buffer.
    Put,
    /// Write data and signal the peer once it has landed (the halo exchange's usual operation).
    Signal,
    /// Remote atomic (counter increment, flag exchange).
    Amo,
    /// Read from the peer's buffer.
    Get,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 4] = [Op::Put, Op::Signal, Op::Amo, Op::Get];

    /// The capability a transport needs for this operation.
    pub const fn required(self) -> Caps {
        match self {
            Op::Put => Caps::PUT,
            Op::Signal => Caps::PUT_SIGNAL,
            Op::Amo => Caps::ATOMICS,
            Op::Get => Caps::GET,
        }
    }

    /// Position in [`Op::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The name used on the command line and in logs (`put`, `signal`, `amo`, `get`).
    pub const fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Signal => "signal",
            Op::Amo => "amo",
            Op::Get => "get",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Op {
    type Err = RouteError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|o| o.name().eq_ignore_ascii_case(s.trim())).ok_or_else(|| RouteError::Parse {
            what: "operation",
            value: s.to_owned(),
            reason: "expected put, signal, amo or get".into(),
        })
    }
}

/// Where a performance number came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PerfSource {
    /// Built in; not measured on this machine.
    Default,
    /// Measured by `halo calibrate` and loaded from this file.
    Calibrated(PathBuf),
}

impl fmt::Display for PerfSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PerfSource::Default => f.write_str("default, not measured"),
            PerfSource::Calibrated(p) => write!(f, "calibrated: {}", p.display()),
        }
    }
}

/// Latency and bandwidth of one transport at one level, from one message size up.
#[derive(Clone, Debug, PartialEq)]
pub struct PerfPoint {
    /// Smallest message size this point applies to (bytes).
    pub min_bytes: u64,
    /// One-way latency of a small message, microseconds.
    pub latency_us: f64,
    /// Sustained bandwidth, GB/s (10^9 bytes per second).
    pub bandwidth_gbs: f64,
    /// Where the numbers came from.
    pub source: PerfSource,
}

/// Performance numbers per transport and level, each a list of points by message size.
#[derive(Clone, Debug)]
pub struct PerfTable {
    points: Vec<Vec<PerfPoint>>,
}

/// Default (latency µs, bandwidth GB/s) per level, for levels a transport reaches.
/// Rows follow [`DistanceLevel::ALL`]; unreachable levels are `None`.
const DEFAULTS: [[Option<(f64, f64)>; LEVELS]; TRANSPORTS] = [
    // nvlink-store: lowest latency. Over NVLink the exchange stores low-latency words (twice the
    // bytes, no signal): GPU run 16 timed its coordinate halo at 6.0 µs per step at 45,000 atoms
    // (75 KB) against 8.6 µs with bulk copies, so up to halo sizes its effective rate is set
    // beside nvlink-tma's; from [`WORDS_BANDWIDTH_BOUND_BYTES`] on, half the link's (the words
    // double the bytes once bandwidth decides).
    [Some((0.5, 1500.0)), Some((1.0, 380.0)), Some((2.5, 20.0)), None, None, None, None, None],
    // nvlink-tma: a little more setup, close to link rate for bulk data.
    [Some((0.8, 2000.0)), Some((1.5, 370.0)), Some((3.0, 22.0)), None, None, None, None, None],
    // nvshmem-put: P2P inside a node, proxy/IBGDA over 400 Gb/s InfiniBand outside.
    [
        Some((1.0, 1200.0)),
        Some((1.5, 300.0)),
        Some((3.0, 22.0)),
        Some((6.0, 20.0)),
        Some((4.0, 45.0)),
        Some((4.5, 45.0)),
        Some((5.5, 40.0)),
        Some((20.0, 12.0)),
    ],
    // staged: a host round trip (stream sync) before and after the copy.
    [Some((8.0, 1500.0)), Some((10.0, 350.0)), Some((12.0, 24.0)), Some((20.0, 20.0)), None, None, None, None],
    // nccl: host launch plus protocol handshakes.
    [
        Some((10.0, 1000.0)),
        Some((12.0, 300.0)),
        Some((15.0, 22.0)),
        Some((20.0, 18.0)),
        Some((15.0, 45.0)),
        Some((16.0, 45.0)),
        Some((18.0, 40.0)),
        Some((30.0, 12.0)),
    ],
];

/// Message size from which the stores' low-latency words over NVLink are bandwidth-bound (the
/// largest halo measured, 180,000 atoms on two GPUs, is 190 KB).
pub const WORDS_BANDWIDTH_BOUND_BYTES: u64 = 512 * 1024;

impl PerfTable {
    /// The built-in table (every value's source is [`PerfSource::Default`]).
    pub fn defaults() -> Self {
        let mut points = vec![Vec::new(); TRANSPORTS * LEVELS];
        for t in Transport::ALL {
            for l in DistanceLevel::ALL {
                if let Some((latency_us, bandwidth_gbs)) = DEFAULTS[t.index()][l.index()] {
                    points[t.index() * LEVELS + l.index()].push(PerfPoint { min_bytes: 0, latency_us, bandwidth_gbs, source: PerfSource::Default });
                }
            }
        }
        let mut table = Self { points };
        let words = PerfPoint { min_bytes: WORDS_BANDWIDTH_BOUND_BYTES, latency_us: 1.0, bandwidth_gbs: 190.0, source: PerfSource::Default };
        table.insert(Transport::NvlinkStore, DistanceLevel::NvLink, words);
        table
    }

    /// The point for a transport, level and message size: the entry with the largest
    /// `min_bytes <= bytes` (or the smallest entry when all start above `bytes`).
    pub fn lookup(&self, transport: Transport, level: DistanceLevel, bytes: u64) -> Option<&PerfPoint> {
        let list = &self.points[transport.index() * LEVELS + level.index()];
        list.iter().rev().find(|p| p.min_bytes <= bytes).or_else(|| list.first())
    }

    /// Adds or replaces the point at (`transport`, `level`, `point.min_bytes`).
    pub fn insert(&mut self, transport: Transport, level: DistanceLevel, point: PerfPoint) {
        let list = &mut self.points[transport.index() * LEVELS + level.index()];
        match list.iter().position(|p| p.min_bytes >= point.min_bytes) {
            Some(i) if list[i].min_bytes == point.min_bytes => list[i] = point,
            Some(i) => list.insert(i, point),
            None => list.push(point),
        }
    }

    /// The defaults overlaid with the measurements of a calibration file (see [`CalibrationFile`]).
    ///
    /// A calibrated (transport, level) replaces the default points of that pair entirely, so a
    /// single default entry does not shadow measured sizes; other pairs keep their defaults.
    pub fn load_calibration(path: &Path) -> Result<Self, RouteError> {
        let text = std::fs::read_to_string(path).map_err(|source| RouteError::Io { what: "calibration file", path: path.to_owned(), source })?;
        let file: CalibrationFile = serde_json::from_str(&text).map_err(|e| RouteError::BadFile {
            what: "calibration file",
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        Self::defaults().with_calibration(&file, path)
    }

    /// The table overlaid with a parsed calibration file; `path` is recorded as each value's source.
    pub fn with_calibration(mut self, file: &CalibrationFile, path: &Path) -> Result<Self, RouteError> {
        let bad = |reason: String| RouteError::BadFile { what: "calibration file", path: path.to_owned(), reason };
        if file.format != CALIBRATION_FORMAT {
            return Err(bad(format!("format {:?}, expected {CALIBRATION_FORMAT:?}; rerun `halo calibrate`", file.format)));
        }
        let mut cleared = [[false; LEVELS]; TRANSPORTS];
        for (i, e) in file.entries.iter().enumerate() {
            if !e.transport.reaches(e.level) {
                return Err(bad(format!("entry {i}: {} does not reach {}", e.transport, e.level)));
            }
            if !(e.latency_us.is_finite() && e.latency_us > 0.0 && e.bandwidth_gbs.is_finite() && e.bandwidth_gbs > 0.0) {
                return Err(bad(format!("entry {i}: latency and bandwidth must be positive numbers")));
            }
            let slot = &mut cleared[e.transport.index()][e.level.index()];
            if !*slot {
                self.points[e.transport.index() * LEVELS + e.level.index()].clear();
                *slot = true;
            }
            self.insert(
                e.transport,
                e.level,
                PerfPoint {
                    min_bytes: e.bytes,
                    latency_us: e.latency_us,
                    bandwidth_gbs: e.bandwidth_gbs,
                    source: PerfSource::Calibrated(path.to_owned()),
                },
            );
        }
        Ok(self)
    }

    /// How many (transport, level) pairs carry calibrated numbers.
    pub fn calibrated_pairs(&self) -> usize {
        self.points.iter().filter(|l| l.iter().any(|p| matches!(p.source, PerfSource::Calibrated(_)))).count()
    }
}

impl Default for PerfTable {
    fn default() -> Self {
        Self::defaults()
    }
}

/// The `format` value of calibration files this build reads.
pub const CALIBRATION_FORMAT: &str = "halo-calibration/1";

/// The JSON file `halo calibrate` writes and the router reads.
///
/// ```json
/// { "format": "halo-calibration/1", "host": "gpu001", "gpus": ["NVIDIA H200"],
///   "created": "2026-05-01T12:00:00Z",
///   "entries": [ { "transport": "nvlink-store", "level": "nvlink", "bytes": 8,
///                  "latency_us": 1.9, "bandwidth_gbs": 3.8, "samples": 1000 } ] }
/// ```
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationFile {
    /// Must be [`CALIBRATION_FORMAT`].
    pub format: String,
    /// Host the measurement ran on.
    #[serde(default)]
    pub host: String,
    /// GPU names, in device order.
    #[serde(default)]
    pub gpus: Vec<String>,
    /// When it was measured (free text, RFC 3339 by convention).
    #[serde(default)]
    pub created: String,
    /// One measurement per transport, level and message size.
    pub entries: Vec<CalibrationEntry>,
}

/// One measured point.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationEntry {
    /// The transport measured.
    pub transport: Transport,
    /// The level between the two GPUs used.
    pub level: DistanceLevel,
    /// Message size of the measurement; the point applies from this size up.
    pub bytes: u64,
    /// Measured one-way latency, microseconds.
    pub latency_us: f64,
    /// Measured bandwidth, GB/s.
    pub bandwidth_gbs: f64,
    /// How many repetitions the numbers summarise.
    #[serde(default)]
    pub samples: u64,
    /// Where the numbers came from (`halo calibrate` writes "measured on \<GPU\> \<date\>").
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_caps() {
        for t in Transport::ALL {
            assert_eq!(t.name().parse::<Transport>().ok(), Some(t));
        }
        assert_eq!("NVSHMEM_PUT".parse::<Transport>().ok(), Some(Transport::NvshmemPut));
        assert!("tcp".parse::<Transport>().is_err());
        assert!(!Transport::NvlinkTma.caps().contains(Op::Amo.required()));
        assert!(!Transport::Nccl.caps().contains(Op::Get.required()));
        assert_eq!(Transport::Staged.caps().to_string(), "put+put-signal+get+host-copy");
        for t in Transport::ALL {
            for l in DistanceLevel::ALL {
                let p = PerfTable::defaults();
                assert_eq!(p.lookup(t, l, 8).is_some(), t.reaches(l), "{t} at {l}");
            }
        }
    }

    #[test]
    fn transport_sets() {
        let s = TransportSet::of(&[Transport::Staged, Transport::NvlinkStore]);
        assert!(s.contains(Transport::Staged) && !s.contains(Transport::Nccl));
        assert_eq!(s.to_string(), "nvlink-store, staged");
        assert_eq!(TransportSet::ALL.iter().count(), TRANSPORTS);
        assert_eq!("staged, nvlink-store".parse::<TransportSet>().ok(), Some(s));
        assert_eq!("ALL".parse::<TransportSet>().ok(), Some(TransportSet::ALL));
        assert!("".parse::<TransportSet>().is_err());
        assert!("staged,tcp".parse::<TransportSet>().is_err());
        assert_eq!(TransportSet::EMPTY.to_string(), "none");
        let json = serde_json::to_string(&s).expect("serialise");
        assert_eq!(json, r#"["nvlink-store","staged"]"#);
        assert_eq!(serde_json::from_str::<TransportSet>(&json).ok(), Some(s));
    }

    #[test]
    fn calibration_overlays_defaults() {
        let file: CalibrationFile = serde_json::from_str(
            r#"{"format":"halo-calibration/1","entries":[
                {"transport":"nvlink-tma","level":"nvlink","bytes":0,"latency_us":2.0,"bandwidth_gbs":100.0},
                {"transport":"nvlink-tma","level":"nvlink","bytes":65536,"latency_us":2.0,"bandwidth_gbs":400.0}]}"#,
        )
        .expect("valid JSON");
        let path = Path::new("cal.json");
        let t = PerfTable::defaults().with_calibration(&file, path).expect("valid");
        let small = t.lookup(Transport::NvlinkTma, DistanceLevel::NvLink, 1024).expect("present");
        assert_eq!(small.bandwidth_gbs, 100.0);
        assert_eq!(small.source, PerfSource::Calibrated(path.to_owned()));
        let big = t.lookup(Transport::NvlinkTma, DistanceLevel::NvLink, 1 << 20).expect("present");
        assert_eq!(big.bandwidth_gbs, 400.0);
        let other = t.lookup(Transport::NvlinkStore, DistanceLevel::NvLink, 1024).expect("present");
        assert_eq!(other.source, PerfSource::Default);
        assert_eq!(t.calibrated_pairs(), 1);
        let mut wrong = file.clone();
        wrong.format = "v0".into();
        assert!(PerfTable::defaults().with_calibration(&wrong, path).is_err());
        wrong = file;
        wrong.entries[0].level = DistanceLevel::Rack;
        assert!(PerfTable::defaults().with_calibration(&wrong, path).is_err());
    }
}
