//! `halo calibrate`'s model: what to measure, how measurements become a [`CalibrationFile`].
//!
//! The measuring itself (GPUs, CUDA events) sits behind [`Measurer`], so that turning
//! measurements into the file is tested without a GPU. Each point's `latency_us` is the measured
//! one-way time of a message of that size and `bandwidth_gbs` is size / time, so both of the
//! router's speed factors rank transports by the measured time at that size: after calibration the
//! router prefers, per size class, the transport that was measured fastest (unless topology,
//! capability or reliability outweigh it).

use super::transport::CALIBRATION_FORMAT;
use super::{CalibrationEntry, CalibrationFile, DistanceLevel, Transport};
use std::path::Path;

/// Message sizes measured by default (bytes).
pub const DEFAULT_SIZES: [u64; 5] = [64, 1024, 16384, 262144, 4194304];

/// One (transport, level) to measure, or why it is not measured here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Planned {
    /// Measure `transport` between two GPUs (or ranks) at `level`.
    Measure {
        /// The transport.
        transport: Transport,
        /// The distance between the two ends.
        level: DistanceLevel,
    },
    /// Not measured, with the reason recorded in the report.
    Skip {
        /// The transport.
        transport: Transport,
        /// Why.
        reason: String,
    },
}

/// The result of one measurement: the median one-way time over `samples` repetitions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Median one-way time of one message, microseconds.
    pub one_way_us: f64,
    /// Repetitions measured (after warm-up).
    pub samples: u64,
    /// The timed step's results matched a reference (the measurer's check passed). A sample that
    /// is not checked never enters the file.
    pub checked: bool,
}

/// Why a point has no number.
#[derive(Clone, Debug, PartialEq)]
pub enum NotMeasured {
    /// Not possible here, with the reason (a transport that cannot run, an allocation that failed).
    Skipped(String),
    /// The step that was timed did not give the reference's results: its time is not a result.
    CheckFailed(String),
}

impl From<String> for NotMeasured {
    fn from(reason: String) -> Self {
        Self::Skipped(reason)
    }
}

impl From<&str> for NotMeasured {
    fn from(reason: &str) -> Self {
        Self::Skipped(reason.into())
    }
}

/// Measures transports on real (or, in tests, fake) hardware.
pub trait Measurer {
    /// GPU names, in device order (recorded in the file and in each value's source).
    fn gpu_names(&self) -> Vec<String>;
    /// What this measurer will measure and what it skips.
    fn plan(&self) -> Vec<Planned>;
    /// Measures one message size (checked against a reference); `Err` says why there is no number.
    fn measure(&mut self, transport: Transport, level: DistanceLevel, bytes: u64) -> Result<Sample, NotMeasured>;
}

/// A calibration run's outcome: the file plus everything that was not measured.
#[derive(Clone, Debug)]
pub struct CalibrationReport {
    /// What the router will load.
    pub file: CalibrationFile,
    /// `(transport, level, bytes, reason)` of every point not measured (level/bytes `None` when
    /// the whole transport was skipped).
    pub skipped: Vec<(Transport, Option<DistanceLevel>, Option<u64>, String)>,
    /// `(transport, level, bytes, what failed)` of every point whose check failed (or that was
    /// not checked): measured, but no result. A calibration with any is not to be used.
    pub failed: Vec<(Transport, DistanceLevel, u64, String)>,
}

/// Runs every planned measurement at every size and builds the file.
///
/// `created` is the date recorded in the file and in each value's source (RFC 3339).
pub fn calibrate(m: &mut dyn Measurer, sizes: &[u64], host: &str, created: &str) -> CalibrationReport {
    let gpus = m.gpu_names();
    let gpu = gpus.first().cloned().unwrap_or_else(|| "unknown GPU".into());
    let source = format!("measured on {gpu} {created}");
    let mut sizes: Vec<u64> = sizes.iter().copied().filter(|&s| s > 0).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut entries = Vec::new();
    let mut skipped = Vec::new();
    let mut failed = Vec::new();
    for planned in m.plan() {
        let (transport, level) = match planned {
            Planned::Measure { transport, level } => (transport, level),
            Planned::Skip { transport, reason } => {
                skipped.push((transport, None, None, reason));
                continue;
            }
        };
        if !transport.reaches(level) {
            skipped.push((transport, Some(level), None, format!("{transport} does not reach {level}")));
            continue;
        }
        for &bytes in &sizes {
            match m.measure(transport, level, bytes) {
                Ok(s) if !s.checked => failed.push((transport, level, bytes, "the timed step was not checked against a reference".into())),
                Ok(s) if s.one_way_us.is_finite() && s.one_way_us > 0.0 => entries.push(CalibrationEntry {
                    transport,
                    level,
                    bytes,
                    latency_us: s.one_way_us,
                    // bytes per microsecond = MB/s; / 1000 = GB/s.
                    bandwidth_gbs: bytes as f64 / s.one_way_us / 1000.0,
                    samples: s.samples,
                    source: source.clone(),
                }),
                Ok(s) => skipped.push((transport, Some(level), Some(bytes), format!("unusable time {} µs", s.one_way_us))),
                Err(NotMeasured::Skipped(reason)) => skipped.push((transport, Some(level), Some(bytes), reason)),
                Err(NotMeasured::CheckFailed(why)) => failed.push((transport, level, bytes, why)),
            }
        }
    }
    CalibrationReport {
        file: CalibrationFile { format: CALIBRATION_FORMAT.into(), host: host.into(), gpus, created: created.into(), entries },
        skipped,
        failed,
    }
}

/// Writes the file as pretty JSON (through a temporary file and a rename, so a reader never
/// sees half of it).
pub fn write_calibration(path: &Path, file: &CalibrationFile) -> std::io::Result<()> {
    let mut text = serde_json::to_string_pretty(file).map_err(std::io::Error::other)?;
    text.push('\n');
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The median of `values` (mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// Parses `64,1024,16KiB` into sizes.
pub fn parse_sizes(s: &str) -> Result<Vec<u64>, super::RouteError> {
    s.split(',').filter(|p| !p.trim().is_empty()).map(|p| super::parse_size(p.trim())).collect()
}

/// The current UTC time as RFC 3339 (`2026-05-01T12:00:00Z`), without a date library.
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm, proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::{Op, PerfTable, RouteConfig, Router, single_node};
    use std::sync::Arc;

    /// Time = latency + bytes / bandwidth per transport, from a table; NCCL skipped.
    struct FakeMeasurer {
        model: Vec<(Transport, f64, f64)>,
        calls: usize,
        /// (transport, bytes) whose check fails, and whose sample comes back unchecked.
        wrong: Option<(Transport, u64)>,
        unchecked: Option<(Transport, u64)>,
    }

    impl Measurer for FakeMeasurer {
        fn gpu_names(&self) -> Vec<String> {
            vec!["Fake H200".into(), "Fake H200".into()]
        }
        fn plan(&self) -> Vec<Planned> {
            let mut p: Vec<Planned> =
                self.model.iter().map(|&(transport, ..)| Planned::Measure { transport, level: DistanceLevel::NvLink }).collect();
            p.push(Planned::Skip { transport: Transport::Nccl, reason: "NCCL is not installed here".into() });
            p
        }
        fn measure(&mut self, t: Transport, _l: DistanceLevel, bytes: u64) -> Result<Sample, NotMeasured> {
            self.calls += 1;
            if self.wrong == Some((t, bytes)) {
                return Err(NotMeasured::CheckFailed("rank 1: coordinate of atom 3 differs".into()));
            }
            if t == Transport::Staged && bytes > 100_000 {
                return Err("out of memory".into());
            }
            let &(_, lat, bw) = self.model.iter().find(|m| m.0 == t).ok_or("not modelled")?;
            Ok(Sample { one_way_us: lat + bytes as f64 / (bw * 1000.0), samples: 20, checked: self.unchecked != Some((t, bytes)) })
        }
    }

    fn fake() -> FakeMeasurer {
        FakeMeasurer {
            model: vec![
                (Transport::NvlinkStore, 2.0, 100.0),
                (Transport::NvlinkTma, 4.0, 400.0),
                (Transport::NvshmemPut, 3.0, 200.0),
                (Transport::Staged, 20.0, 300.0),
            ],
            calls: 0,
            wrong: None,
            unchecked: None,
        }
    }

    /// A point whose check failed, and a sample that was not checked, give no entry: they are
    /// failures, apart from the skips.
    #[test]
    fn failed_or_unchecked_points_never_enter_the_file() {
        let mut m = FakeMeasurer { wrong: Some((Transport::NvlinkTma, 1024)), unchecked: Some((Transport::NvlinkStore, 64)), ..fake() };
        let report = calibrate(&mut m, &[64, 1024], "gpu001", "2026-05-01T12:00:00Z");
        let has = |t: Transport, b: u64| report.file.entries.iter().any(|e| e.transport == t && e.bytes == b);
        assert!(!has(Transport::NvlinkTma, 1024) && !has(Transport::NvlinkStore, 64));
        assert!(has(Transport::NvlinkTma, 64) && has(Transport::NvlinkStore, 1024));
        assert_eq!(report.file.entries.len(), 4 * 2 - 2);
        assert_eq!(report.failed.len(), 2, "{:?}", report.failed);
        assert!(report.failed.iter().any(|f| f.0 == Transport::NvlinkTma && f.2 == 1024 && f.3.contains("atom 3")));
        assert!(report.failed.iter().any(|f| f.0 == Transport::NvlinkStore && f.2 == 64 && f.3.contains("not checked")));
        assert!(report.skipped.iter().all(|s| s.2 != Some(1024) || s.0 != Transport::NvlinkTma));
        assert!(calibrate(&mut fake(), &[64], "h", "2026-05-01T12:00:00Z").failed.is_empty());
    }

    #[test]
    fn file_from_fake_measurements_round_trips_and_steers_the_router() {
        let mut m = fake();
        let report = calibrate(&mut m, &[1024, 64, 4194304, 1024], "gpu001", "2026-05-01T12:00:00Z");
        assert_eq!(m.calls, 4 * 3);
        let f = &report.file;
        assert_eq!(f.format, CALIBRATION_FORMAT);
        assert_eq!(f.entries.len(), 4 * 3 - 1); // staged's 4 MiB point failed
        assert!(report.skipped.iter().any(|s| s.0 == Transport::Nccl && s.1.is_none()));
        assert!(report.skipped.iter().any(|s| s.0 == Transport::Staged && s.2 == Some(4194304)));
        let e = f.entries.iter().find(|e| e.transport == Transport::NvlinkStore && e.bytes == 1024).expect("entry");
        assert!((e.latency_us - (2.0 + 1024.0 / 100_000.0)).abs() < 1e-9);
        assert!((e.bandwidth_gbs - 1024.0 / e.latency_us / 1000.0).abs() < 1e-12);
        assert_eq!(e.source, "measured on Fake H200 2026-05-01T12:00:00Z");

        // A private directory under the system temp dir (no tempfile dependency in the library's tests).
        let dir = std::env::temp_dir().join(format!("halo-calibrate-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("calibration.json");
        write_calibration(&path, f).expect("write");
        let table = PerfTable::load_calibration(&path).expect("the router reads what calibrate wrote");
        assert_eq!(table.calibrated_pairs(), 4);
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.contains("\"source\": \"measured on Fake H200"));

        // The router picks the measured-fastest transport per size: stores for small messages,
        // TMA for large ones.
        let config = RouteConfig {
            calibration: Some(crate::route::Sourced { value: path.clone(), source: crate::route::WeightSource::Default }),
            ..RouteConfig::default()
        };
        let mut r = Router::new(0, Arc::new(single_node(2).expect("topology")), config).expect("router");
        assert_eq!(r.route(1, Op::Put, 64).map(|x| x.transport).ok(), Some(Transport::NvlinkStore));
        assert_eq!(r.route(1, Op::Put, 4 << 20).map(|x| x.transport).ok(), Some(Transport::NvlinkTma));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn medians_sizes_dates() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(parse_sizes("64,1KiB, 16384").ok(), Some(vec![64, 1024, 16384]));
        assert!(parse_sizes("64,x").is_err());
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_709_210_096), "2024-02-29T12:34:56Z");
        assert!(now_rfc3339().ends_with('Z'));
    }
}
