//! Where one MD step's time goes on the GPU: timing events recorded on each rank's two streams at
//! the boundaries of the step's phases ([`Mark`]), read back in chunks, turned into each step's
//! phase durations ([`StepPhases`]) and their medians ([`PhaseSummary`]). `MdRun::profile_phases`
//! runs steps with them; `halo md-bench --phases` prints them beside the timed rows.
//!
//! An event between two kernels of one stream ends the overlap that a kernel launched to overlap
//! the one before it would have had (the exchange's kernels start early and wait on the GPU for
//! their input), so each phase is measured as if it ran alone on its stream: the phases say what
//! each part costs and which stream's chain is the longer, not the step time with every overlap
//! (the timed rows say that). Only uncaptured steps carry marks.

use crate::error::{CudaContextExt, Result};
use crate::gpu::{CudaContext, CudaEvent, CudaStream};
use crate::route::calibrate::median;
use cudarc::driver::sys::CUevent_flags;
use std::sync::Arc;

/// A point of a step that the probe stamps, on the stream that reaches it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Local stream: the step's first operation (before any memset).
    Begin,
    /// Local stream: after the home forces' memset (the first step after a search, energy steps)
    /// and the home–home list's prune (prune steps); right after [`Self::Begin`] when the step
    /// has neither.
    LocalPrune,
    /// Local stream: after the home–home forces.
    LocalForces,
    /// Halo stream: after its wait for the previous step's integration.
    HaloBegin,
    /// Halo stream: after the coordinate halo.
    CoordHalo,
    /// Halo stream: after the halo forces' memset, the wait for the home forces' and the prune of
    /// the list with halo atoms (whichever the step has).
    NonLocalPrune,
    /// Halo stream: after the forces of pairs with a halo atom.
    NonLocalForces,
    /// Halo stream: after the force halo.
    ForceHalo,
    /// Local stream: after its wait for the force halo, before the integration.
    Integrate,
    /// Local stream: after the integration: the step's end.
    End,
}

/// Marks per step.
pub const MARKS: usize = 10;

impl Mark {
    /// Every mark, in the order of [`Self::index`].
    pub const ALL: [Self; MARKS] = [
        Self::Begin,
        Self::LocalPrune,
        Self::LocalForces,
        Self::HaloBegin,
        Self::CoordHalo,
        Self::NonLocalPrune,
        Self::NonLocalForces,
        Self::ForceHalo,
        Self::Integrate,
        Self::End,
    ];

    /// Position in a step's marks.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One step's phases on one rank, in µs, from its marks.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepPhases {
    /// From the previous step's end to this step's begin on the local stream: the GPU waiting for
    /// the host's launches. `None` for the first step of a chunk (its previous end was not kept).
    pub idle_before: Option<f64>,
    /// Local stream: the memsets of the home forces and energy record, and the prune of the
    /// home–home list (whichever the step has).
    pub local_prune: f64,
    /// Local stream: the home–home forces.
    pub local_forces: f64,
    /// Halo stream: from the step's begin to its own begin (its wait for the previous step's
    /// integration; negative when the halo stream got there first).
    pub halo_start: f64,
    /// Halo stream: the coordinate halo.
    pub coord_halo: f64,
    /// Halo stream: memset, wait for the home forces' memset and prune before the non-local forces.
    pub nonlocal_prune: f64,
    /// Halo stream: the forces of pairs with a halo atom.
    pub nonlocal_forces: f64,
    /// Halo stream: the force halo.
    pub force_halo: f64,
    /// Local stream: from the later of the two chains' ends to the integration's start (the
    /// cross-stream wait).
    pub join: f64,
    /// Local stream: the integration.
    pub integrate: f64,
    /// The step on the GPU, begin to end.
    pub step: f64,
    /// Whether the halo stream's chain (up to the force halo) ended after the local one.
    pub halo_critical: bool,
}

impl StepPhases {
    /// The phases of a step whose marks lie `at[i]` µs after its [`Mark::Begin`] (`at[0]` is 0),
    /// and whose begin came `idle_before` µs after the previous step's end.
    pub fn from_marks(at: &[f64; MARKS], idle_before: Option<f64>) -> Self {
        let t = |m: Mark| at[m.index()];
        let local_end = t(Mark::LocalForces);
        let halo_end = t(Mark::ForceHalo);
        Self {
            idle_before,
            local_prune: t(Mark::LocalPrune) - t(Mark::Begin),
            local_forces: t(Mark::LocalForces) - t(Mark::LocalPrune),
            halo_start: t(Mark::HaloBegin) - t(Mark::Begin),
            coord_halo: t(Mark::CoordHalo) - t(Mark::HaloBegin),
            nonlocal_prune: t(Mark::NonLocalPrune) - t(Mark::CoordHalo),
            nonlocal_forces: t(Mark::NonLocalForces) - t(Mark::NonLocalPrune),
            force_halo: t(Mark::ForceHalo) - t(Mark::NonLocalForces),
            join: t(Mark::Integrate) - local_end.max(halo_end),
            integrate: t(Mark::End) - t(Mark::Integrate),
            step: t(Mark::End) - t(Mark::Begin),
            halo_critical: halo_end > local_end,
        }
    }
}

/// The medians of a rank's profiled steps.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PhaseSummary {
    /// Global rank.
    pub rank: usize,
    /// Steps summarised.
    pub steps: usize,
    /// Each phase's median over the steps (µs; `idle_before` over the steps that have it,
    /// `halo_critical` whether the halo chain was the longer in most steps).
    pub medians: StepPhases,
    /// Share of the steps whose halo chain ended after the local one.
    pub halo_critical_share: f64,
}

impl PhaseSummary {
    /// Medians over `steps` of rank `rank`; `None` when there are none.
    pub fn of(rank: usize, steps: &[StepPhases]) -> Option<Self> {
        if steps.is_empty() {
            return None;
        }
        let med = |f: fn(&StepPhases) -> f64| median(&steps.iter().map(f).collect::<Vec<_>>()).unwrap_or(f64::NAN);
        let idle: Vec<f64> = steps.iter().filter_map(|s| s.idle_before).collect();
        let share = steps.iter().filter(|s| s.halo_critical).count() as f64 / steps.len() as f64;
        let medians = StepPhases {
            idle_before: median(&idle),
            local_prune: med(|s| s.local_prune),
            local_forces: med(|s| s.local_forces),
            halo_start: med(|s| s.halo_start),
            coord_halo: med(|s| s.coord_halo),
            nonlocal_prune: med(|s| s.nonlocal_prune),
            nonlocal_forces: med(|s| s.nonlocal_forces),
            force_halo: med(|s| s.force_halo),
            join: med(|s| s.join),
            integrate: med(|s| s.integrate),
            step: med(|s| s.step),
            halo_critical: share > 0.5,
        };
        Some(Self { rank, steps: steps.len(), medians, halo_critical_share: share })
    }

    /// Three lines for a reader: each stream's chain, then the step.
    pub fn lines(&self) -> [String; 3] {
        let (r, m) = (self.rank, &self.medians);
        let idle = m.idle_before.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        [
            format!(
                "rank {r}: local stream: memset/prune {:.1}, home-home forces {:.1}; after both chains: join {:.1}, integrate {:.1}",
                m.local_prune, m.local_forces, m.join, m.integrate
            ),
            format!(
                "rank {r}: halo stream: starts at {:+.1}, coordinate halo {:.1}, memset/wait/prune {:.1}, forces with halo atoms {:.1}, force halo {:.1}",
                m.halo_start, m.coord_halo, m.nonlocal_prune, m.nonlocal_forces, m.force_halo
            ),
            format!(
                "rank {r}: step on the GPU {:.1}, GPU idle before it {idle} (waiting for launches); the halo chain is the longer in {:.0} % of {} steps",
                m.step,
                100.0 * self.halo_critical_share,
                self.steps
            ),
        ]
    }
}

/// Steps whose marks are held before they are read back.
pub const CHUNK: usize = 32;

/// One rank's timing events for up to [`CHUNK`] steps, recorded on its streams as the step
/// reaches each [`Mark`], read back when the chunk is full ([`Self::end_step`]) or at the end
/// ([`Self::flush`]).
pub struct PhaseProbe {
    events: Vec<[CudaEvent; MARKS]>,
    /// Steps recorded in the current chunk, and whether each is summarised (search and checked
    /// steps are not: their host work lies inside them).
    kept: Vec<bool>,
    steps: Vec<StepPhases>,
}

impl PhaseProbe {
    /// Events with timing on `ctx`.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        let mut events = Vec::with_capacity(CHUNK);
        for _ in 0..CHUNK {
            let mut step = Vec::with_capacity(MARKS);
            for _ in 0..MARKS {
                step.push(ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).during("creating a timing event")?);
            }
            events.push(step.try_into().unwrap_or_else(|_| unreachable!("MARKS events per step")));
        }
        Ok(Self { events, kept: Vec::with_capacity(CHUNK), steps: Vec::new() })
    }

    /// Records `mark` of the current step on `stream`.
    pub fn mark(&self, mark: Mark, stream: &CudaStream) -> Result<()> {
        self.events[self.kept.len()][mark.index()].record(stream).during("recording a timing event")
    }

    /// Ends the current step (every mark recorded); `keep`: summarise it. A full chunk is read back
    /// (a host wait for its last step).
    pub fn end_step(&mut self, keep: bool) -> Result<()> {
        self.kept.push(keep);
        if self.kept.len() == CHUNK { self.flush() } else { Ok(()) }
    }

    /// Reads back the steps recorded so far (a host wait for the last of them). After an error the
    /// chunk is gone (its steps are not summarised) and the probe can go on.
    pub fn flush(&mut self) -> Result<()> {
        let kept = std::mem::take(&mut self.kept);
        for (k, &keep) in kept.iter().enumerate() {
            let marks = &self.events[k];
            let mut at = [0.0; MARKS];
            for (i, e) in marks.iter().enumerate().skip(1) {
                at[i] = 1e3 * f64::from(marks[0].elapsed_ms(e).during("reading a timing event")?);
            }
            let idle = if k > 0 {
                Some(1e3 * f64::from(self.events[k - 1][Mark::End.index()].elapsed_ms(&marks[0]).during("reading a timing event")?))
            } else {
                None
            };
            if keep {
                self.steps.push(StepPhases::from_marks(&at, idle));
            }
        }
        Ok(())
    }

    /// Forgets every step recorded or summarised so far (the steps a rollback runs again).
    pub fn restart(&mut self) {
        self.kept.clear();
        self.steps.clear();
    }

    /// The steps summarised so far (after [`Self::flush`]).
    pub fn steps(&self) -> &[StepPhases] {
        &self.steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(v: [f64; MARKS]) -> [f64; MARKS] {
        v
    }

    #[test]
    fn phases_are_the_gaps_between_marks_and_the_longer_chain_is_named() {
        // Begin 0, local prune 2, local forces 30; halo begins 0.5, X halo ends 6.5, prune 7,
        // non-local forces 17, F halo 23; integration starts 31, ends 34.
        let s = StepPhases::from_marks(&marks([0.0, 2.0, 30.0, 0.5, 6.5, 7.0, 17.0, 23.0, 31.0, 34.0]), Some(1.5));
        assert_eq!(s.local_prune, 2.0);
        assert_eq!(s.local_forces, 28.0);
        assert_eq!(s.halo_start, 0.5);
        assert_eq!(s.coord_halo, 6.0);
        assert_eq!(s.nonlocal_prune, 0.5);
        assert_eq!(s.nonlocal_forces, 10.0);
        assert_eq!(s.force_halo, 6.0);
        assert_eq!(s.join, 1.0, "from the local chain's end (30), the later one, to 31");
        assert_eq!(s.integrate, 3.0);
        assert_eq!(s.step, 34.0);
        assert!(!s.halo_critical);
        assert_eq!(s.idle_before, Some(1.5));
        // The halo chain ending last: the join counts from its end.
        let h = StepPhases::from_marks(&marks([0.0, 0.0, 20.0, 0.0, 8.0, 8.0, 20.0, 29.0, 30.0, 33.0]), None);
        assert!(h.halo_critical);
        assert_eq!(h.join, 1.0);
        assert_eq!(h.idle_before, None);
    }

    #[test]
    fn the_summary_takes_medians_and_the_share_of_halo_critical_steps() {
        let step = |forces: f64, f_halo_end: f64, idle: Option<f64>| {
            StepPhases::from_marks(&marks([0.0, 0.0, forces, 0.0, 5.0, 5.0, 15.0, f_halo_end, 40.0, 42.0]), idle)
        };
        let steps = [step(30.0, 20.0, None), step(31.0, 35.0, Some(2.0)), step(29.0, 36.0, Some(4.0)), step(50.0, 21.0, Some(3.0))];
        let s = PhaseSummary::of(3, &steps).expect("steps");
        assert_eq!((s.rank, s.steps), (3, 4));
        assert_eq!(s.medians.local_forces, 30.5, "median of 29, 30, 31, 50");
        assert_eq!(s.medians.idle_before, Some(3.0), "median of the steps that have it");
        assert_eq!(s.halo_critical_share, 0.5);
        assert!(!s.medians.halo_critical, "not in most steps");
        assert_eq!(s.medians.step, 42.0);
        let lines = s.lines();
        assert!(lines[0].starts_with("rank 3: local stream: memset/prune 0.0, home-home forces 30.5"), "{}", lines[0]);
        assert!(lines[2].contains("the halo chain is the longer in 50 % of 4 steps"), "{}", lines[2]);
        assert!(PhaseSummary::of(0, &[]).is_none());
    }

    #[test]
    fn every_mark_has_its_own_index() {
        for (i, m) in Mark::ALL.iter().enumerate() {
            assert_eq!(m.index(), i);
        }
    }
}
