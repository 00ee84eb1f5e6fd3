//! Why a decomposition cannot be built or a plan is inconsistent. Every variant names the rank and
//! pulse concerned and, for user input, the fix.

use super::RankGrid;

/// A decomposition that cannot be built, or a halo plan that fails validation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// The rank grid text or numbers are unusable.
    #[error("invalid rank grid {input:?}: {reason}; write it as AxBxC with positive counts, for example 2x2x1")]
    BadGrid {
        /// What was given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The cutoff is not a positive finite length.
    #[error("invalid cutoff {cutoff}: it must be a positive finite length in nm, for example 1.0")]
    BadCutoff {
        /// The cutoff given.
        cutoff: f32,
    },
    /// The box is not made of positive finite edges.
    #[error("invalid box {box_size:?}: every edge must be a positive finite length in nm")]
    BadBox {
        /// The box given.
        box_size: [f32; 3],
    },
    /// The cutoff reaches half the box, so the minimum image of a pair is no longer unique.
    #[error(
        "the cutoff {cutoff} nm is not below half the box along {dim} ({half:.4} nm): \
         use a cutoff below {half:.4} nm or a larger system (more atoms)"
    )]
    CutoffTooLarge {
        /// The cutoff given.
        cutoff: f32,
        /// The dimension concerned.
        dim: &'static str,
        /// Half the box edge along it.
        half: f64,
    },
    /// A periodic dimension would need as many pulses as it has ranks (an atom would reach its own
    /// rank again). Implied by [`PlanError::CutoffTooLarge`] for uniform cells, checked anyway.
    #[error(
        "{ranks} ranks along {dim} give cells of {cell:.4} nm, so the {cutoff} nm cutoff needs {pulses} \
         pulses, but a periodic dimension needs fewer pulses than ranks: use at most {max_ranks} ranks \
         along {dim}, a smaller cutoff or more atoms"
    )]
    TooManyRanks {
        /// The dimension concerned.
        dim: &'static str,
        /// Ranks along it.
        ranks: usize,
        /// Cell width along it (nm).
        cell: f64,
        /// The cutoff (nm).
        cutoff: f32,
        /// Pulses the cutoff needs.
        pulses: usize,
        /// The largest rank count along `dim` that works.
        max_ranks: usize,
    },
    /// An atom position is NaN or infinite.
    #[error("atom {atom} has a non-finite position {position:?}")]
    NonFinitePosition {
        /// Global atom id.
        atom: usize,
        /// Its position.
        position: [f32; 3],
    },
    /// More atoms than 32-bit local indices can address.
    #[error("{atoms} atoms do not fit the 32-bit atom indices halo uses; use fewer atoms")]
    TooManyAtoms {
        /// The count.
        atoms: usize,
    },
    /// The plan lists a different number of ranks than its grid has.
    #[error("the plan lists {found} ranks but its {grid} grid has {expected}")]
    RankCount {
        /// Ranks listed.
        found: usize,
        /// Ranks in the grid.
        expected: usize,
        /// The grid.
        grid: RankGrid,
    },
    /// A rank entry is out of place.
    #[error("rank entry {position} says it is rank {found}")]
    RankIndex {
        /// Position in the list.
        position: usize,
        /// The rank it names.
        found: usize,
    },
    /// A rank has the wrong number of pulses.
    #[error("rank {rank} has {found} pulses, but the grid, box and cutoff need {expected}")]
    PulseCount {
        /// The rank.
        rank: usize,
        /// Pulses it has.
        found: usize,
        /// Pulses it needs.
        expected: usize,
    },
    /// A pulse has the wrong dimension or index within its dimension.
    #[error(
        "rank {rank} pulse {pulse} is (dim {found_dim}, pulse {found_pulse}) but should be \
         (dim {expected_dim}, pulse {expected_pulse})"
    )]
    PulseOrder {
        /// The rank.
        rank: usize,
        /// Flat pulse index.
        pulse: usize,
        /// Dimension found.
        found_dim: usize,
        /// Pulse-in-dimension found.
        found_pulse: usize,
        /// Dimension expected.
        expected_dim: usize,
        /// Pulse-in-dimension expected.
        expected_pulse: usize,
    },
    /// A send or receive rank is not the neighbour the grid implies.
    #[error("rank {rank} pulse {pulse}: its {role} rank is {found}, but the grid gives {expected}")]
    Neighbour {
        /// The rank.
        rank: usize,
        /// Flat pulse index.
        pulse: usize,
        /// `"send"` or `"receive"`.
        role: &'static str,
        /// The rank the plan names.
        found: usize,
        /// The rank the grid gives.
        expected: usize,
    },
    /// The periodic shift is not what the rank's position implies.
    #[error("rank {rank} pulse {pulse}: shift is {shift:?} but should be {expected:?}")]
    Shift {
        /// The rank.
        rank: usize,
        /// Flat pulse index.
        pulse: usize,
        /// The shift found (`None`: no shift).
        shift: Option<[f32; 3]>,
        /// The shift expected: the box row along the pulse's dimension on the first rank along
        /// it, else `None`.
        expected: Option<[f32; 3]>,
    },
    /// Two neighbours disagree on how many atoms a pulse carries.
    #[error("rank {rank} pulse {pulse} sends {send_size} atoms to rank {peer}, which expects {peer_recv_size}")]
    SizeMismatch {
        /// The sending rank.
        rank: usize,
        /// Flat pulse index.
        pulse: usize,
        /// Atoms sent.
        send_size: usize,
        /// The receiving rank.
        peer: usize,
        /// Atoms it expects.
        peer_recv_size: usize,
    },
    /// The receiving rank does not name the sender as its source.
    #[error("rank {rank} pulse {pulse} sends to rank {peer}, which receives from rank {peer_source}")]
    NotMutual {
        /// The sending rank.
        rank: usize,
        /// Flat pulse index.
        pulse: usize,
        /// The receiving rank.
        peer: usize,
        /// Where the receiving rank receives from.
        peer_source: usize,
    },
    /// `peer_atom_offset` differs from the receiving rank's `atom_offset`.
    #[error("rank {rank} pulse {pulse}: peer_atom_offset is {found}, but rank {peer} places the atoms at {expected}")]
    PeerOffset {
        /// The sending rank.
        rank: usize,
        /// Flat pulse index.
        pulse: usize,
        /// Offset the plan records.
        found: usize,
        /// The receiving rank.
        peer: usize,
        /// Its actual `atom_offset`.
        expected: usize,
    },
    /// Received atoms do not follow the home atoms and earlier pulses without gaps.
    #[error("rank {rank} pulse {pulse}: atom_offset is {found}, but the atoms received so far end at {expected}")]
    Offset {
        /// The rank.
        rank: usize,
        /// Flat pulse index.
        pulse: usize,
        /// Offset found.
        found: usize,
        /// Offset expected.
        expected: usize,
    },
    /// An index map entry names an atom the pulse may not send.
    #[error(
        "rank {rank} pulse {pulse}: index map entry {entry} is atom {index}, outside the atoms this pulse \
         may send [{lo}, {hi})"
    )]
    IndexOutOfRange {
        /// The rank.
        rank: usize,
        /// Flat pulse index.
        pulse: usize,
        /// Position in the map.
        entry: usize,
        /// The local atom index.
        index: u32,
        /// First sendable index.
        lo: usize,
        /// One past the last sendable index.
        hi: usize,
    },
    /// An index map names the same atom twice.
    #[error("rank {rank} pulse {pulse}: the index map sends atom {index} twice")]
    DuplicateIndex {
        /// The rank.
        rank: usize,
        /// Flat pulse index.
        pulse: usize,
        /// The repeated local index.
        index: u32,
    },
    /// A halo copy is not the atom that was sent: the sender's index map names one atom, the
    /// receiver's `global_ids` at the slot it lands in another.
    #[error(
        "rank {rank} pulse {pulse}: index map entry {entry} sends atom {sent_id} (local {index}), but rank {peer} \
         records global id {received_id} at local {slot}, where that entry lands"
    )]
    HaloIdentity {
        /// The sending rank.
        rank: usize,
        /// Flat pulse index.
        pulse: usize,
        /// Position in the sender's index map.
        entry: usize,
        /// The sender's local index of the atom.
        index: u32,
        /// Global id of the atom the sender maps.
        sent_id: u32,
        /// The receiving rank.
        peer: usize,
        /// The receiver's local index the entry lands at (`atom_offset + entry`).
        slot: usize,
        /// Global id the receiver records there.
        received_id: u32,
    },
    /// A rank's atom counts do not add up.
    #[error("rank {rank}: {what} is {found}, expected {expected}")]
    AtomCount {
        /// The rank.
        rank: usize,
        /// Which count.
        what: &'static str,
        /// Value found.
        found: usize,
        /// Value expected.
        expected: usize,
    },
    /// A redecomposition read the position of a local atom whose position the host does not
    /// hold (its home atoms' positions stayed on the device): a defect of halo, not of its input.
    #[error(
        "rank {rank}: local atom {local}'s position was read, but the host holds those of local atoms {from}..{to} only \
         (the home atoms' positions stayed on the GPU); this is a defect in halo, please report it"
    )]
    PositionNotHeld {
        /// The rank.
        rank: usize,
        /// The local atom.
        local: usize,
        /// The first local atom whose position the host holds.
        from: usize,
        /// One past the last.
        to: usize,
    },
    /// A global atom id is out of range for the system.
    #[error("rank {rank}: local atom {local} has global id {id}, but the system has {atoms} atoms")]
    GlobalId {
        /// The rank.
        rank: usize,
        /// Local index.
        local: usize,
        /// The id.
        id: u32,
        /// Atoms in the system.
        atoms: usize,
    },
    /// An atom is home on no rank or on several.
    #[error("atom {atom} is a home atom on {count} ranks instead of exactly one")]
    HomeCount {
        /// Global atom id.
        atom: usize,
        /// Ranks that hold it as a home atom.
        count: usize,
    },
    /// A rank's home atoms are not in ascending id order (a redecomposition's output always is).
    #[error("rank {rank}: home atom {local} has global id {id}, after {previous}: a rank's home atoms come in ascending id order")]
    HomeOrder {
        /// The rank.
        rank: usize,
        /// Its index among the rank's home atoms.
        local: usize,
        /// The id.
        id: u32,
        /// The id before it.
        previous: u32,
    },
    /// The ranks' home atoms are as many as the system's, but not each of them once: their ids'
    /// checksums differ.
    #[error("the ranks' home atoms are {atoms}, as many as the system's, but not each of its atoms once: one is on two ranks and another on none")]
    HomeSet {
        /// Atoms in the system.
        atoms: usize,
    },
    /// A rank's home arrays (ids, positions, velocities) differ in length.
    #[error("rank {rank}: its home atoms have {ids} ids, {positions} positions and {velocities} velocities; give one of each per atom")]
    HomeArrays {
        /// The rank.
        rank: usize,
        /// Ids given.
        ids: usize,
        /// Positions given.
        positions: usize,
        /// Velocities given.
        velocities: usize,
    },
    /// The home atoms of all ranks together are not the system's atoms.
    #[error("the ranks hold {found} home atoms together, but the system has {expected}: an atom was lost or duplicated")]
    HomeTotal {
        /// Home atoms over all ranks.
        found: usize,
        /// Atoms in the system.
        expected: usize,
    },
    /// The ranks a process drives do not fit the grid or the data given for them.
    #[error("local ranks {ranks:?}: {reason}")]
    LocalRanks {
        /// The ranks given.
        ranks: Vec<usize>,
        /// What is wrong.
        reason: String,
    },
    /// A rank's contribution to a collective of the redecomposition is malformed.
    #[error("the bytes rank {rank} gave to `{tag}` are malformed: {reason}")]
    Blob {
        /// The collective.
        tag: String,
        /// The rank whose bytes they are.
        rank: usize,
        /// What is wrong.
        reason: String,
    },
    /// A collective of the redecomposition gave a blob count other than the rank count.
    #[error("the collective `{tag}` gave {found} blobs for {expected} ranks: it must give one per rank, indexed by rank")]
    GatherCount {
        /// The collective.
        tag: String,
        /// Blobs it gave.
        found: usize,
        /// Ranks in the grid.
        expected: usize,
    },
    /// A grid with more ranks along a dimension than the GPU migration's geometry holds.
    #[error(
        "the GPU migration takes at most {max} ranks along {dim}, the grid has {ranks}: use fewer ranks along {dim}, or the host's redecomposition"
    )]
    GpuMigrateGrid {
        /// The dimension concerned.
        dim: &'static str,
        /// Ranks along it.
        ranks: usize,
        /// The most the GPU migration takes.
        max: usize,
    },
    /// The ids a GPU merge of a rank's arrivals into its stayers relies on are out of order: the
    /// merged home atoms are unusable.
    #[error(
        "rank {rank}: the GPU merge of {arrivals} arrivals into {stayers} stayers needs ids that ascend strictly and are held once, but {}; redecompose this step on the host (decomp::redecompose), which takes the home atoms in any order",
        merge_order_problem(*.stayers_unordered, *.arrivals_unordered, *.repeated)
    )]
    GpuMergeOrder {
        /// The rank.
        rank: usize,
        /// Stayers merged.
        stayers: usize,
        /// Arrivals merged.
        arrivals: usize,
        /// The stayers' ids do not ascend strictly (the home atoms did not come from the last
        /// plan, or an id repeats among them).
        stayers_unordered: bool,
        /// An id repeats among the arrivals (sorted by id before the merge).
        arrivals_unordered: bool,
        /// An arrival's id is also a stayer's.
        repeated: bool,
    },
    /// An atom appears twice in one rank's local array.
    #[error("rank {rank} holds atom {atom} twice")]
    DuplicateAtom {
        /// The rank.
        rank: usize,
        /// Global atom id.
        atom: u32,
    },
}

/// What [`PlanError::GpuMergeOrder`] found, in words.
fn merge_order_problem(stayers_unordered: bool, arrivals_unordered: bool, repeated: bool) -> String {
    let found: Vec<&str> = [
        (stayers_unordered, "the stayers' ids do not ascend strictly (home atoms not in the last plan's order)"),
        (arrivals_unordered, "an arrival's id repeats"),
        (repeated, "an arrival's id is also a stayer's"),
    ]
    .into_iter()
    .filter_map(|(set, what)| set.then_some(what))
    .collect();
    if found.is_empty() { "no problem was named".to_string() } else { found.join(", and ") }
}
