//! Which forces a rank's step must zero before its force kernels add into them, and which the
//! integration clears for the next step: the state behind "a plain step has no memset".
//!
//! The integration (`leapfrog`, on the local stream, after the force halo) is the last reader of
//! the home forces, so it zeroes them; where the transport lets it
//! ([`Transport::halo_forces_read_by_peer`] is `false`: only this rank's own force halo reads
//! them) it zeroes the halo forces `f[home..total]` in the same launch. A step then needs a memset
//! only where no such integration ran since the forces were last written otherwise: after a
//! search (new lists, maybe a new exchange and home count, so the force array holds anything), or
//! for the halo forces of a transport whose peers read them.
//!
//! A captured step (CUDA graph) takes the memsets of the step it was captured at. That is valid
//! for every replay because a graph lives for one search interval (the MD run drops its graphs at
//! every search) and every step of the interval, replayed or not, ends with the same integration:
//! a graph captured without a memset is only ever replayed after an integration that cleared
//! those forces, and one captured right after a search keeps a memset that is redundant later.

use crate::exchange::Transport;

/// The memsets of one step, decided before its first launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepZeroing {
    /// Zero the home forces `f[..home]` (local stream, before the home–home forces).
    pub home: bool,
    /// Zero the halo forces `f[home..total]` (halo stream, after the coordinate halo, before the
    /// forces with halo atoms).
    pub halo: bool,
    /// Zero this step's energy record (local stream).
    pub energy: bool,
}

impl StepZeroing {
    /// The memsets of a step that starts with `forces_clear` (the last integration cleared the
    /// home forces, and no search came since) and `halo_clear` (that integration cleared the halo
    /// forces too), summing energies when `energy`. `halo_clear` counts only with
    /// `forces_clear`: a search resets `forces_clear` alone, and the integration sets both.
    pub fn plan(forces_clear: bool, halo_clear: bool, energy: bool) -> Self {
        Self { home: !forces_clear, halo: !(forces_clear && halo_clear), energy }
    }

    /// Whether the local stream zeroes anything (home forces, the energy record) that the halo
    /// stream's force kernel, which adds into both, must wait for.
    pub fn on_local(self) -> bool {
        self.home || self.energy
    }
}

/// Whether the integration of a step exchanged with `transport` clears the halo forces along with
/// the home forces (see the module's documentation).
pub fn integration_clears_halo(transport: Transport) -> bool {
    !transport.halo_forces_read_by_peer()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A rank's force array as far as zeroing goes (`true`: known zero), and the host's flags.
    #[derive(Clone, Copy, Debug)]
    struct Model {
        home_zero: bool,
        halo_zero: bool,
        forces_clear: bool,
        halo_clear: bool,
    }

    impl Model {
        /// What the rank's state is at the start of a run: nothing known (the first search's
        /// `set_atoms` resets `forces_clear`; `halo_clear` starts `false`).
        fn new() -> Self {
            Self { home_zero: false, halo_zero: false, forces_clear: false, halo_clear: false }
        }

        /// A search: new layout (the array holds anything); `set_atoms` resets `forces_clear` and
        /// leaves `halo_clear` as it was.
        fn search(&mut self) {
            (self.home_zero, self.halo_zero, self.forces_clear) = (false, false, false);
        }

        /// The host's side of a step (uncaptured, or captured): its plan, then the integration's
        /// effect on the flags.
        fn host_step(&mut self, clears_halo: bool, energy: bool) -> StepZeroing {
            let z = StepZeroing::plan(self.forces_clear, self.halo_clear, energy);
            (self.forces_clear, self.halo_clear) = (true, clears_halo);
            z
        }

        /// The device's side of a step with memsets `z`: both force kernels add into zeros, the
        /// force halo reads the halo forces, the integration clears what it clears.
        fn device_step(&mut self, z: StepZeroing, clears_halo: bool, what: &str) {
            self.home_zero |= z.home;
            self.halo_zero |= z.halo;
            assert!(self.home_zero, "{what}: the home forces are not zero when the force kernels add into them");
            assert!(self.halo_zero, "{what}: the halo forces are not zero when the force kernels add into them");
            self.home_zero = true;
            self.halo_zero = clears_halo;
        }
    }

    #[test]
    fn a_plain_step_needs_no_memset_after_a_clearing_integration() {
        assert_eq!(StepZeroing::plan(true, true, false), StepZeroing::default());
        assert!(!StepZeroing::plan(true, true, false).on_local());
        // Energy steps zero their record only; the halo stream waits for that.
        assert_eq!(StepZeroing::plan(true, true, true), StepZeroing { energy: true, ..Default::default() });
        assert!(StepZeroing::plan(true, true, true).on_local());
        // After a search: both, whatever the last integration cleared.
        for halo_clear in [false, true] {
            let z = StepZeroing::plan(false, halo_clear, false);
            assert!(z.home && z.halo && z.on_local(), "{z:?}");
        }
        // A transport whose peers read the halo forces: the halo memset every step.
        assert_eq!(StepZeroing::plan(true, false, false), StepZeroing { halo: true, ..Default::default() });
        assert!(!StepZeroing::plan(true, false, false).on_local(), "the halo memset is on the halo stream itself");
        for t in Transport::ALL {
            assert_eq!(integration_clears_halo(t), !t.halo_forces_read_by_peer(), "{t}");
        }
    }

    /// Random runs shaped like `MdRun::one_step`: a search every `nstlist` steps (dropping the
    /// graphs), steps that are uncaptured (energy, checks) or replays of the graph of their kind
    /// (captured at the first step of that kind in the interval, with the memsets planned then),
    /// for integrations that clear the halo forces and ones that do not. The forces must be zero
    /// whenever the force kernels add into them, and a plain step after a clearing integration
    /// must need no memset.
    #[test]
    fn every_step_and_every_replay_starts_from_zeroed_forces() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for run in 0..200 {
            let clears_halo = run % 2 == 0;
            let nstlist = rng.random_range(1..12u64);
            let nstprune = rng.random_range(1..5u64);
            let mut m = Model::new();
            let mut graphs: [Option<StepZeroing>; 2] = [None, None];
            let mut plain_after_clear = 0;
            for step in 0..rng.random_range(1..60u64) {
                let since = step % nstlist;
                if since == 0 {
                    m.search();
                    graphs = [None, None];
                }
                let energy = rng.random_bool(0.2);
                let captured = !energy && rng.random_bool(0.6);
                let what = format!("run {run} (clears halo: {clears_halo}, nstlist {nstlist}) step {step}");
                let z = if captured {
                    let kind = usize::from(since % nstprune == 0);
                    if graphs[kind].is_none() {
                        graphs[kind] = Some(m.host_step(clears_halo, false));
                    }
                    graphs[kind].unwrap_or_default()
                } else {
                    let plain = m.forces_clear && m.halo_clear;
                    let z = m.host_step(clears_halo, energy);
                    if plain {
                        assert_eq!((z.home, z.halo), (false, false), "{what}: a memset after a clearing integration");
                        plain_after_clear += 1;
                    }
                    z
                };
                m.device_step(z, clears_halo, &what);
                if !clears_halo {
                    assert!(z.halo, "{what}: the halo forces of a transport whose peers read them are zeroed every step");
                }
            }
            if !clears_halo {
                assert_eq!(plain_after_clear, 0, "run {run}: never clear without the integration clearing the halo");
            }
        }
    }
}
