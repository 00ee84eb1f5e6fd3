//! The router's tunables: weights, size thresholds, reliability decay, overrides, debug output.
//!
//! Every value records where it came from ([`WeightSource`]) and [`RouteConfig::describe`] lists
//! them all, because a setting applied silently from a file is a common complaint about NCCL.
//! Precedence, lowest first: built-in default, config file (`HALO_ROUTE_CONFIG` or a path given
//! by the caller), environment, command line.

use super::overrides::{Overrides, parse_route_override, parse_route_overrides};
use super::{RouteError, Transport};
use serde::Deserialize;
use std::fmt;
use std::path::{Path, PathBuf};

/// Where a configuration value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WeightSource {
    /// Built in.
    Default,
    /// This environment variable.
    Env(String),
    /// This config file.
    File(PathBuf),
    /// This command-line flag.
    Cli(String),
}

impl fmt::Display for WeightSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightSource::Default => f.write_str("default"),
            WeightSource::Env(v) => write!(f, "env {v}"),
            WeightSource::File(p) => write!(f, "file {}", p.display()),
            WeightSource::Cli(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// A value and where it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Sourced<T> {
    /// The value.
    pub value: T,
    /// Its origin.
    pub source: WeightSource,
}

impl<T> Sourced<T> {
    /// A built-in value.
    pub fn default_value(value: T) -> Self {
        Self { value, source: WeightSource::Default }
    }
}

/// Score weights and the message sizes between which latency hands over to bandwidth.
///
/// Below `small_bytes` the latency weight is `latency` and the bandwidth weight `latency / ratio`;
/// above `large_bytes` the bandwidth weight is `bandwidth` and the latency weight
/// `bandwidth / ratio`; in between both move linearly with the size in bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Weights {
    /// Latency weight for small messages (w1 below `small_bytes`).
    pub latency: Sourced<f64>,
    /// Bandwidth weight for large messages (w2 above `large_bytes`).
    pub bandwidth: Sourced<f64>,
    /// How many times the dominant weight is the other one at either end.
    pub ratio: Sourced<f64>,
    /// Up to this size latency dominates.
    pub small_bytes: Sourced<u64>,
    /// From this size bandwidth dominates.
    pub large_bytes: Sourced<u64>,
    /// w3: how well the transport fits the distance.
    pub topology: Sourced<f64>,
    /// w4: native GPU-initiated support of the operation versus a host-driven one.
    pub capability: Sourced<f64>,
    /// w5: recent failures and timeouts.
    pub reliability: Sourced<f64>,
}

/// The five weights at one message size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EffectiveWeights {
    /// w1.
    pub latency: f64,
    /// w2.
    pub bandwidth: f64,
    /// w3.
    pub topology: f64,
    /// w4.
    pub capability: f64,
    /// w5.
    pub reliability: f64,
}

impl EffectiveWeights {
    /// Sum of the weights (scores are divided by it so that they stay within 0..1).
    pub fn sum(&self) -> f64 {
        self.latency + self.bandwidth + self.topology + self.capability + self.reliability
    }
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            latency: Sourced::default_value(3.0),
            bandwidth: Sourced::default_value(3.0),
            ratio: Sourced::default_value(3.0),
            small_bytes: Sourced::default_value(2048),
            large_bytes: Sourced::default_value(65536),
            topology: Sourced::default_value(1.0),
            capability: Sourced::default_value(1.0),
            reliability: Sourced::default_value(2.0),
        }
    }
}

impl Weights {
    /// The weights for a message of `bytes`.
    pub fn at(&self, bytes: u64) -> EffectiveWeights {
        let (small, large) = (self.small_bytes.value as f64, self.large_bytes.value as f64);
        let t = ((bytes as f64 - small) / (large - small)).clamp(0.0, 1.0);
        let (l, b, r) = (self.latency.value, self.bandwidth.value, self.ratio.value);
        EffectiveWeights {
            latency: l + t * (b / r - l),
            bandwidth: l / r + t * (b - l / r),
            topology: self.topology.value,
            capability: self.capability.value,
            reliability: self.reliability.value,
        }
    }
}

/// Everything the router can be told.
#[derive(Clone, Debug)]
pub struct RouteConfig {
    /// Score weights.
    pub weights: Weights,
    /// Half-life of a recorded failure, seconds.
    pub half_life_s: Sourced<f64>,
    /// A transport whose decayed failure count reaches this is skipped for that peer.
    pub skip_threshold: Sourced<f64>,
    /// Forced transports.
    pub overrides: Overrides,
    /// Write one block per decision to stderr (`HALO_ROUTE_DEBUG=1`).
    pub debug: Sourced<bool>,
    /// Calibration file to load performance numbers from.
    pub calibration: Option<Sourced<PathBuf>>,
    /// Where the nodes sit: a halo topology file or Slurm's topology text ([`super::load_fabric`]).
    pub topology: Option<Sourced<PathBuf>>,
}

impl Default for RouteConfig {
    fn default() -> Self {
        Self {
            weights: Weights::default(),
            half_life_s: Sourced::default_value(30.0),
            skip_threshold: Sourced::default_value(1.0),
            overrides: Overrides::default(),
            debug: Sourced::default_value(false),
            calibration: None,
            topology: None,
        }
    }
}

/// The config file, all keys optional:
///
/// ```toml
/// force_transport = "nvshmem-put"
/// overrides = ["0-1=nvlink-store"]
/// calibration = "calibration.json"   # relative to this file
/// topology = "topology.conf"          # halo TOML or Slurm topology; relative to this file
/// debug = false
///
/// [weights]
/// latency = 3.0        # w1 for small messages
/// bandwidth = 3.0      # w2 for large messages
/// ratio = 3.0
/// small_bytes = 2048
/// large_bytes = 65536
/// topology = 1.0
/// capability = 1.0
/// reliability = 2.0
///
/// [reliability]
/// half_life_s = 30.0
/// skip_threshold = 1.0
/// ```
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    weights: FileWeights,
    #[serde(default)]
    reliability: FileReliability,
    force_transport: Option<String>,
    #[serde(default)]
    overrides: Vec<String>,
    calibration: Option<PathBuf>,
    topology: Option<PathBuf>,
    debug: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileWeights {
    latency: Option<f64>,
    bandwidth: Option<f64>,
    ratio: Option<f64>,
    small_bytes: Option<u64>,
    large_bytes: Option<u64>,
    topology: Option<f64>,
    capability: Option<f64>,
    reliability: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileReliability {
    half_life_s: Option<f64>,
    skip_threshold: Option<f64>,
}

/// The environment variables the router reads.
pub mod env {
    /// Config file path.
    pub const CONFIG: &str = "HALO_ROUTE_CONFIG";
    /// w1 for small messages.
    pub const W_LATENCY: &str = "HALO_ROUTE_W_LATENCY";
    /// w2 for large messages.
    pub const W_BANDWIDTH: &str = "HALO_ROUTE_W_BANDWIDTH";
    /// w3.
    pub const W_TOPOLOGY: &str = "HALO_ROUTE_W_TOPOLOGY";
    /// w4.
    pub const W_CAPABILITY: &str = "HALO_ROUTE_W_CAPABILITY";
    /// w5.
    pub const W_RELIABILITY: &str = "HALO_ROUTE_W_RELIABILITY";
    /// Dominant/other weight ratio at either end of the size range.
    pub const RATIO: &str = "HALO_ROUTE_SIZE_RATIO";
    /// Latency dominates up to this size.
    pub const SMALL_BYTES: &str = "HALO_ROUTE_SMALL_BYTES";
    /// Bandwidth dominates from this size.
    pub const LARGE_BYTES: &str = "HALO_ROUTE_LARGE_BYTES";
    /// Failure half-life in seconds.
    pub const HALF_LIFE_S: &str = "HALO_ROUTE_HALF_LIFE_S";
    /// Decayed failure count at which a transport is skipped.
    pub const SKIP_THRESHOLD: &str = "HALO_ROUTE_SKIP_THRESHOLD";
    /// One transport for every pair.
    pub const FORCE: &str = "HALO_FORCE_TRANSPORT";
    /// Per-pair overrides, comma-separated `a-b=name`.
    pub const OVERRIDE: &str = "HALO_ROUTE_OVERRIDE";
    /// `1` writes one block per decision to stderr.
    pub const DEBUG: &str = "HALO_ROUTE_DEBUG";
    /// Calibration file written by `halo calibrate`.
    pub const CALIBRATION: &str = "HALO_ROUTE_CALIBRATION";
    /// Where the nodes sit: a halo topology file (TOML) or Slurm's `topology.conf` /
    /// `scontrol show topology` output.
    pub const TOPOLOGY: &str = "HALO_ROUTE_TOPOLOGY";
}

/// The names and allowed range of one numeric setting, for validation and its error message.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    /// What the setting means.
    pub what: &'static str,
    /// Its environment variable.
    pub env: &'static str,
    /// Its config-file table and key: `[weights] latency`.
    pub key: &'static str,
    /// Smallest allowed value.
    pub min: f64,
    /// Largest allowed value.
    pub max: f64,
    /// The range in words, with the unit.
    pub range: &'static str,
    /// A good value (the default), for the fix.
    pub example: &'static str,
}

impl Limit {
    /// `Ok` when `value` is finite and within the range; otherwise the error naming where it
    /// came from (`source`) and the fix.
    pub fn check(&self, value: f64, source: &WeightSource) -> Result<(), RouteError> {
        if value.is_finite() && value >= self.min && value <= self.max {
            return Ok(());
        }
        Err(RouteError::Config {
            setting: self.origin(&format_number(value), source),
            what: self.what,
            problem: if value.is_finite() { "out of range".into() } else { "not a finite number".into() },
            fix: format!("set {} (or `{}` in the route config file) to {}, e.g. {}={}", self.env, self.key, self.range, self.env, self.example),
        })
    }

    /// Where a value came from, in the words a user would look for: the variable, the file and
    /// key, or the flag.
    fn origin(&self, value: &str, source: &WeightSource) -> String {
        match source {
            WeightSource::Env(var) => format!("{var}={value}"),
            WeightSource::File(path) => format!("`{} = {value}` in {}", self.key, path.display()),
            WeightSource::Cli(flag) => format!("{flag} {value}"),
            WeightSource::Default => format!("default {} = {value}", self.key),
        }
    }
}

/// A number as a user would have written it: `1e300`, not three hundred digits.
fn format_number(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-3..1e7).contains(&v.abs()) { format!("{v:e}") } else { format!("{v}") }
}

/// The ranges of the numeric settings ([`RouteConfig::validate`]).
#[derive(Debug)]
pub struct Limits {
    /// w1 for small messages.
    pub latency: Limit,
    /// w2 for large messages.
    pub bandwidth: Limit,
    /// w3.
    pub topology: Limit,
    /// w4.
    pub capability: Limit,
    /// w5.
    pub reliability: Limit,
    /// Dominant/other weight ratio.
    pub ratio: Limit,
    /// Latency dominates up to this size.
    pub small_bytes: Limit,
    /// Bandwidth dominates from this size.
    pub large_bytes: Limit,
    /// Failure half-life.
    pub half_life_s: Limit,
    /// Skip threshold.
    pub skip_threshold: Limit,
}

const fn weight(what: &'static str, env: &'static str, key: &'static str, example: &'static str) -> Limit {
    Limit { what, env, key, min: 0.0, max: 1e6, range: "a number from 0 to 1000000", example }
}

/// The allowed range of every numeric setting. Weights are relative, so a million is plenty; the
/// half-life runs from a millisecond to a year (longer overflows no clock, but means "never
/// forget", which the skip threshold already expresses); message sizes stop at 1 TiB, the
/// largest size class.
pub const LIMITS: Limits = Limits {
    latency: weight("latency weight for small messages", env::W_LATENCY, "[weights] latency", "3"),
    bandwidth: weight("bandwidth weight for large messages", env::W_BANDWIDTH, "[weights] bandwidth", "3"),
    topology: weight("topology weight", env::W_TOPOLOGY, "[weights] topology", "1"),
    capability: weight("capability weight", env::W_CAPABILITY, "[weights] capability", "1"),
    reliability: weight("reliability weight", env::W_RELIABILITY, "[weights] reliability", "2"),
    ratio: Limit {
        what: "dominant/other weight ratio",
        env: env::RATIO,
        key: "[weights] ratio",
        min: 1.0,
        max: 1e6,
        range: "a number from 1 to 1000000",
        example: "3",
    },
    small_bytes: Limit {
        what: "size up to which latency dominates",
        env: env::SMALL_BYTES,
        key: "[weights] small_bytes",
        min: 0.0,
        max: (1u64 << super::size::MAX_SIZE_CLASS) as f64,
        range: "a size from 0 to 1TiB, below the large threshold",
        example: "2KiB",
    },
    large_bytes: Limit {
        what: "size from which bandwidth dominates",
        env: env::LARGE_BYTES,
        key: "[weights] large_bytes",
        min: 1.0,
        max: (1u64 << super::size::MAX_SIZE_CLASS) as f64,
        range: "a size from 1 byte to 1TiB, above the small threshold",
        example: "64KiB",
    },
    half_life_s: Limit {
        what: "failure half-life in seconds",
        env: env::HALF_LIFE_S,
        key: "[reliability] half_life_s",
        min: 1e-3,
        max: 31_536_000.0,
        range: "a number of seconds from 0.001 to 31536000 (one year)",
        example: "30",
    },
    skip_threshold: Limit {
        what: "decayed failure count at which a transport is skipped",
        env: env::SKIP_THRESHOLD,
        key: "[reliability] skip_threshold",
        min: 1e-3,
        max: 1e3,
        range: "a number from 0.001 to 1000",
        example: "1",
    },
};

impl RouteConfig {
    /// Defaults, then the file named by `HALO_ROUTE_CONFIG` (if set), then the process environment.
    pub fn from_env() -> Result<Self, RouteError> {
        Self::load(None, &|k| std::env::var(k).ok())
    }

    /// Defaults, then `file` (or the one `env` names in `HALO_ROUTE_CONFIG`), then `env`.
    ///
    /// `env` is a lookup so that tests need not touch the process environment.
    pub fn load(file: Option<&Path>, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, RouteError> {
        let mut cfg = Self::default();
        let from_env = env(env::CONFIG).filter(|s| !s.trim().is_empty()).map(PathBuf::from);
        if let Some(path) = file.map(Path::to_owned).or(from_env) {
            cfg.apply_file(&path)?;
        }
        cfg.apply_env(env)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Applies the settings of a config file (they beat defaults; later calls beat earlier ones).
    pub fn apply_file(&mut self, path: &Path) -> Result<(), RouteError> {
        let text = std::fs::read_to_string(path).map_err(|source| RouteError::Io { what: "route config", path: path.to_owned(), source })?;
        self.apply_file_text(&text, path)
    }

    /// Applies a config file's text; `path` is recorded as the source.
    pub fn apply_file_text(&mut self, text: &str, path: &Path) -> Result<(), RouteError> {
        let bad = |reason: String| RouteError::BadFile { what: "route config", path: path.to_owned(), reason };
        let f: FileConfig = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        let src = || WeightSource::File(path.to_owned());
        let set = |slot: &mut Sourced<f64>, v: Option<f64>| {
            if let Some(value) = v {
                *slot = Sourced { value, source: src() };
            }
        };
        let w = &mut self.weights;
        set(&mut w.latency, f.weights.latency);
        set(&mut w.bandwidth, f.weights.bandwidth);
        set(&mut w.ratio, f.weights.ratio);
        set(&mut w.topology, f.weights.topology);
        set(&mut w.capability, f.weights.capability);
        set(&mut w.reliability, f.weights.reliability);
        set(&mut self.half_life_s, f.reliability.half_life_s);
        set(&mut self.skip_threshold, f.reliability.skip_threshold);
        if let Some(value) = f.weights.small_bytes {
            w.small_bytes = Sourced { value, source: src() };
        }
        if let Some(value) = f.weights.large_bytes {
            w.large_bytes = Sourced { value, source: src() };
        }
        if let Some(name) = f.force_transport {
            let value = name.parse::<Transport>().map_err(|e| bad(e.to_string()))?;
            self.overrides.global = Some(Sourced { value, source: src() });
        }
        for spec in &f.overrides {
            let value = parse_route_override(spec).map_err(|e| bad(e.to_string()))?;
            self.overrides.pairs.push(Sourced { value, source: src() });
        }
        // Relative paths are relative to the config file, not to the working directory.
        let beside = |value: PathBuf| match path.parent() {
            Some(dir) if value.is_relative() => dir.join(value),
            _ => value,
        };
        if let Some(value) = f.calibration {
            self.calibration = Some(Sourced { value: beside(value), source: src() });
        }
        if let Some(value) = f.topology {
            self.topology = Some(Sourced { value: beside(value), source: src() });
        }
        if let Some(value) = f.debug {
            self.debug = Sourced { value, source: src() };
        }
        Ok(())
    }

    /// Applies the `HALO_ROUTE_*` and `HALO_FORCE_TRANSPORT` variables found by `env`.
    pub fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), RouteError> {
        let get = |var: &str| env(var).filter(|v| !v.trim().is_empty());
        let bad = |var: &str, value: &str, reason: String| RouteError::Env { var: var.to_owned(), value: value.to_owned(), reason };
        let float = |slot: &mut Sourced<f64>, var: &str| -> Result<(), RouteError> {
            if let Some(v) = get(var) {
                let value = v.trim().parse::<f64>().map_err(|e| bad(var, &v, e.to_string()))?;
                *slot = Sourced { value, source: WeightSource::Env(var.to_owned()) };
            }
            Ok(())
        };
        let w = &mut self.weights;
        float(&mut w.latency, env::W_LATENCY)?;
        float(&mut w.bandwidth, env::W_BANDWIDTH)?;
        float(&mut w.topology, env::W_TOPOLOGY)?;
        float(&mut w.capability, env::W_CAPABILITY)?;
        float(&mut w.reliability, env::W_RELIABILITY)?;
        float(&mut w.ratio, env::RATIO)?;
        float(&mut self.half_life_s, env::HALF_LIFE_S)?;
        float(&mut self.skip_threshold, env::SKIP_THRESHOLD)?;
        for (slot, var) in [(&mut w.small_bytes, env::SMALL_BYTES), (&mut w.large_bytes, env::LARGE_BYTES)] {
            if let Some(v) = get(var) {
                let value = super::parse_size(&v).map_err(|e| bad(var, &v, e.to_string()))?;
                *slot = Sourced { value, source: WeightSource::Env(var.to_owned()) };
            }
        }
        if let Some(v) = get(env::FORCE) {
            let value = v.parse::<Transport>().map_err(|e| bad(env::FORCE, &v, e.to_string()))?;
            self.overrides.global = Some(Sourced { value, source: WeightSource::Env(env::FORCE.into()) });
        }
        if let Some(v) = get(env::OVERRIDE) {
            for value in parse_route_overrides(&v).map_err(|e| bad(env::OVERRIDE, &v, e.to_string()))? {
                self.overrides.pairs.push(Sourced { value, source: WeightSource::Env(env::OVERRIDE.into()) });
            }
        }
        if let Some(v) = get(env::DEBUG) {
            let value = match v.trim() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => return Err(bad(env::DEBUG, &v, "expected 1 or 0".into())),
            };
            self.debug = Sourced { value, source: WeightSource::Env(env::DEBUG.into()) };
        }
        for (slot, var) in [(&mut self.calibration, env::CALIBRATION), (&mut self.topology, env::TOPOLOGY)] {
            if let Some(v) = get(var) {
                *slot = Some(Sourced { value: PathBuf::from(v), source: WeightSource::Env(var.into()) });
            }
        }
        Ok(())
    }

    /// Adds per-pair overrides given on the command line (they beat file and environment).
    pub fn add_cli_overrides(&mut self, flag: &str, specs: &[String]) -> Result<(), RouteError> {
        for spec in specs {
            for value in parse_route_overrides(spec)? {
                self.overrides.pairs.push(Sourced { value, source: WeightSource::Cli(flag.to_owned()) });
            }
        }
        Ok(())
    }

    /// Checks every value against its range and the values against each other.
    ///
    /// Every value must be finite and within a sane range (see [`LIMITS`]); the error names the
    /// variable or the config-file key it came from and the range to use instead, so no value a
    /// user can set makes the router overflow (a half-life of `1e300` s once did) or score NaN.
    pub fn validate(&self) -> Result<(), RouteError> {
        let w = &self.weights;
        let floats = [
            (&w.latency, &LIMITS.latency),
            (&w.bandwidth, &LIMITS.bandwidth),
            (&w.topology, &LIMITS.topology),
            (&w.capability, &LIMITS.capability),
            (&w.reliability, &LIMITS.reliability),
            (&w.ratio, &LIMITS.ratio),
            (&self.half_life_s, &LIMITS.half_life_s),
            (&self.skip_threshold, &LIMITS.skip_threshold),
        ];
        for (s, limit) in floats {
            limit.check(s.value, &s.source)?;
        }
        for (s, limit) in [(&w.small_bytes, &LIMITS.small_bytes), (&w.large_bytes, &LIMITS.large_bytes)] {
            // Exact for every value up to 2^53, far beyond the limit.
            limit.check(s.value as f64, &s.source)?;
        }
        if w.small_bytes.value >= w.large_bytes.value {
            let (small, large) = (&LIMITS.small_bytes, &LIMITS.large_bytes);
            return Err(RouteError::Config {
                setting: format!(
                    "{} and {}",
                    small.origin(&w.small_bytes.value.to_string(), &w.small_bytes.source),
                    large.origin(&w.large_bytes.value.to_string(), &w.large_bytes.source)
                ),
                what: "message sizes where latency hands over to bandwidth",
                problem: "the small threshold must be below the large one".into(),
                fix: format!("set {} below {} (defaults 2KiB and 64KiB), or `small_bytes` below `large_bytes` in [weights]", small.env, large.env),
            });
        }
        if w.at(0).sum() <= 0.0 || w.at(u64::MAX).sum() <= 0.0 {
            return Err(RouteError::Config {
                setting: "HALO_ROUTE_W_LATENCY, _W_BANDWIDTH, _W_TOPOLOGY, _W_CAPABILITY, _W_RELIABILITY (or [weights])".into(),
                what: "score weights",
                problem: "all zero".into(),
                fix: "make at least one weight positive, e.g. HALO_ROUTE_W_LATENCY=3".into(),
            });
        }
        Ok(())
    }

    /// One line per setting: `name = value (source)`.
    pub fn describe(&self) -> Vec<String> {
        let w = &self.weights;
        let mut out = vec![
            format!("latency weight (small messages) = {} ({})", w.latency.value, w.latency.source),
            format!("bandwidth weight (large messages) = {} ({})", w.bandwidth.value, w.bandwidth.source),
            format!("size ratio = {} ({})", w.ratio.value, w.ratio.source),
            format!("small_bytes = {} ({})", w.small_bytes.value, w.small_bytes.source),
            format!("large_bytes = {} ({})", w.large_bytes.value, w.large_bytes.source),
            format!("topology weight = {} ({})", w.topology.value, w.topology.source),
            format!("capability weight = {} ({})", w.capability.value, w.capability.source),
            format!("reliability weight = {} ({})", w.reliability.value, w.reliability.source),
            format!("failure half-life = {} s ({})", self.half_life_s.value, self.half_life_s.source),
            format!("skip threshold = {} ({})", self.skip_threshold.value, self.skip_threshold.source),
            format!("debug = {} ({})", self.debug.value, self.debug.source),
        ];
        match &self.calibration {
            Some(c) => out.push(format!("calibration = {} ({})", c.value.display(), c.source)),
            None => out.push("calibration = none: performance numbers are defaults, not measured".into()),
        }
        if let Some(t) = &self.topology {
            out.push(format!("topology = {} ({})", t.value.display(), t.source));
        }
        if let Some(g) = &self.overrides.global {
            out.push(format!("forced transport = {} ({})", g.value, g.source));
        }
        for p in &self.overrides.pairs {
            out.push(format!("override {} ({})", p.value, p.source));
        }
        out
    }

    /// The node placements the `topology` setting names, if any.
    pub fn fabric(&self) -> Result<Option<super::Fabric>, RouteError> {
        self.topology.as_ref().map(|t| super::load_fabric(&t.value)).transpose()
    }

    /// Logs [`RouteConfig::describe`] at info level.
    pub fn log(&self) {
        // The lines are formatted only for a subscriber that takes them.
        if !tracing::enabled!(tracing::Level::INFO) {
            return;
        }
        for line in self.describe() {
            tracing::info!("route config: {line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        RouteConfig::default().validate().expect("defaults are valid");
        let w = Weights::default().at(1024);
        assert_eq!((w.latency, w.bandwidth), (3.0, 1.0));
    }

    #[test]
    fn rejects_bad_values() {
        let mut c = RouteConfig::default();
        c.weights.small_bytes.value = 1 << 20;
        assert!(c.validate().is_err());
        let env = |k: &str| (k == env::W_LATENCY).then(|| "fast".to_owned());
        assert!(RouteConfig::load(None, &env).is_err());
        let mut c = RouteConfig::default();
        assert!(c.apply_file_text("[weights]\nlatncy = 1.0\n", Path::new("x.toml")).is_err(), "typos are errors");
    }
}
