//! The `HALO_ROUTE_DEBUG` block: one per decision, every candidate with its numbers and reason.
//!
//! Fixed `key=value` lines with a `[route]` prefix so that scripts can grep and split them.

use super::TransportSet;
use super::router::{Decision, RouteReason};
use super::size::format_size;
use std::fmt;

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.distance;
        writeln!(
            f,
            "[route] op={} size={} (class {}) self={} peer={} epoch={} topology={}",
            self.op,
            self.bytes,
            format_size(self.class_bytes),
            self.self_pe,
            self.peer,
            self.epoch,
            self.topology_hash
        )?;
        match d.hit {
            Some(hit) => write!(f, "[route]   level={} (bitmap hit at level {}: {hit})", d.level, hit.index())?,
            None => write!(f, "[route]   level={} (no bitmap level agreed; default)", d.level)?,
        }
        if let Some((claimed, by)) = d.one_sided {
            write!(f, "; PE {by} alone claims {claimed}, not trusted")?;
        }
        writeln!(f)?;
        if self.allowed != TransportSet::ALL {
            // Only for restricted callers, so the blocks of ordinary lookups keep their shape.
            let names: Vec<&str> = self.allowed.iter().map(|t| t.name()).collect();
            writeln!(f, "[route]   allowed={} (the caller's transports)", names.join(","))?;
        }
        let w = &self.weights;
        writeln!(
            f,
            "[route]   weights latency={:.2} bandwidth={:.2} topology={:.2} capability={:.2} reliability={:.2}",
            w.latency, w.bandwidth, w.topology, w.capability, w.reliability
        )?;
        for c in &self.scoring.candidates {
            match c.excluded {
                Some(e) if !(self.forced_by.is_some() && c.transport == self.route.transport) => {
                    writeln!(f, "[route]   candidate={:<12} score=0.000 excluded: {e}", c.transport.name())?
                }
                _ => {
                    let x = &c.factors;
                    writeln!(
                        f,
                        "[route]   candidate={:<12} latency={:.2}us bw={:.1}GB/s score={:.3} \
                         (lat={:.2} bw={:.2} topo={:.2} cap={:.2} rel={:.2}) [{}]",
                        c.transport.name(),
                        c.latency_us,
                        c.bandwidth_gbs,
                        c.score,
                        x.latency,
                        x.bandwidth,
                        x.topology,
                        x.capability,
                        x.reliability,
                        if c.calibrated { "calibrated" } else { "default, not measured" }
                    )?
                }
            }
        }
        let why = match (self.route.reason, &self.forced_by) {
            (RouteReason::Forced, Some(by)) => format!(" (forced by {by})"),
            (RouteReason::AllFailed, _) => " (every usable transport failed recently; best of them)".to_owned(),
            _ => String::new(),
        };
        writeln!(
            f,
            "[route]   select {} for {} size={} to PE {} (score {:.3}){why}",
            self.route.transport, self.op, self.bytes, self.peer, self.route.score
        )
    }
}
