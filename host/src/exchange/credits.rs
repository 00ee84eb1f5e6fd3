//! Which pulses need consumption credits: the host half of docs/protocol.md, "Reuse of buffers
//! across steps".
//!
//! A sender may write step `n + 1` into a receiver's buffer only after the receiver has finished
//! reading step `n` there. When the two directions alternate (coordinates, forces, coordinates, ...),
//! each direction's signals are the other's credits. In a loop of one direction, the step's own
//! signals bound a fast sender only for some pulses; the others get an explicit credit: the
//! receiver SETs a slot of the sender's to the step counter once it is done, and the sender waits
//! for it before it writes again (the kernels wait only when the previous launch was the same
//! direction). This module decides, from all ranks' halos, which pulses need one; every rank
//! computes the same flags from the same halos, so the two ends of a pulse agree.
//!
//! Only a pulse that moves at least one atom orders anything: an empty pulse between mapped peers
//! stores no low-latency word and its receiver polls none, so neither end waits for the other.
//! (An empty put or bulk pulse still signals, but which path a pulse takes is not known from the
//! halos alone; counting no empty pulse keeps the rule the same on every rank and only adds a
//! credit wait where an empty pulse would have served.)

use crate::desc::{PulseSpec, RankHalo};
use kernels_gpu::abi::pulse_flags;

/// Whether rank `a`'s coordinates of pulse `p` need a credit from their receiver `b` (`send_rank`).
///
/// Not needed when `a`'s own coordinate launch of step `n` cannot end before `b` has finished with
/// what `a` sent it in step `n`:
/// - every later pulse of `b` that forwards atoms of pulse `p` goes back to `a` (so `a`'s kernel,
///   which waits for all its incoming pulses, ends after `b` packed them), and
/// - `b` sends at least one atom to `a` in some pulse (so `a`'s launch of step `n + 1` ends after
///   `b` started step `n + 1`, i.e. after `b` finished step `n`, including the arrival of `a`'s put
///   of step `n`, whose staging slot `a` reuses in step `n + 2`). A pulse that sends nothing does
///   not count: `a` waits for none of its words (`synchronises`).
pub fn coordinate_credit_needed(halos: &[RankHalo], a: usize, p: usize) -> bool {
    let b = halos[a].pulses[p].send_rank;
    let hb = &halos[b];
    let received = hb.pulses[p].atom_offset..hb.pulses[p].atom_offset + hb.pulses[p].recv_size;
    let forwards_elsewhere =
        hb.pulses[p + 1..].iter().any(|later| later.send_rank != a && later.index_map.iter().any(|&m| received.contains(&(m as usize))));
    let b_signals_a = hb.pulses.iter().any(|q| q.send_rank == a && synchronises(q));
    forwards_elsewhere || !b_signals_a
}

/// Whether a pulse makes its receiver wait for its sender on every path: it moves at least one
/// atom. An empty pulse between mapped peers is no words at all, so it orders nothing.
fn synchronises(pulse: &PulseSpec) -> bool {
    !pulse.index_map.is_empty()
}

/// Whether rank `a`'s forces of pulse `y` need a credit from their owner `b` (`recv_rank`).
///
/// Not needed when `b` pushes forces of at least one atom to `a` in some pulse (`a` sent it
/// coordinates there): then `a`'s force launch of step `n + 1` ends after `b` started step
/// `n + 1`, i.e. after `b` accumulated step `n`; with receive (and staging) slots alternating by
/// step parity, `a` writes the slot of step `n` again only in step `n + 2`. An empty push does not
/// count (`synchronises`).
pub fn force_credit_needed(halos: &[RankHalo], a: usize, y: usize) -> bool {
    let b = halos[a].pulses[y].recv_rank;
    !halos[a].pulses.iter().any(|q| q.send_rank == b && synchronises(q))
}

/// [`pulse_flags`] for every rank and pulse: `WAIT_*` on the writer of a pulse that needs a
/// credit, `SEND_*` on its reader. `halos` must have passed [`super::spec::validate`].
pub fn flags(halos: &[RankHalo]) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = halos.iter().map(|h| vec![0; h.pulses.len()]).collect();
    for (a, h) in halos.iter().enumerate() {
        for (p, pulse) in h.pulses.iter().enumerate() {
            if coordinate_credit_needed(halos, a, p) {
                out[a][p] |= pulse_flags::WAIT_COORD_CREDIT;
                out[pulse.send_rank][p] |= pulse_flags::SEND_COORD_CREDIT;
            }
            if force_credit_needed(halos, a, p) {
                out[a][p] |= pulse_flags::WAIT_FORCE_CREDIT;
                out[pulse.recv_rank][p] |= pulse_flags::SEND_FORCE_CREDIT;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::synthetic::small_halos as shape;
    use pulse_flags::*;

    #[test]
    fn two_ranks_never_need_credits() {
        // Every pulse goes both ways between the same pair: the step's signals bound everything.
        for pulses in 1..=3 {
            assert!(flags(&shape([2, 1, 1], pulses)).iter().flatten().all(|&f| f == 0), "{pulses} pulses");
        }
    }

    #[test]
    fn two_ranks_per_dimension_need_coordinate_credits_only_where_a_pulse_is_forwarded_elsewhere() {
        // 2x2x2, one pulse per dimension: x atoms are forwarded in y and z to other ranks.
        let h = shape([2, 2, 2], 1);
        let f = flags(&h);
        for (r, rank) in f.iter().enumerate() {
            // Forces always come back from the owner (it is also the one this rank sends to).
            assert!(rank.iter().all(|&x| x & (WAIT_FORCE_CREDIT | SEND_FORCE_CREDIT) == 0), "rank {r}: {rank:?}");
            // The last pulse is never forwarded.
            assert_eq!(rank[2] & (WAIT_COORD_CREDIT | SEND_COORD_CREDIT), 0, "rank {r}");
            assert_ne!(rank[0] & WAIT_COORD_CREDIT, 0, "rank {r}: x atoms go on in y and z");
        }
    }

    #[test]
    fn a_ring_of_three_needs_force_credits_and_coordinate_credits_when_forwarding() {
        // One pulse: nothing is forwarded, and the sender does hear from its receiver through
        // nobody: coordinates need a credit (the receiver never signals the sender)...
        let one = flags(&shape([3, 1, 1], 1));
        assert!(one.iter().all(|r| r[0] == WAIT_COORD_CREDIT | SEND_COORD_CREDIT | WAIT_FORCE_CREDIT | SEND_FORCE_CREDIT), "{one:?}");
        let two = flags(&shape([3, 1, 1], 2));
        assert!(two.iter().flatten().all(|&f| f & WAIT_FORCE_CREDIT != 0 && f & WAIT_COORD_CREDIT != 0), "{two:?}");
    }

    #[test]
    fn empty_reverse_pulse() {
        // Rank 0 sends 12 atoms to rank 1; rank 1's pulse back is empty, so no word of it ever
        // reaches rank 0. Coordinates: nothing holds rank 0 back, so it needs rank 1's credit
        // before it rewrites a slot of the pair (without it, it ran two launches ahead and
        // overwrote the slot rank 1 was still polling). Forces: rank 1 pushes 12 and hears
        // nothing back, so it needs rank 0's credit.
        let h = crate::exchange::synthetic::one_way_pair(40, 12);
        crate::exchange::spec::validate(&h).unwrap();
        assert!(coordinate_credit_needed(&h, 0, 0), "rank 1 sends rank 0 nothing");
        assert!(!coordinate_credit_needed(&h, 1, 0), "rank 0's atoms reach rank 1 every step");
        assert!(force_credit_needed(&h, 1, 0), "rank 0 pushes rank 1 no forces");
        assert!(!force_credit_needed(&h, 0, 0));
        let f = flags(&h);
        assert_eq!(f[0][0], WAIT_COORD_CREDIT | SEND_FORCE_CREDIT, "{f:?}");
        assert_eq!(f[1][0], SEND_COORD_CREDIT | WAIT_FORCE_CREDIT, "{f:?}");
        // Both directions empty: nothing is written, nothing needs a credit wait to be correct,
        // and the flags still pair every wait with a send.
        let none = crate::exchange::synthetic::one_way_pair(40, 0);
        let f = flags(&none);
        assert_eq!(f[0][0] & WAIT_COORD_CREDIT != 0, f[1][0] & SEND_COORD_CREDIT != 0);
        assert_eq!(f[1][0] & WAIT_FORCE_CREDIT != 0, f[0][0] & SEND_FORCE_CREDIT != 0);
    }

    #[test]
    fn every_wait_has_a_matching_send_at_the_other_end() {
        for (grid, pulses) in [([2, 1, 1], 2), ([3, 1, 1], 2), ([2, 2, 1], 1), ([4, 1, 1], 3), ([2, 2, 2], 2), ([3, 2, 1], 1)] {
            let h = shape(grid, pulses);
            let f = flags(&h);
            for (a, rank) in h.iter().enumerate() {
                for (p, pulse) in rank.pulses.iter().enumerate() {
                    let wait_x = f[a][p] & WAIT_COORD_CREDIT != 0;
                    assert_eq!(wait_x, f[pulse.send_rank][p] & SEND_COORD_CREDIT != 0 && h[pulse.send_rank].pulses[p].recv_rank == a);
                    let send_f = f[a][p] & SEND_FORCE_CREDIT != 0;
                    assert_eq!(send_f, f[pulse.send_rank][p] & WAIT_FORCE_CREDIT != 0, "{grid:?} rank {a} pulse {p}");
                }
            }
        }
    }
}
