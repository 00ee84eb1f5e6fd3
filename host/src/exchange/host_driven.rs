//! The host-driven transports: what GROMACS runs when the GPU does not drive the exchange.
//!
//! - [`Transport::Staged`]: GROMACS's GPU-aware MPI path (`communicateHaloDataGpuAwareMpi`):
//!   per pulse a pack kernel, one host synchronisation of the halo stream, then the transfer —
//!   a copy into the receiver's memory (peer pointer, or the `nvshmem_ptr` mapping between
//!   processes) whose completion the sender waits for on the host, as an MPI library does inside
//!   `MPI_Send`/`MPI_Wait` — and completion told point to point (in one process the driving thread
//!   knows; between processes a ready-to-receive and a done message through the [`Mailbox`](super::mailbox::Mailbox), like an
//!   MPI library's shared-memory control messages: no global barrier). Forces: last pulse first, a
//!   host sync of the halo stream (the halo forces are ready), the copy into the owner's receive
//!   slot and its completion, then the unpack-accumulate kernel, launched with no sync after it.
//!   Two host synchronisations per pulse and direction per rank (the blog's 12 per step for a 3-D
//!   decomposition with one pulse per dimension).
//! - [`Transport::DirectCopy`]: GROMACS's direct GPU communication under thread-MPI
//!   (`communicateHaloDataPeerToPeer`): pack kernel, a stream-ordered `cuMemcpyAsync` into the
//!   neighbour's halo, an event recorded after the copy and waited on by the receiver's stream
//!   (`cuStreamWaitEvent`); no host synchronisation. Once per step, before the first copy, the
//!   stream waits for the receiver's "coordinates ready" event (GROMACS's
//!   `enqueueWaitRemoteCoordinatesReadyEvent`: here the event recorded where the receiver's forward
//!   exchange starts). Forces: last pulse first, the holder copies its halo forces into the
//!   owner's receive slot (two slots per pulse, by step parity), records, the owner's stream waits
//!   and runs the accumulate kernel.
//!
//! # Cross-process events (direct-copy between PEs)
//!
//! Between processes the events are CUDA IPC events (`CU_EVENT_INTERPROCESS |
//! CU_EVENT_DISABLE_TIMING`, handles exchanged at set-up: [`super::pe_links`]). `cuStreamWaitEvent`
//! waits for the event's most recent record *at the time of the call*, so a receiver must not call
//! it before the sender recorded this step's copy, and the sender must not record again before the
//! receiver's call. GROMACS's thread-MPI path has the same need and meets it with a host handshake
//! per pulse (`MPI_Sendrecv` of the event pointers after the record). halo does the same through
//! the node's shared-memory [`Mailbox`](super::mailbox::Mailbox): the owner records, then posts the step number; the waiter
//! spins until it sees it, calls `cuStreamWaitEvent`, and posts an acknowledgement; each channel has
//! two events used by step parity, and the owner re-records one only after every waiter
//! acknowledged its previous record. The cost is host-side only (a cache line between two cores
//! per pulse, off the GPU's critical path while the host runs ahead of the GPU); the GPU's wait is
//! the driver's cross-process event wait, as in GROMACS.
//!
//! # Reuse of buffers across steps
//!
//! In steps that alternate directions (every MD step), the data events order everything: a rank
//! writes a neighbour's coordinates of step `n + 1` after its own force halo of step `n`, which
//! waited for that neighbour's force copy of step `n`, recorded after every read of the
//! neighbour's halo. In loops of one direction (a benchmark's coordinate-only loop, the stencil):
//! coordinates wait for the start event of every rank they write into (the receiver's forward
//! exchange of this step starts after its previous one finished reading), forces use the
//! parity slots and, where [`super::credits::force_credit_needed`] says the step's own events do
//! not bound a fast holder, wait for the owner's reverse-start event. In one process all of this
//! is ordered by the single driving thread, which records every event of a pulse before any wait
//! on it and waits on a step's records before recording the next.

use super::credits;
use super::rank::{PeerView, RankExchange};
use crate::desc::{Element, Transport};
use crate::desc::{PulseSpec, RankHalo};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaEvent, CudaStream};
use std::sync::Arc;
use std::time::Duration;

/// The two directions of an exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Coordinates (gather chain).
    Forward,
    /// Forces (scatter chain, accumulated).
    Reverse,
}

/// One kind of host-driven synchronisation between two ranks: an event (recorded by its owner,
/// waited on by other ranks' streams) or a host message (staged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// Direct-copy: the coordinates of this pulse were copied into the receiver (event).
    XData(usize),
    /// Direct-copy: the forces of this pulse were copied into the owner's slot (event).
    FData(usize),
    /// Direct-copy: the owner's forward exchange of this step starts (event).
    XStart,
    /// Direct-copy: the owner's reverse exchange of this step starts (event).
    FStart,
    /// Staged: the receiver may be written the coordinates of this pulse (message).
    XReady(usize),
    /// Staged: the coordinates of this pulse landed in the receiver (message).
    XDone(usize),
    /// Staged: the owner's receive slot of this pulse may be written (message).
    FReady(usize),
    /// Staged: the forces of this pulse landed in the owner's slot (message).
    FDone(usize),
}

impl Channel {
    /// Events per rank for `pulses` pulses.
    pub fn events(pulses: usize) -> usize {
        2 * pulses + 2
    }

    /// Mailbox words per writer for `pulses` pulses: a record and an acknowledgement per event,
    /// four messages per pulse.
    pub fn slots(pulses: usize) -> usize {
        2 * Self::events(pulses) + 4 * pulses
    }

    /// The event of this channel (`None` for messages).
    pub fn event_index(self, pulses: usize) -> Option<usize> {
        match self {
            Channel::XData(p) => Some(p),
            Channel::FData(p) => Some(pulses + p),
            Channel::XStart => Some(2 * pulses),
            Channel::FStart => Some(2 * pulses + 1),
            _ => None,
        }
    }

    /// The word a post of this channel goes to (the record of an event, or the message).
    pub fn post_slot(self, pulses: usize) -> usize {
        let base = 2 * Self::events(pulses);
        match self {
            Channel::XReady(p) => base + 4 * p,
            Channel::XDone(p) => base + 4 * p + 1,
            Channel::FReady(p) => base + 4 * p + 2,
            Channel::FDone(p) => base + 4 * p + 3,
            event => event.event_index(pulses).unwrap_or(0),
        }
    }

    /// The word a waiter acknowledges an event's record in (events only).
    pub fn ack_slot(self, pulses: usize) -> Option<usize> {
        self.event_index(pulses).map(|e| Self::events(pulses) + e)
    }

    /// What this channel's post at step `seq` means, for error messages.
    pub fn describe(self, seq: u64) -> String {
        match self {
            Channel::XData(p) => format!("record the copy of pulse {p}'s coordinates of step {seq}"),
            Channel::FData(p) => format!("record the copy of pulse {p}'s forces of step {seq}"),
            Channel::XStart => format!("start its coordinate halo of step {seq}"),
            Channel::FStart => format!("start its force halo of step {seq}"),
            Channel::XReady(p) => format!("be ready for pulse {p}'s coordinates of step {seq}"),
            Channel::XDone(p) => format!("deliver pulse {p}'s coordinates of step {seq}"),
            Channel::FReady(p) => format!("be ready for pulse {p}'s forces of step {seq}"),
            Channel::FDone(p) => format!("deliver pulse {p}'s forces of step {seq}"),
        }
    }
}

/// How the host-driven transports reach and synchronise with the other ranks: plain events and
/// pointers in one process ([`LocalLinks`]), IPC events, `nvshmem_ptr` and a [`Mailbox`](super::mailbox::Mailbox) across
/// PEs (`super::pe_links::PeLinks`). `rank` is always the global rank of a rank this process drives.
pub trait Links {
    /// Rank `peer`'s buffers, addressable from this process.
    fn view(&self, peer: usize) -> Result<PeerView>;
    /// Records `rank`'s event of `ch` for step `seq` on `stream`, for `waiters` to wait on.
    fn record(&mut self, rank: usize, ch: Channel, seq: u64, stream: &CudaStream, waiters: &[usize], timeout: Duration) -> Result<()>;
    /// Makes `stream` (of `rank`) wait for `owner`'s record of `ch` at step `seq`.
    fn wait_event(&mut self, rank: usize, owner: usize, ch: Channel, seq: u64, stream: &CudaStream, timeout: Duration) -> Result<()>;
    /// Tells `to` (host message) that `rank` reached `seq` on `ch`.
    fn post(&self, rank: usize, to: usize, ch: Channel, seq: u64) -> Result<()>;
    /// Waits on the host until `from` posted `ch` at step `seq` or later.
    fn wait_post(&self, rank: usize, from: usize, ch: Channel, seq: u64, timeout: Duration) -> Result<()>;
}

/// Every rank in this process: peers are plain device pointers, events are shared directly, and
/// the single driving thread orders records before waits, so messages need no transport.
pub struct LocalLinks {
    views: Vec<PeerView>,
    events: Vec<Vec<CudaEvent>>,
}

impl LocalLinks {
    /// Events (timing off) for every rank's channels, in the rank's context.
    pub fn new<T: Element>(ranks: &[RankExchange<T>]) -> Result<Self> {
        let views = ranks.iter().map(RankExchange::local_view).collect();
        let events = ranks
            .iter()
            .map(|r| (0..Channel::events(r.halo().pulses.len())).map(|_| r.context().new_event(None).during("creating a halo event")).collect())
            .collect::<Result<_>>()?;
        Ok(Self { views, events })
    }

    fn event(&self, rank: usize, ch: Channel) -> Result<&CudaEvent> {
        let pulses = self.events[rank].len().saturating_sub(2) / 2;
        ch.event_index(pulses).and_then(|i| self.events[rank].get(i)).ok_or_else(|| HaloError::InvalidInput(format!("{ch:?} is not an event")))
    }
}

impl Links for LocalLinks {
    fn view(&self, peer: usize) -> Result<PeerView> {
        self.views.get(peer).copied().ok_or_else(|| HaloError::InvalidInput(format!("no rank {peer}")))
    }
    fn record(&mut self, rank: usize, ch: Channel, _: u64, stream: &CudaStream, _: &[usize], _: Duration) -> Result<()> {
        self.event(rank, ch)?.record(stream).during("recording a halo event")
    }
    fn wait_event(&mut self, _: usize, owner: usize, ch: Channel, _: u64, stream: &CudaStream, _: Duration) -> Result<()> {
        stream.wait(self.event(owner, ch)?).during("waiting for a peer's halo event")
    }
    fn post(&self, _: usize, _: usize, _: Channel, _: u64) -> Result<()> {
        Ok(())
    }
    fn wait_post(&self, _: usize, _: usize, _: Channel, _: u64, _: Duration) -> Result<()> {
        Ok(())
    }
}

/// Who waits for whom, computed once from every rank's halo (the same on every PE). Index 0 of a
/// `[_; 2]` is for steps that follow the other direction, index 1 for loops of one direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPlan {
    /// `x_waiters[r][mode]`: the ranks whose streams wait for `r`'s forward-start event.
    pub x_waiters: Vec<[Vec<usize>; 2]>,
    /// `x_credit[r][mode][p]`: whose forward-start events `r` waits for before copying pulse `p`.
    pub x_credit: Vec<[Vec<Vec<usize>>; 2]>,
    /// `f_waiters[r]`: the ranks waiting for `r`'s reverse-start event in force-only loops.
    pub f_waiters: Vec<Vec<usize>>,
    /// `f_credit[r][p]`: whose reverse-start events `r` waits for before copying pulse `p`'s
    /// forces, in force-only loops.
    pub f_credit: Vec<Vec<Vec<usize>>>,
}

impl HostPlan {
    /// The plan of `halos` (validated).
    pub fn new(halos: &[RankHalo]) -> Self {
        let n = halos.len();
        let mut x_credit: Vec<[Vec<Vec<usize>>; 2]> = Vec::with_capacity(n);
        let mut f_credit: Vec<Vec<Vec<usize>>> = Vec::with_capacity(n);
        for (r, h) in halos.iter().enumerate() {
            let pulses = h.pulses.len();
            // After the other direction: as GROMACS, once per step before the first copy, the
            // receiver of pulse 0.
            let mut alternating = vec![Vec::new(); pulses];
            if let Some(first) = h.pulses.first() {
                alternating[0].push(first.send_rank);
            }
            // One direction: every receiver, before the first copy into it.
            let mut one_dir = vec![Vec::new(); pulses];
            let mut seen = Vec::new();
            for (p, spec) in h.pulses.iter().enumerate() {
                if !seen.contains(&spec.send_rank) {
                    seen.push(spec.send_rank);
                    one_dir[p].push(spec.send_rank);
                }
            }
            x_credit.push([alternating, one_dir]);
            // Forces, last pulse first: the owners whose credit the step's own events do not give.
            let mut forces = vec![Vec::new(); pulses];
            let mut seen = Vec::new();
            for p in (0..pulses).rev() {
                let owner = h.pulses[p].recv_rank;
                if credits::force_credit_needed(halos, r, p) && !seen.contains(&owner) {
                    seen.push(owner);
                    forces[p].push(owner);
                }
            }
            f_credit.push(forces);
        }
        let waiters_of =
            |owner: usize, lists: &dyn Fn(usize) -> Vec<usize>| -> Vec<usize> { (0..n).filter(|&w| lists(w).contains(&owner)).collect() };
        let x_waiters = (0..n).map(|r| [0, 1].map(|mode| waiters_of(r, &|w| x_credit[w][mode].iter().flatten().copied().collect()))).collect();
        let f_waiters = (0..n).map(|r| waiters_of(r, &|w| f_credit[w].iter().flatten().copied().collect())).collect();
        Self { x_waiters, x_credit, f_waiters, f_credit }
    }
}

/// The host-driven transports' state of one exchange: the plan, the step counters of each
/// direction (host-side; every rank calls every direction every step, so they agree), and the
/// direction of the previous exchange call.
pub struct HostDriven {
    plan: HostPlan,
    x_seq: u64,
    f_seq: u64,
    last: Option<Direction>,
}

impl HostDriven {
    /// The state for `halos` (every rank's).
    pub fn new(halos: &[RankHalo]) -> Self {
        Self { plan: HostPlan::new(halos), x_seq: 0, f_seq: 0, last: None }
    }

    /// Notes an exchange call of a GPU-initiated transport (for the one-direction rules).
    pub fn note(&mut self, direction: Direction) {
        self.last = Some(direction);
    }

    /// Back to step 0 (with the links' own reset, collectively).
    pub fn reset(&mut self) {
        (self.x_seq, self.f_seq, self.last) = (0, 0, None);
    }

    /// Follows a replan to `halos` (every rank's new halos, the same pulse count): a new plan of
    /// who waits for whom, with the step counters going on, as the links' records and messages do.
    pub fn replan(&mut self, halos: &[RankHalo]) {
        self.plan = HostPlan::new(halos);
    }

    /// Runs one direction of a host-driven `transport` on the ranks this process drives, each on
    /// its stream. Returns the host synchronisations it made (one per stream waited for, each a
    /// bounded wait: [`RankExchange::wait_idle`]).
    pub fn run<T: Element>(
        &mut self,
        transport: Transport,
        direction: Direction,
        ranks: &mut [RankExchange<T>],
        streams: &[Arc<CudaStream>],
        links: &mut dyn Links,
    ) -> Result<u64> {
        let one_dir = self.last == Some(direction);
        self.last = Some(direction);
        let seq = match direction {
            Direction::Forward => {
                self.x_seq += 1;
                self.x_seq
            }
            Direction::Reverse => {
                self.f_seq += 1;
                self.f_seq
            }
        };
        let mut step = Step { plan: &self.plan, seq, one_dir, ranks, streams };
        match (transport, direction) {
            (Transport::Staged, Direction::Forward) => step.staged_forward(links),
            (Transport::Staged, Direction::Reverse) => step.staged_reverse(links),
            (Transport::DirectCopy, Direction::Forward) => step.direct_forward(links).map(|()| 0),
            (Transport::DirectCopy, Direction::Reverse) => step.direct_reverse(links).map(|()| 0),
            (t, _) => Err(HaloError::InvalidInput(format!("the {} transport is not host-driven", t.name()))),
        }
    }
}

/// One direction of one step.
struct Step<'a, T: Element> {
    plan: &'a HostPlan,
    seq: u64,
    one_dir: bool,
    ranks: &'a mut [RankExchange<T>],
    streams: &'a [Arc<CudaStream>],
}

impl<T: Element> Step<'_, T> {
    /// Calls `f` for every local rank with its stream, its context current.
    fn each(&mut self, mut f: impl FnMut(&mut RankExchange<T>, &Arc<CudaStream>, Duration) -> Result<()>) -> Result<()> {
        for (rank, stream) in self.ranks.iter_mut().zip(self.streams) {
            rank.context().bind_to_thread().during("binding a rank's context")?;
            let timeout = rank.wait_timeout();
            f(rank, stream, timeout)?;
        }
        Ok(())
    }

    fn pulses(&self) -> usize {
        self.ranks.first().map_or(0, |r| r.halo().pulses.len())
    }

    /// The staged path's host wait for a rank's halo stream: bounded (no progress for the host
    /// wait budget is an error naming the rank), never an unbounded synchronize.
    fn sync(rank: &mut RankExchange<T>, stream: &CudaStream, syncs: &mut u64) -> Result<()> {
        rank.wait_idle(stream, "waiting for the staged transport's halo stream", None, || None)?;
        *syncs += 1;
        Ok(())
    }

    /// On every rank: a bounded wait for its stream when `busy_to` says pulse `p` moves anything
    /// there, then `ch` posted to the peer `busy_to` names.
    fn sync_and_post(
        &mut self,
        links: &mut dyn Links,
        syncs: &mut u64,
        p: usize,
        ch: Channel,
        busy_to: impl Fn(&PulseSpec) -> (bool, usize),
    ) -> Result<()> {
        let seq = self.seq;
        self.each(|rank, s, _| {
            let (busy, to) = busy_to(&rank.halo().pulses[p]);
            if busy {
                Self::sync(rank, s, syncs)?;
            }
            links.post(rank.rank(), to, ch, seq)
        })
    }

    fn staged_forward(&mut self, links: &mut dyn Links) -> Result<u64> {
        let (seq, mut syncs) = (self.seq, 0);
        for p in 0..self.pulses() {
            self.each(|rank, s, _| rank.stage_pack(p, s))?;
            // The pack is done (and every earlier reader of the halo this pulse fills): ready.
            self.sync_and_post(links, &mut syncs, p, Channel::XReady(p), |spec| (!spec.index_map.is_empty() || spec.recv_size > 0, spec.recv_rank))?;
            self.each(|rank, s, t| {
                let spec = &rank.halo().pulses[p];
                if spec.index_map.is_empty() {
                    return Ok(());
                }
                links.wait_post(rank.rank(), spec.send_rank, Channel::XReady(p), seq, t)?;
                rank.stage_copy_to(p, links.view(spec.send_rank)?, s)
            })?;
            // The transfer's completion (an MPI library waits for its copy the same way), then done.
            self.sync_and_post(links, &mut syncs, p, Channel::XDone(p), |spec| (!spec.index_map.is_empty(), spec.send_rank))?;
            self.each(|rank, _, t| links.wait_post(rank.rank(), rank.halo().pulses[p].recv_rank, Channel::XDone(p), seq, t))?;
        }
        Ok(syncs)
    }

    fn staged_reverse(&mut self, links: &mut dyn Links) -> Result<u64> {
        let (seq, mut syncs) = (self.seq, 0);
        for p in (0..self.pulses()).rev() {
            // The halo forces are ready and the previous unpack of this slot is done: ready.
            self.sync_and_post(links, &mut syncs, p, Channel::FReady(p), |spec| (spec.recv_size > 0 || !spec.index_map.is_empty(), spec.send_rank))?;
            self.each(|rank, s, t| {
                let spec = &rank.halo().pulses[p];
                if spec.recv_size == 0 {
                    return Ok(());
                }
                links.wait_post(rank.rank(), spec.recv_rank, Channel::FReady(p), seq, t)?;
                let slot = links.view(spec.recv_rank)?.recv_buf + rank.recv_slot_offset(p, 0);
                rank.stage_forces_to(p, slot, s)
            })?;
            self.sync_and_post(links, &mut syncs, p, Channel::FDone(p), |spec| (spec.recv_size > 0, spec.recv_rank))?;
            // Unpack without a sync after it: the next pulse's (or step's) first sync covers it.
            self.each(|rank, s, t| {
                let spec = &rank.halo().pulses[p];
                links.wait_post(rank.rank(), spec.send_rank, Channel::FDone(p), seq, t)?;
                if spec.index_map.is_empty() { Ok(()) } else { rank.stage_unpack_forces_at(p, 0, s) }
            })?;
        }
        Ok(syncs)
    }

    fn direct_forward(&mut self, links: &mut dyn Links) -> Result<()> {
        let (seq, mode, plan) = (self.seq, self.one_dir as usize, self.plan);
        self.each(|rank, s, t| {
            let waiters = &plan.x_waiters[rank.rank()][mode];
            if waiters.is_empty() { Ok(()) } else { links.record(rank.rank(), Channel::XStart, seq, s, waiters, t) }
        })?;
        for p in 0..self.pulses() {
            self.each(|rank, s, _| rank.stage_pack(p, s))?;
            self.each(|rank, s, t| {
                let r = rank.rank();
                for &owner in &plan.x_credit[r][mode][p] {
                    links.wait_event(r, owner, Channel::XStart, seq, s, t)?;
                }
                let to = rank.halo().pulses[p].send_rank;
                rank.stage_copy_to(p, links.view(to)?, s)?;
                links.record(r, Channel::XData(p), seq, s, &[to], t)
            })?;
            self.each(|rank, s, t| links.wait_event(rank.rank(), rank.halo().pulses[p].recv_rank, Channel::XData(p), seq, s, t))?;
        }
        Ok(())
    }

    fn direct_reverse(&mut self, links: &mut dyn Links) -> Result<()> {
        let (seq, one_dir, plan) = (self.seq, self.one_dir, self.plan);
        let parity = (seq & 1) as usize;
        if one_dir {
            self.each(|rank, s, t| {
                let waiters = &plan.f_waiters[rank.rank()];
                if waiters.is_empty() { Ok(()) } else { links.record(rank.rank(), Channel::FStart, seq, s, waiters, t) }
            })?;
        }
        for p in (0..self.pulses()).rev() {
            self.each(|rank, s, t| {
                let r = rank.rank();
                if one_dir {
                    for &owner in &plan.f_credit[r][p] {
                        links.wait_event(r, owner, Channel::FStart, seq, s, t)?;
                    }
                }
                let owner = rank.halo().pulses[p].recv_rank;
                if rank.halo().pulses[p].recv_size > 0 {
                    let slot = links.view(owner)?.recv_buf + rank.recv_slot_offset(p, parity);
                    rank.stage_forces_to(p, slot, s)?;
                }
                links.record(r, Channel::FData(p), seq, s, &[owner], t)
            })?;
            self.each(|rank, s, t| {
                let spec = &rank.halo().pulses[p];
                links.wait_event(rank.rank(), spec.send_rank, Channel::FData(p), seq, s, t)?;
                if spec.index_map.is_empty() { Ok(()) } else { rank.stage_unpack_forces_at(p, parity, s) }
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::synthetic::small_halos as halos;

    #[test]
    fn channel_slots_are_distinct_and_in_range() {
        for pulses in 0..4 {
            let mut chans = vec![Channel::XStart, Channel::FStart];
            for p in 0..pulses {
                chans.extend([Channel::XData(p), Channel::FData(p), Channel::XReady(p), Channel::XDone(p), Channel::FReady(p), Channel::FDone(p)]);
            }
            let mut words: Vec<usize> = chans.iter().map(|c| c.post_slot(pulses)).collect();
            words.extend(chans.iter().filter_map(|c| c.ack_slot(pulses)));
            let n = words.len();
            words.sort_unstable();
            words.dedup();
            assert_eq!(words.len(), n, "{pulses} pulses: two channels share a word");
            assert!(words.iter().all(|&w| w < Channel::slots(pulses)), "{pulses} pulses: {words:?}");
            let events: Vec<usize> = chans.iter().filter_map(|c| c.event_index(pulses)).collect();
            assert_eq!(events.len(), Channel::events(pulses));
            assert!(events.iter().all(|&e| e < Channel::events(pulses)));
        }
    }

    #[test]
    fn two_ranks_wait_once_per_step_like_gromacs_and_need_no_force_credits() {
        for pulses in 1..=2 {
            let plan = HostPlan::new(&halos([2, 1, 1], pulses));
            for r in 0..2 {
                // GROMACS: before the first copy, the receiver's "coordinates ready" event.
                assert_eq!(plan.x_credit[r][0][0], vec![1 - r]);
                assert!(plan.x_credit[r][0][1..].iter().all(Vec::is_empty));
                assert_eq!(plan.x_credit[r][1].iter().flatten().count(), 1, "one receiver, waited for once");
                assert_eq!(plan.x_waiters[r], [vec![1 - r], vec![1 - r]]);
                // Forces come back from every owner: the step's events bound a fast holder.
                assert!(plan.f_credit[r].iter().all(Vec::is_empty) && plan.f_waiters[r].is_empty(), "{plan:?}");
            }
        }
    }

    #[test]
    fn every_wait_has_its_owner_s_waiter_entry() {
        for (grid, pulses) in [([2, 1, 1], 2), ([3, 1, 1], 2), ([2, 2, 1], 1), ([4, 1, 1], 3), ([2, 2, 2], 2), ([3, 2, 1], 1)] {
            let h = halos(grid, pulses);
            let plan = HostPlan::new(&h);
            for mode in 0..2 {
                for (owner, waiters) in plan.x_waiters.iter().enumerate() {
                    let want: Vec<usize> = (0..h.len()).filter(|&w| plan.x_credit[w][mode].iter().flatten().any(|&o| o == owner)).collect();
                    assert_eq!(waiters[mode], want, "{grid:?} mode {mode} owner {owner}");
                }
            }
            for (owner, waiters) in plan.f_waiters.iter().enumerate() {
                let want: Vec<usize> = (0..h.len()).filter(|&w| plan.f_credit[w].iter().flatten().any(|&o| o == owner)).collect();
                assert_eq!(*waiters, want, "{grid:?} forces, owner {owner}");
            }
            for (r, rank) in plan.x_credit.iter().enumerate() {
                // Each receiver is waited for once per step, before the first copy into it.
                let all: Vec<usize> = rank[1].iter().flatten().copied().collect();
                let mut dedup = all.clone();
                dedup.sort_unstable();
                dedup.dedup();
                assert_eq!(all.len(), dedup.len(), "{grid:?} rank {r}");
                for (p, owners) in rank[1].iter().enumerate() {
                    for &o in owners {
                        assert_eq!(h[r].pulses[p].send_rank, o, "{grid:?} rank {r} pulse {p}");
                        assert!(h[r].pulses[..p].iter().all(|q| q.send_rank != o), "{grid:?}: waited before the first copy");
                    }
                }
            }
        }
    }

    #[test]
    fn a_ring_of_three_needs_force_credits_in_force_only_loops() {
        let h = halos([3, 1, 1], 1);
        let plan = HostPlan::new(&h);
        for (r, rank) in h.iter().enumerate() {
            let owner = rank.pulses[0].recv_rank;
            assert_ne!(owner, rank.pulses[0].send_rank, "a ring of three");
            assert_eq!(plan.f_credit[r][0], vec![owner], "{plan:?}");
            assert_eq!(plan.f_waiters[owner], vec![r]);
        }
    }
}
