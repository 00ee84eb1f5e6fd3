//! One rank's atoms as the pair search sees them, in the exchange's order: home atoms `[0, home)`,
//! then each pulse's received atoms. Positions are in the rank's frame (what the coordinate halo
//! delivers: a halo atom that crossed the periodic boundary along a decomposed dimension carries
//! the box edge added in `f32`), and every atom has a zone: bit `d` set when the atom lies above
//! this rank's cell along decomposed dimension `d`. Home atoms are zone 0.
//!
//! The zone decides which rank computes a pair: a rank computes a pair of its local atoms when
//! their zones share no bit (`za & zb == 0`). Along a dimension where both atoms are above the
//! rank's cell, the rank below owns the pair; where at most one is, the other lies in this rank's
//! cell and is the lower atom of the pair, which is the componentwise-lowest-cell rule of
//! `md_reference::assign_pairs` (see `docs/nbnxm.md`). Zones are integers from the plan's cells,
//! so no rounding can make two ranks disagree.

use super::grid::BBox;
use super::{DIMS, NbnxmError};
use crate::abi::Float3;
use crate::decomp::{HaloPlan, PlanError, Scan, scan, wrap_position, wrap_positions};
use crate::desc::first_at_or_above;
use crate::workers::Workers;

/// One rank's atoms for the pair search (see the module docs). The default holds no atom: a
/// buffer for [`Self::from_plan_into`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocalAtoms {
    /// Coordinates in the rank's frame, home atoms first (nm).
    pub positions: Vec<Float3>,
    /// Atom type of each atom.
    pub types: Vec<u32>,
    /// Zone of each atom (0 for home atoms).
    pub zones: Vec<u8>,
    /// Home atoms: `[0, home)`.
    pub home: usize,
    /// Box edges (nm).
    pub box_size: [f32; 3],
    /// Dimensions the rank spans whole (not decomposed): pairs across the periodic boundary there
    /// are found through shifted images, and positions must lie in `[0, edge)`.
    pub periodic: [bool; 3],
    /// Number of atom types (every type is below it).
    pub ntypes: usize,
    /// The first atom whose type `types` holds: 0, or `home` where the home atoms' types are
    /// made on the GPU from their ids and never gathered on the host (a search whose grid is
    /// built there: [`crate::search::HostSearch::rank_searches_redecomposed`]);
    /// `types[..types_from]` is then unspecified. Only a GPU grid that looks those types up takes
    /// such atoms; the host's grid refuses them ([`NbnxmError::TypesOnGpu`]).
    pub types_from: usize,
    /// The first atom whose position `positions` holds: 0, or `home` where the home atoms'
    /// positions stayed on the GPU that redecomposed them (a search whose grid is built there);
    /// `positions[..positions_from]` is then unspecified (left from an earlier search), and the
    /// home atoms' extent came from the GPU, exact. Only a GPU grid that copies the home
    /// coordinates on the device takes such atoms; the host's grid refuses them
    /// ([`NbnxmError::PositionsOnGpu`]).
    pub positions_from: usize,
}

impl LocalAtoms {
    /// Rank `rank`'s atoms of `plan`, from the global (unwrapped or wrapped) positions and types.
    /// Positions are wrapped and, for halo atoms that crossed the periodic boundary along a
    /// decomposed dimension, moved by the box edge in `f32`, exactly as the exchange moves them:
    /// the result equals `exchange::reference::coordinates` bit for bit.
    pub fn from_plan(plan: &HaloPlan, rank: usize, positions: &[Float3], types: &[u8]) -> Result<Self, NbnxmError> {
        let mut out = Self::default();
        Self::from_plan_into(plan, rank, positions, types, &Workers::serial(), &mut out)?;
        Ok(out)
    }

    /// [`Self::from_plan`] into `out` (its arrays reused), on `workers` (contiguous runs of local
    /// atoms, at least a few thousand each); the same atoms, and the same first error, for any
    /// workers and whatever `out` held. After an error `out`'s contents are unspecified.
    pub fn from_plan_into(
        plan: &HaloPlan,
        rank: usize,
        positions: &[Float3],
        types: &[u8],
        workers: &Workers,
        out: &mut Self,
    ) -> Result<(), NbnxmError> {
        Self::from_plan_unvalidated_into(plan, rank, positions, types, workers, out)?;
        out.validate()
    }

    /// [`Self::from_plan_into`] without its last pass, [`Self::validate`]: for a search that hands
    /// the atoms straight to a grid build, which validates them itself (`ClusterGrid::build_into`,
    /// and the GPU grid's zone plan, `LocalAtoms::zone_facts`, with the same errors), so that the
    /// search pays for one pass over the atoms, not two. Every other error is the same.
    pub(crate) fn from_plan_unvalidated_into(
        plan: &HaloPlan,
        rank: usize,
        positions: &[Float3],
        types: &[u8],
        workers: &Workers,
        out: &mut Self,
    ) -> Result<(), NbnxmError> {
        let r = plan.ranks.get(rank).ok_or(NbnxmError::NoSuchRank { rank, ranks: plan.ranks.len() })?;
        if types.len() != positions.len() {
            return Err(NbnxmError::Length { what: "atom types", found: types.len(), expected: positions.len() });
        }
        let place = Placement::new(plan, rank)?;
        out.prepare(plan, rank, types);
        // Local atoms `first..` of `ids` into the matching output slices.
        let fill = |first: usize, ids: &[u32], xs: &mut [Float3], ts: &mut [u32], zs: &mut [u8]| -> Result<(), NbnxmError> {
            for (k, &id) in ids.iter().enumerate() {
                let local = first + k;
                // The error built only for a bad id (built and dropped per atom, it costs more
                // than the rest of the loop).
                let Some(p) = positions.get(id as usize) else {
                    return Err(PlanError::GlobalId { rank, local, id, atoms: positions.len() }.into());
                };
                ts[k] = u32::from(types[id as usize]);
                (xs[k], zs[k]) = place.at(local, *p);
            }
            Ok(())
        };
        out.fill(&r.global_ids, workers, fill)
    }

    /// Rank `rank`'s atoms of `plan` from its own local positions, `positions[i]` being the
    /// position of `plan.ranks[rank].global_ids[i]` (as [`crate::decomp::Redecomposed`]'s
    /// `local_positions` hold them: wrapped, in the exchange's order), and every atom's type by
    /// global id: the atoms [`Self::from_plan`] builds from a system holding those positions at
    /// those ids, bit for bit, without a whole-system copy to scatter into and gather from.
    ///
    /// `positions` is swapped into `out` and transformed there (no copy): on return it holds
    /// `out`'s earlier positions array (contents unspecified), for the caller to reuse. Workers,
    /// errors and `out` as in [`Self::from_plan_into`]; an id beyond `types` is
    /// [`PlanError::GlobalId`] (the first one), local positions that are not one per local atom
    /// [`NbnxmError::Length`].
    pub fn from_local_into(
        plan: &HaloPlan,
        rank: usize,
        positions: &mut Vec<Float3>,
        types: &[u8],
        workers: &Workers,
        out: &mut Self,
    ) -> Result<(), NbnxmError> {
        Self::from_local_unvalidated_into(plan, rank, positions, types, workers, out)?;
        out.validate()
    }

    /// [`Self::from_local_into`] without its last pass, [`Self::validate`], as
    /// [`Self::from_plan_unvalidated_into`] is [`Self::from_plan_into`]'s.
    pub(crate) fn from_local_unvalidated_into(
        plan: &HaloPlan,
        rank: usize,
        positions: &mut Vec<Float3>,
        types: &[u8],
        workers: &Workers,
        out: &mut Self,
    ) -> Result<(), NbnxmError> {
        Self::from_local_scanned_into(plan, rank, positions, None, types, false, workers, out).map(drop)
    }

    /// [`Self::from_local_unvalidated_into`] where the home atoms' positions were scanned already:
    /// `home_scan`, when given, must be [`crate::decomp::scan`] of `positions[..home]` against
    /// `[0, edge)` along every dimension (a redecomposition on the GPU makes it there:
    /// `halo::decomp::GpuExtent`). When it says they all lie there, they
    /// are taken as they are (no pass to wrap them), and the token returned hands the zone checks
    /// the home atoms' facts ([`Self::zone_facts_with`]), which then pass over the halo atoms only.
    /// The same atoms, and the same errors, as without it.
    ///
    /// With `home_types_on_gpu` the home atoms' types are not gathered (their ids are still
    /// checked against `types`): `out.types_from` is then `home`, for a GPU grid that makes those
    /// types from the ids itself (`HomeOnDevice::types`).
    ///
    /// `positions` holds every local atom's position, or only the halo atoms' (from `home` on)
    /// where the home atoms' positions stayed on the GPU (`halo::decomp::Redecomposed::local_positions_from`):
    /// then `home_scan` must say they all lie in the box, `out.positions_from` is `home`, and
    /// `out.positions[..home]` keeps whatever an earlier build left there (nothing is written).
    /// Either way `positions` gets an array back for the caller to reuse.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_local_scanned_into(
        plan: &HaloPlan,
        rank: usize,
        positions: &mut Vec<Float3>,
        home_scan: Option<Scan>,
        types: &[u8],
        home_types_on_gpu: bool,
        workers: &Workers,
        out: &mut Self,
    ) -> Result<Option<HomeChecked>, NbnxmError> {
        let r = plan.ranks.get(rank).ok_or(NbnxmError::NoSuchRank { rank, ranks: plan.ranks.len() })?;
        let home_scan = home_scan.filter(|s| s.in_range);
        let (n, home) = (r.global_ids.len(), r.home_atoms);
        let halo_only = home > 0 && positions.len() == n - home;
        if !halo_only && positions.len() != n {
            return Err(NbnxmError::Length {
                what: "local positions (every local atom's, or the halo atoms' only)",
                found: positions.len(),
                expected: n,
            });
        }
        if halo_only && home_scan.is_none() {
            return Err(NbnxmError::PositionsOnGpu { from: home });
        }
        let place = Placement::new(plan, rank)?;
        if halo_only {
            // The home part of the positions held keeps what it held (resizing writes only what
            // grows); the halo atoms' are copied in and placed there.
            out.positions.resize(n, Float3::default());
            out.positions[home..].copy_from_slice(positions);
        } else {
            std::mem::swap(&mut out.positions, positions);
        }
        out.prepare(plan, rank, types);
        let box_size = plan.box_size;
        let fill = |first: usize, ids: &[u32], xs: &mut [Float3], ts: &mut [u32], zs: &mut [u8]| -> Result<(), NbnxmError> {
            // Types first: the ids checked at once (the first bad one is the error), then a plain
            // gather, cheaper than a checked load per atom.
            if let Some((k, id)) = first_at_or_above(ids, types.len()) {
                return Err(PlanError::GlobalId { rank, local: first + k, id, atoms: types.len() }.into());
            }
            let split = home.saturating_sub(first).min(ids.len());
            // The home atoms' types only where the GPU does not make them.
            let typed = if home_types_on_gpu { split } else { 0 };
            for (t, &id) in ts[typed..].iter_mut().zip(&ids[typed..]) {
                *t = u32::from(types[id as usize]);
            }
            // Home atoms: zone 0, wrapped in place (their positions are in the box already when
            // they come from a redecomposition: one branch-free check, nothing written; none at
            // all when the scan handed in says so).
            zs[..split].fill(0);
            if home_scan.is_none() && !all_in(&xs[..split], [0.0; 3], box_size) {
                wrap_positions(&mut xs[..split], box_size);
            }
            // Halo atoms: a redecomposition hands them wrapped, so one branch-free check usually
            // lets the placement skip the wrap (the same results: a position in the box wraps to
            // itself), which keeps its loop free of branches.
            let wrapped = all_in(&xs[split..], [0.0; 3], box_size);
            let halo = xs[split..].iter_mut().zip(&mut zs[split..]);
            if wrapped {
                halo.for_each(|(x, z)| (*x, *z) = place.halo_at_wrapped(*x));
            } else {
                halo.for_each(|(x, z)| (*x, *z) = place.halo_at(*x));
            }
            Ok(())
        };
        out.fill(&r.global_ids, workers, fill)?;
        if home_types_on_gpu {
            out.types_from = home;
        }
        if halo_only {
            out.positions_from = home;
        }
        Ok(home_scan.map(|s| HomeChecked { home, lo: s.lo, hi: s.hi }))
    }

    /// [`Self::from_local_into`] into a new value, `positions` copied.
    pub fn from_local(plan: &HaloPlan, rank: usize, positions: &[Float3], types: &[u8]) -> Result<Self, NbnxmError> {
        let mut out = Self::default();
        Self::from_local_into(plan, rank, &mut positions.to_vec(), types, &Workers::serial(), &mut out)?;
        Ok(out)
    }

    /// Sizes the arrays for rank `rank`'s local atoms of `plan` (every entry is then written;
    /// resizing keeps the allocations of an earlier fill) and sets what follows from the plan and
    /// the system's `types`.
    fn prepare(&mut self, plan: &HaloPlan, rank: usize, types: &[u8]) {
        let r = &plan.ranks[rank];
        let n = r.global_ids.len();
        self.positions.resize(n, Float3::default());
        self.types.resize(n, 0);
        self.zones.resize(n, 0);
        self.home = r.home_atoms;
        self.box_size = plan.box_size;
        self.periodic = std::array::from_fn(|d| plan.grid.dims[d] == 1);
        self.ntypes = types.iter().copied().max().map_or(1, |t| usize::from(t) + 1);
        self.types_from = 0;
        self.positions_from = 0;
    }

    /// Runs `fill(first, ids, positions, types, zones)` over contiguous runs of the local atoms
    /// (`ids` their global ids) on `workers`; the first run's error first (the error a single
    /// thread meets).
    fn fill<F>(&mut self, ids: &[u32], workers: &Workers, fill: F) -> Result<(), NbnxmError>
    where
        F: Fn(usize, &[u32], &mut [Float3], &mut [u32], &mut [u8]) -> Result<(), NbnxmError> + Sync,
    {
        // Threads only pay for themselves with a few thousand atoms each.
        let n = ids.len();
        let parts = workers.threads().clamp(1, n.div_ceil(4096).max(1));
        let chunk = n.div_ceil(parts).max(1);
        if parts == 1 {
            return fill(0, ids, &mut self.positions, &mut self.types, &mut self.zones);
        }
        let work: Vec<_> = ids
            .chunks(chunk)
            .zip(self.positions.chunks_mut(chunk))
            .zip(self.types.chunks_mut(chunk))
            .zip(self.zones.chunks_mut(chunk))
            .enumerate()
            .collect();
        workers.map(work, |(c, (((ids, xs), ts), zs))| fill(c * chunk, ids, xs, ts, zs)).into_iter().collect()
    }

    /// An undecomposed system: every atom home, every dimension periodic, positions wrapped.
    pub fn single_rank(positions: &[Float3], types: &[u32], ntypes: usize, box_size: [f32; 3]) -> Result<Self, NbnxmError> {
        if types.len() != positions.len() {
            return Err(NbnxmError::Length { what: "atom types", found: types.len(), expected: positions.len() });
        }
        if let Some((atom, p)) = positions.iter().enumerate().find(|(_, p)| !(p.x.is_finite() && p.y.is_finite() && p.z.is_finite())) {
            let (d, value) = [p.x, p.y, p.z].into_iter().enumerate().find(|(_, v)| !v.is_finite()).unwrap_or((0, p.x));
            return Err(NbnxmError::NonFinite { atom, dim: DIMS[d], value });
        }
        let out = Self {
            positions: positions.iter().map(|&p| wrap_position(p, box_size)).collect(),
            types: types.to_vec(),
            zones: vec![0; positions.len()],
            home: positions.len(),
            box_size,
            periodic: [true; 3],
            ntypes,
            types_from: 0,
            positions_from: 0,
        };
        out.validate()?;
        Ok(out)
    }

    /// Number of local atoms.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    /// Whether there are no atoms.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// The bounds every coordinate must lie in (`lo <= v < hi`, which rejects NaN and the
    /// infinities too): `[0, edge)` along periodic dimensions, any finite value along the others.
    fn bounds(&self) -> ([f32; 3], [f32; 3]) {
        let lo: [f32; 3] = std::array::from_fn(|d| if self.periodic[d] { 0.0 } else { -f32::MAX });
        let hi: [f32; 3] = std::array::from_fn(|d| if self.periodic[d] { self.box_size[d] } else { f32::INFINITY });
        (lo, hi)
    }

    /// Whether every coordinate is finite, and inside `[0, edge)` along periodic dimensions: one
    /// branch-free pass (the common case); [`Self::validate`] then looks for the first bad one.
    fn positions_in_range(&self) -> bool {
        let (lo, hi) = self.bounds();
        all_in(self.held_positions(), lo, hi)
    }

    /// The positions held on the host: those from [`Self::positions_from`] on.
    fn held_positions(&self) -> &[Float3] {
        &self.positions[self.positions_from.min(self.positions.len())..]
    }

    /// Atom `atom`'s position where the host holds it ([`Self::positions_from`]).
    pub fn held_position(&self, atom: usize) -> Option<Float3> {
        self.held_positions().get(atom.checked_sub(self.positions_from)?).copied()
    }

    /// Whether the home atoms are zone 0 and the others zones 1 to 7: branch-free passes (the
    /// common case); [`Self::validate`] then looks for the first bad one.
    fn zones_ok(&self) -> bool {
        self.zones_ok_from(0)
    }

    /// [`Self::zones_ok`] for the atoms from `from` on.
    fn zones_ok_from(&self, from: usize) -> bool {
        let home = self.home.max(from);
        self.zones[from..home].iter().fold(0, |a, &z| a | z) == 0 && self.zones[home..].iter().fold(true, |ok, &z| ok & (z != 0) & (z < 8))
    }

    /// Whether every type of the atoms from `from` on is below `ntypes`: a branch-free pass.
    fn types_ok_from(&self, from: usize) -> bool {
        (self.types[from.min(self.types.len())..].iter().fold(0, |m, &t| m.max(t)) as usize) < self.ntypes
    }

    /// The checks of [`Self::validate`] before any per-atom one: lengths, the home count, the box
    /// (what the per-atom passes rely on).
    fn check_shape(&self) -> Result<(), NbnxmError> {
        let n = self.positions.len();
        for (what, found) in [("atom types", self.types.len()), ("zones", self.zones.len())] {
            if found != n {
                return Err(NbnxmError::Length { what, found, expected: n });
            }
        }
        if self.home > n {
            return Err(NbnxmError::Length { what: "local atoms (fewer than the home atoms)", found: n, expected: self.home });
        }
        if !self.box_size.iter().all(|l| l.is_finite() && *l > 0.0) {
            return Err(NbnxmError::Setup(format!("box {:?} must have positive finite edges", self.box_size)));
        }
        Ok(())
    }

    /// Checks lengths, finite coordinates inside the box along periodic dimensions, zones
    /// consistent with the home count, and types below `ntypes` (of the positions and types
    /// held: from [`Self::positions_from`] and [`Self::types_from`] on).
    pub fn validate(&self) -> Result<(), NbnxmError> {
        self.check_shape()?;
        if !self.positions_in_range() {
            let from = self.positions_from.min(self.positions.len());
            for (atom, p) in self.positions.iter().enumerate().skip(from) {
                for (d, value) in [p.x, p.y, p.z].into_iter().enumerate() {
                    if !value.is_finite() {
                        return Err(NbnxmError::NonFinite { atom, dim: DIMS[d], value });
                    }
                    if self.periodic[d] && !(0.0..self.box_size[d]).contains(&value) {
                        return Err(NbnxmError::OutsideBox { atom, dim: DIMS[d], value, edge: self.box_size[d] });
                    }
                }
            }
        }
        if !self.zones_ok() {
            for (atom, &zone) in self.zones.iter().enumerate() {
                if (atom < self.home) != (zone == 0) || zone >= 8 {
                    return Err(NbnxmError::Zone { atom, zone, home: self.home });
                }
            }
        }
        let from = self.types_from.min(self.types.len());
        if let Some((k, ty)) = first_at_or_above(&self.types[from..], self.ntypes) {
            return Err(NbnxmError::Type { atom: from + k, ty, ntypes: self.ntypes });
        }
        Ok(())
    }

    /// An error where the home atoms' types are not held ([`Self::types_from`]): for builds that
    /// read every atom's type on the host.
    pub(crate) fn check_types_held(&self) -> Result<(), NbnxmError> {
        match self.types_from {
            0 => Ok(()),
            from => Err(NbnxmError::TypesOnGpu { from }),
        }
    }

    /// An error where the home atoms' positions are not held ([`Self::positions_from`]): for
    /// builds that read every atom's position on the host.
    pub(crate) fn check_positions_held(&self) -> Result<(), NbnxmError> {
        match self.positions_from {
            0 => Ok(()),
            from => Err(NbnxmError::PositionsOnGpu { from }),
        }
    }

    /// [`Self::validate`] and, for valid atoms, their [`ZoneFacts`] (what [`Self::zone_facts_by_atom`]
    /// gives, bit for bit) in one pass over the coordinates: the atoms in runs of one zone (the
    /// home atoms are one run), each run's coordinates checked against the bounds and folded into
    /// its lowest and highest coordinate per dimension, a block of positions at a time without a
    /// branch (see [`scan`]). Invalid atoms are the error [`Self::validate`] gives, found by it.
    ///
    /// The runs' minima and maxima are values of the zone's coordinates, so where one is not zero
    /// it is the atom-by-atom fold's to the bit (two equal floats other than zeros have one
    /// encoding); a zero bound (which of `0.0` and `-0.0` the fold keeps depends on the atoms'
    /// order) is taken from the atom-by-atom fold instead.
    #[cfg(test)]
    pub(crate) fn zone_facts(&self) -> Result<ZoneFacts, NbnxmError> {
        self.zone_facts_with(None)
    }

    /// [`Self::zone_facts`], bit for bit, with the home atoms' part taken from `checked` where it
    /// is given for these atoms (the token of [`Self::from_local_scanned_into`], whose home atoms'
    /// positions were scanned before, on the GPU): then only the halo atoms are passed over.
    pub(crate) fn zone_facts_with(&self, checked: Option<HomeChecked>) -> Result<ZoneFacts, NbnxmError> {
        self.check_shape()?;
        let (lo, hi) = self.bounds();
        let (n, home) = (self.len(), self.home);
        let mut facts = ZoneFacts { count: [0; 8], extent: [BBox::EMPTY; 8] };
        let checked = checked.filter(|c| c.home == home && home > 0 && c.exact(self.periodic));
        if self.positions_from > 0 && checked.is_none() {
            return Err(NbnxmError::PositionsOnGpu { from: self.positions_from });
        }
        let from = match checked {
            Some(c) => {
                facts.count[0] = home;
                facts.extent[0] = BBox { lo: c.lo, hi: c.hi };
                home
            }
            None => 0,
        };
        let mut fine = self.zones_ok_from(from) && self.types_ok_from(from.max(self.types_from));
        let mut start = from;
        // Zones checked: the home atoms are zone 0, every other one a zone from 1 to 7.
        while fine && start < n {
            let z = self.zones[start];
            let end = if start < home { home } else { start + self.zones[start..].iter().position(|&y| y != z).unwrap_or(n - start) };
            let s = scan(&self.positions[start..end], lo, hi);
            fine &= s.in_range;
            let (count, e) = (&mut facts.count[usize::from(z)], &mut facts.extent[usize::from(z)]);
            *count += end - start;
            for d in 0..3 {
                e.lo[d] = if s.lo[d] < e.lo[d] { s.lo[d] } else { e.lo[d] };
                e.hi[d] = if s.hi[d] > e.hi[d] { s.hi[d] } else { e.hi[d] };
            }
            start = end;
        }
        if !fine {
            // The first bad entry, as `validate` names it (it finds one: the flags above are its).
            self.validate()?;
            return Ok(self.zone_facts_by_atom_after(checked));
        }
        let mut zero = false;
        for (e, &count) in facts.extent.iter_mut().zip(&facts.count) {
            for d in 0..3 {
                if self.periodic[d] {
                    (e.lo[d], e.hi[d]) = (0.0, self.box_size[d]);
                } else {
                    zero |= count > 0 && (e.lo[d] == 0.0 || e.hi[d] == 0.0);
                }
            }
        }
        Ok(if zero { self.zone_facts_by_atom_after(checked) } else { facts })
    }

    /// The [`ZoneFacts`] of valid atoms atom by atom, in ascending order: the reference of
    /// [`Self::zone_facts`], in the `f32::min`/`max` fold over each zone's atoms that the host grid
    /// takes its zones' extents from.
    #[cfg(test)]
    pub(crate) fn zone_facts_by_atom(&self) -> ZoneFacts {
        self.zone_facts_by_atom_after(None)
    }

    /// [`Self::zone_facts_by_atom`], bit for bit, with the home atoms' zone taken from `checked`
    /// where given (exact, for these atoms: what [`Self::zone_facts_with`] keeps of it), so that
    /// only the halo atoms are folded atom by atom.
    fn zone_facts_by_atom_after(&self, checked: Option<HomeChecked>) -> ZoneFacts {
        let mut facts = ZoneFacts { count: [0; 8], extent: [BBox::EMPTY; 8] };
        let from = checked.map_or(0, |c| {
            facts.count[0] = c.home;
            facts.extent[0] = BBox { lo: c.lo, hi: c.hi };
            c.home
        });
        let open: Vec<usize> = (0..3).filter(|&d| !self.periodic[d]).collect();
        for (p, &z) in self.positions[from..].iter().zip(&self.zones[from..]) {
            let (z, v) = (usize::from(z), [p.x, p.y, p.z]);
            facts.count[z] += 1;
            for &d in &open {
                facts.extent[z].lo[d] = facts.extent[z].lo[d].min(v[d]);
                facts.extent[z].hi[d] = facts.extent[z].hi[d].max(v[d]);
            }
        }
        for e in &mut facts.extent {
            for d in (0..3).filter(|&d| self.periodic[d]) {
                (e.lo[d], e.hi[d]) = (0.0, self.box_size[d]);
            }
        }
        facts
    }
}

/// The home atoms' part of the zone checks, found where they were merged (on the GPU): made by
/// [`LocalAtoms::from_local_scanned_into`] for the atoms it built (home atoms `home`, every home
/// coordinate inside `[0, edge)`, their zone 0 and their types the system's, and their lowest and
/// highest coordinates `lo`, `hi`), taken by [`LocalAtoms::zone_facts_with`] for those atoms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct HomeChecked {
    home: usize,
    lo: [f32; 3],
    hi: [f32; 3],
}

impl HomeChecked {
    /// Whether the extent is the atom-by-atom fold's to the bit along the dimensions whose
    /// extent is the atoms' (not `periodic`): no zero bound there (which of `0.0` and `-0.0` the
    /// fold keeps depends on the atoms' order, see [`LocalAtoms::zone_facts`]).
    fn exact(&self, periodic: [bool; 3]) -> bool {
        Scan { in_range: true, lo: self.lo, hi: self.hi }.exact_along(periodic.map(|p| !p))
    }
}

/// What the grid needs to know of valid atoms' zones before it sorts them: atoms per zone, and
/// each zone's extent: the whole box `[0, edge]` along periodic dimensions, the bounding box of the
/// zone's atoms along the others ([`BBox::EMPTY`] there for a zone without atoms).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ZoneFacts {
    /// Atoms of every zone.
    pub(crate) count: [usize; 8],
    /// Extent of every zone.
    pub(crate) extent: [BBox; 8],
}

/// Whether every position lies in `lo..hi` along every dimension (`lo <= v < hi`: false for NaN),
/// without a branch: the coordinates read as one flat array, [`ALL_IN_BLOCK`] positions at a
/// time against bounds repeated as the coordinates are laid out (x, y, z, x, ...), so that the
/// compiler vectorizes the comparisons (it does not over the fields of each position).
fn all_in(positions: &[Float3], lo: [f32; 3], hi: [f32; 3]) -> bool {
    let lo_block: [f32; 3 * ALL_IN_BLOCK] = std::array::from_fn(|i| lo[i % 3]);
    let hi_block: [f32; 3 * ALL_IN_BLOCK] = std::array::from_fn(|i| hi[i % 3]);
    let coords: &[f32] = bytemuck::cast_slice(positions);
    let in_block = |c: &[f32], lo: &[f32], hi: &[f32]| c.iter().zip(lo).zip(hi).fold(true, |ok, ((&v, &l), &h)| ok & (v >= l) & (v < h));
    let blocks = coords.chunks_exact(3 * ALL_IN_BLOCK);
    let rest = blocks.remainder();
    blocks.fold(true, |ok, c| ok & in_block(c, &lo_block, &hi_block)) & in_block(rest, &lo_block, &hi_block)
}

/// Positions per block of [`all_in`].
const ALL_IN_BLOCK: usize = 16;

/// Where a rank puts a local atom: its position in the rank's frame and its zone, from its global
/// position (the rule of [`LocalAtoms::from_plan`], shared by every way of building local atoms).
struct Placement {
    /// Per dimension, the lowest coordinate of the rank's cell, and the lowest of the cells above
    /// it (`-inf` and `inf` where there is no cell below or above, or the dimension is whole): the
    /// cell thresholds ([`crate::decomp::Decomposition::cell_threshold`]) around the rank's cell.
    below: [f32; 3],
    above: [f32; 3],
    box_size: [f32; 3],
    home: usize,
}

impl Placement {
    fn new(plan: &HaloPlan, rank: usize) -> Result<Self, NbnxmError> {
        let geo = plan.decomposition()?;
        // Along a dimension not decomposed there are no thresholds, and the rank's cell is 0.
        let thresholds: [Vec<f32>; 3] = std::array::from_fn(|d| (1..plan.grid.dims[d]).map(|i| geo.cell_threshold(d, i)).collect());
        let coords = plan.grid.coords_of(rank);
        Ok(Self {
            below: std::array::from_fn(|d| if coords[d] > 0 { thresholds[d][coords[d] - 1] } else { f32::NEG_INFINITY }),
            above: std::array::from_fn(|d| thresholds[d].get(coords[d]).copied().unwrap_or(f32::INFINITY)),
            box_size: plan.box_size,
            home: plan.ranks[rank].home_atoms,
        })
    }

    /// A halo atom at global position `p` (wrapped or not): its position in the rank's frame and
    /// its zone; [`Self::at`] of a local atom past the home atoms, without a branch. With `t` the
    /// rank's cell's thresholds along a decomposed dimension, the wrapped coordinate's cell is
    /// below the rank's exactly when it is below `t[c - 1]`, and above exactly when it is at or
    /// above `t[c]` (`below` and `above`; none along a dimension not decomposed).
    #[inline(always)]
    fn halo_at(&self, p: Float3) -> (Float3, u8) {
        self.halo_at_wrapped(wrap_position(p, self.box_size))
    }

    /// [`Self::halo_at`] of a position `w` inside the box (`wrap_position(w) == w`), without the
    /// wrap.
    #[inline(always)]
    fn halo_at_wrapped(&self, w: Float3) -> (Float3, u8) {
        let w = [w.x, w.y, w.z];
        // A wrapped coordinate is never NaN.
        let below: [bool; 3] = std::array::from_fn(|d| w[d] < self.below[d]);
        let above: [bool; 3] = std::array::from_fn(|d| w[d] >= self.above[d]);
        let x: [f32; 3] = std::array::from_fn(|d| if below[d] { w[d] + self.box_size[d] } else { w[d] });
        let zone = (0..3).fold(0u8, |z, d| z | (u8::from(below[d] | above[d]) << d));
        (Float3::new(x[0], x[1], x[2]), zone)
    }

    /// Local atom `local` at global position `p` (wrapped or not): its position in the rank's
    /// frame and its zone.
    #[inline]
    fn at(&self, local: usize, p: Float3) -> (Float3, u8) {
        // Home atoms lie in this rank's cell by the plan's own test: zone 0, no shift.
        if local < self.home {
            return (wrap_position(p, self.box_size), 0);
        }
        self.halo_at(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decomp::RankGrid;
    use crate::system::MolecularSystem;

    #[test]
    fn local_positions_equal_what_the_exchange_delivers() {
        let mut sys = MolecularSystem::generate(3000, 8).unwrap();
        for p in &mut sys.positions {
            *p = wrap_position(*p, sys.box_size);
        }
        for dims in [[2, 1, 1], [2, 2, 1], [3, 2, 2], [4, 1, 1]] {
            let plan = HaloPlan::build(&sys, RankGrid::new(dims).unwrap(), 1.1).unwrap();
            let homes: Vec<Vec<Float3>> =
                plan.ranks.iter().map(|r| r.global_ids[..r.home_atoms].iter().map(|&g| sys.positions[g as usize]).collect()).collect();
            let want = crate::exchange::reference::coordinates(&plan.rank_halos(), &homes);
            // One entry per rank: `coordinates` zips the plan's rank halos with one home list per rank.
            for (r, want) in want.iter().enumerate() {
                let a = LocalAtoms::from_plan(&plan, r, &sys.positions, &sys.types).unwrap();
                let same = a
                    .positions
                    .iter()
                    .zip(want)
                    .all(|(p, q)| p.x.to_bits() == q.x.to_bits() && p.y.to_bits() == q.y.to_bits() && p.z.to_bits() == q.z.to_bits());
                assert!(same, "{dims:?} rank {r}");
                assert_eq!(a.positions.len(), want.len());
                // Zone bits only along decomposed dimensions; every halo atom has one.
                let decomposed: u8 = (0..3).filter(|&d| dims[d] > 1).map(|d| 1u8 << d).sum();
                assert!(a.zones.iter().all(|z| z & !decomposed == 0));
                assert!(a.zones[a.home..].iter().all(|&z| z != 0));
            }
        }
    }

    #[test]
    fn halo_placement_by_thresholds_is_the_placement_by_cell_index() {
        // Grids and boxes whose cell edges are not exact in f32; coordinates on, just below and
        // just above every cell edge and box edge, zeros of both signs, outside the box, NaN.
        for (dims, box_size) in
            [([2, 1, 1], [5.1f32, 4.7, 3.3]), ([3, 2, 2], [4.3, 3.7, 6.1]), ([4, 3, 1], [7.77, 5.03, 2.9]), ([1, 1, 3], [3.0, 3.0, 3.3])]
        {
            let grid = RankGrid::new(dims).unwrap();
            let mut xs: Vec<f32> = vec![0.0, -0.0, f32::NAN, f32::INFINITY, -1e-30];
            for d in 0..3 {
                for i in 0..=dims[d] {
                    let e = i as f32 * box_size[d] / dims[d] as f32;
                    xs.extend([e, e.next_down(), e.next_up(), -e, e + box_size[d]]);
                }
            }
            let plan = HaloPlan::from_positions(&[Float3::new(0.1, 0.1, 0.1)], box_size, grid, 0.5).unwrap();
            let geo = plan.decomposition().unwrap();
            for rank in 0..grid.num_ranks() {
                let place = Placement::new(&plan, rank).unwrap();
                let coords = grid.coords_of(rank);
                for (k, &a) in xs.iter().enumerate() {
                    let (b, c) = (xs[(k * 7 + 3) % xs.len()], xs[(k * 13 + 5) % xs.len()]);
                    let p = Float3::new(a, b, c);
                    // The rule as first written: `cell_index` of the wrapped coordinate, a division.
                    let w = wrap_position(p, box_size);
                    let w = [w.x, w.y, w.z];
                    let cell: [usize; 3] = std::array::from_fn(|d| if dims[d] > 1 { geo.cell_index(d, f64::from(w[d])) } else { coords[d] });
                    let want: [f32; 3] = std::array::from_fn(|d| if cell[d] < coords[d] { w[d] + box_size[d] } else { w[d] });
                    let zone = (0..3).filter(|&d| cell[d] != coords[d]).fold(0u8, |z, d| z | 1 << d);
                    let (got, got_zone) = place.at(plan.ranks[rank].home_atoms, p);
                    assert_eq!([got.x.to_bits(), got.y.to_bits(), got.z.to_bits()], want.map(f32::to_bits), "{dims:?} rank {rank} {p:?}");
                    assert_eq!(got_zone, zone, "{dims:?} rank {rank} {p:?}");
                    let (got, got_zone) = place.halo_at(p);
                    assert_eq!([got.x.to_bits(), got.y.to_bits(), got.z.to_bits()], want.map(f32::to_bits), "{dims:?} rank {rank} {p:?}");
                    assert_eq!(got_zone, zone, "{dims:?} rank {rank} {p:?}");
                }
            }
        }
    }

    #[test]
    fn the_flat_range_check_is_the_check_position_by_position() {
        let (lo, hi) = ([0.0f32, -f32::MAX, 0.0], [2.5f32, f32::INFINITY, 3.0]);
        let one = |p: &Float3| (p.x >= lo[0]) & (p.x < hi[0]) & (p.y >= lo[1]) & (p.y < hi[1]) & (p.z >= lo[2]) & (p.z < hi[2]);
        let good = Float3::new(1.0, -7.0, 2.9);
        // On the bounds and next to them, zeros of both signs, NaN and the infinities.
        let bad = [0.0f32, -0.0, 2.5, 2.5f32.next_down(), -1e-30, 3.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::MAX, f32::MAX];
        // Lengths around the block (and none), one odd coordinate anywhere.
        for len in [0, 1, 15, 16, 17, 40] {
            let all = vec![good; len];
            assert!(all_in(&all, lo, hi));
            for at in 0..len {
                for d in 0..3 {
                    for &v in &bad {
                        let mut ps = all.clone();
                        let mut c = [ps[at].x, ps[at].y, ps[at].z];
                        c[d] = v;
                        ps[at] = Float3::new(c[0], c[1], c[2]);
                        assert_eq!(all_in(&ps, lo, hi), ps.iter().all(one), "{len} positions, {v} along {d} at {at}");
                    }
                }
            }
        }
    }

    #[test]
    fn threads_do_not_change_the_local_atoms() {
        let sys = MolecularSystem::generate(20_000, 5).unwrap();
        for dims in [[2, 1, 1], [2, 2, 1], [3, 2, 2]] {
            let plan = HaloPlan::build(&sys, RankGrid::new(dims).unwrap(), 1.1).unwrap();
            for r in [0, plan.ranks.len() - 1] {
                let one = LocalAtoms::from_plan(&plan, r, &sys.positions, &sys.types).unwrap();
                for t in [2, 3, 16] {
                    let mut got = LocalAtoms::default();
                    LocalAtoms::from_plan_into(&plan, r, &sys.positions, &sys.types, &Workers::new(t).unwrap(), &mut got).unwrap();
                    assert_eq!(got, one, "{dims:?} rank {r}, {t} threads");
                }
            }
        }
        // A global id beyond the positions: the same error (the first bad atom) on any count.
        let mut plan = HaloPlan::build(&sys, RankGrid::new([2, 1, 1]).unwrap(), 1.1).unwrap();
        let n = plan.ranks[0].global_ids.len();
        plan.ranks[0].global_ids[n - 10] = 99_999;
        plan.ranks[0].global_ids[n - 3] = 99_998;
        let one = LocalAtoms::from_plan(&plan, 0, &sys.positions, &sys.types).unwrap_err();
        assert!(one.to_string().contains("99999"), "{one}");
        for t in [2, 5] {
            let e =
                LocalAtoms::from_plan_into(&plan, 0, &sys.positions, &sys.types, &Workers::new(t).unwrap(), &mut LocalAtoms::default()).unwrap_err();
            assert_eq!(e, one);
        }
    }

    #[test]
    fn a_reused_buffer_gives_the_atoms_of_a_fresh_one() {
        // Ranks with more and fewer atoms, grids of different shapes, and a failed fill in
        // between, all through one buffer, on one and on several workers.
        let sys = MolecularSystem::generate(20_000, 6).unwrap();
        let small = MolecularSystem::generate(2_000, 7).unwrap();
        for w in [Workers::serial(), Workers::new(3).unwrap()] {
            let mut buf = LocalAtoms::default();
            for (s, dims, r) in [(&sys, [2, 1, 1], 0), (&small, [2, 2, 1], 3), (&sys, [1, 1, 1], 0), (&small, [3, 1, 1], 1), (&sys, [2, 2, 2], 5)] {
                let plan = HaloPlan::build(s, RankGrid::new(dims).unwrap(), 1.1).unwrap();
                LocalAtoms::from_plan_into(&plan, r, &s.positions, &s.types, &w, &mut buf).unwrap();
                assert_eq!(buf, LocalAtoms::from_plan(&plan, r, &s.positions, &s.types).unwrap(), "{dims:?} rank {r}");
                let e = LocalAtoms::from_plan_into(&plan, r, &s.positions, &s.types[1..], &w, &mut buf).unwrap_err();
                assert!(matches!(e, NbnxmError::Length { what: "atom types", .. }), "{e}");
            }
        }
    }

    #[test]
    fn bad_inputs_are_named() {
        let b = [2.0; 3];
        let e = LocalAtoms::single_rank(&[Float3::new(f32::NAN, 0.0, 0.0)], &[0], 1, b).unwrap_err();
        assert!(matches!(e, NbnxmError::NonFinite { atom: 0, .. }), "{e}");
        let e = LocalAtoms::single_rank(&[Float3::default()], &[3], 2, b).unwrap_err();
        assert!(matches!(e, NbnxmError::Type { ty: 3, .. }), "{e}");
        let mut a = LocalAtoms::single_rank(&[Float3::default(), Float3::new(1.0, 1.0, 1.0)], &[0, 0], 1, b).unwrap();
        a.zones[0] = 1;
        assert!(matches!(a.validate(), Err(NbnxmError::Zone { atom: 0, .. })));
        a.zones[0] = 0;
        a.positions[1].y = 2.5;
        let e = a.validate().unwrap_err();
        assert!(e.to_string().contains("wrap positions"), "{e}");
        // The range pass flags, the exact search names the first bad coordinate: NaN anywhere,
        // an infinity along a dimension that is not periodic.
        a.positions[1].y = 1.0;
        a.positions[0].z = f32::NAN;
        assert!(matches!(a.validate(), Err(NbnxmError::NonFinite { atom: 0, dim: "z", .. })));
        a.positions[0].z = 0.0;
        a.periodic = [false, true, true];
        a.positions[1].x = -5.0;
        assert_eq!(a.validate(), Ok(()));
        a.positions[1].x = f32::INFINITY;
        assert!(matches!(a.validate(), Err(NbnxmError::NonFinite { atom: 1, dim: "x", .. })));
    }

    /// Facts as bits (`PartialEq` on floats would let 0.0 equal -0.0).
    fn fact_bits(f: &ZoneFacts) -> ([usize; 8], Vec<u32>) {
        (f.count, f.extent.iter().flat_map(|e| e.lo.iter().chain(&e.hi).map(|v| v.to_bits())).collect())
    }

    /// Random valid atoms: `n` atoms, `home` of them home, the halo in runs of one zone (or one
    /// zone per atom), coordinates inside the box along periodic dimensions and anywhere finite
    /// along the others, with zeros of both signs, box edges and repeated values mixed in.
    fn random_atoms(rng: &mut rand_chacha::ChaCha8Rng, n: usize, periodic: [bool; 3]) -> LocalAtoms {
        use rand::Rng;
        let b = [3.0f32, 2.5, 4.0];
        let home = if rng.random_range(0..4) == 0 { 0 } else { rng.random_range(0..=n) };
        let mut zones = vec![0u8; n];
        let mut i = home;
        while i < n {
            let run = if rng.random_range(0..3) == 0 { 1 } else { rng.random_range(1..40) };
            let z = rng.random_range(1..8u8);
            zones[i..(i + run).min(n)].fill(z);
            i += run;
        }
        let special = |rng: &mut rand_chacha::ChaCha8Rng, d: usize| -> f32 {
            let open = [0.0f32, -0.0, b[d], -b[d], 1e-30, -1e-30, 1.25, -f32::MAX, f32::MAX];
            let inside = [0.0f32, -0.0, b[d].next_down(), 1e-30, 1.25];
            if periodic[d] { inside[rng.random_range(0..inside.len())] } else { open[rng.random_range(0..open.len())] }
        };
        let positions = (0..n)
            .map(|_| {
                let v: [f32; 3] = std::array::from_fn(|d| match rng.random_range(0..6) {
                    0 => special(rng, d),
                    _ if periodic[d] => rng.random::<f32>() * b[d].next_down(),
                    _ => rng.random_range(-2.0..2.0) * b[d],
                });
                Float3::new(v[0], v[1], v[2])
            })
            .collect();
        let types = (0..n).map(|_| rng.random_range(0..3)).collect();
        LocalAtoms { positions, types, zones, home, box_size: b, periodic, ntypes: 3, types_from: 0, positions_from: 0 }
    }

    /// `positions`, every one a home atom of one type, in a box of edge 2 periodic along `periodic`.
    fn home_atoms_only(positions: Vec<Float3>, periodic: [bool; 3]) -> LocalAtoms {
        let n = positions.len();
        LocalAtoms {
            positions,
            types: vec![0; n],
            zones: vec![0; n],
            home: n,
            box_size: [2.0; 3],
            periodic,
            ntypes: 1,
            types_from: 0,
            positions_from: 0,
        }
    }

    #[test]
    fn zone_facts_are_the_atom_by_atom_facts() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
        // Lengths around the scan's block and runs, every mix of periodic dimensions.
        for &n in &[0usize, 1, 2, 7, 8, 9, 23, 24, 25, 100, 517] {
            for k in 0..24 {
                let periodic = [k & 1 != 0, k & 2 != 0, k & 4 != 0];
                let a = random_atoms(&mut rng, n, periodic);
                a.validate().unwrap();
                assert_eq!(fact_bits(&a.zone_facts().unwrap()), fact_bits(&a.zone_facts_by_atom()), "{n} atoms, {periodic:?}");
                // Without the zeros and edges too (the fast bounds, no fallback), and with every
                // coordinate one value (ties everywhere).
                let mut b = a.clone();
                for p in &mut b.positions {
                    let f = |v: f32| if v == 0.0 { 0.5 } else { v };
                    *p = Float3::new(f(p.x), f(p.y), f(p.z));
                }
                assert_eq!(fact_bits(&b.zone_facts().unwrap()), fact_bits(&b.zone_facts_by_atom()), "{n} atoms, {periodic:?}, no zeros");
                b.positions.iter_mut().for_each(|p| *p = Float3::new(1.5, 1.5, 1.5));
                assert_eq!(fact_bits(&b.zone_facts().unwrap()), fact_bits(&b.zone_facts_by_atom()), "{n} atoms, {periodic:?}, one value");
            }
        }
        // Zeros of both signs in either order, alone in a zone and among others.
        for (xs, periodic) in [(&[-0.0f32, 0.0][..], [false; 3]), (&[0.0, -0.0], [false; 3]), (&[0.0, 1.0, -0.0, -1.0], [false, true, true])] {
            let positions: Vec<Float3> = xs.iter().map(|&x| Float3::new(x, 0.5, -0.0)).collect();
            let a = home_atoms_only(positions, periodic);
            assert_eq!(fact_bits(&a.zone_facts().unwrap()), fact_bits(&a.zone_facts_by_atom()), "{xs:?}");
        }
        // Zeros of both signs as the lowest (or highest) coordinate at any two places, in either
        // order: the scan's lanes meet them in another order than the atoms come.
        let n = 20;
        for (i, j) in (0..n).flat_map(|i| (i + 1..n).map(move |j| (i, j))) {
            for (first, sign) in [(0.0f32, 1.0f32), (-0.0, 1.0), (0.0, -1.0), (-0.0, -1.0)] {
                let mut x = vec![sign; n];
                (x[i], x[j]) = (first, -first);
                let positions: Vec<Float3> = x.iter().map(|&v| Float3::new(v, 0.5, v)).collect();
                let a = home_atoms_only(positions, [false, true, false]);
                assert_eq!(fact_bits(&a.zone_facts().unwrap()), fact_bits(&a.zone_facts_by_atom()), "zeros at {i} and {j}, {first} first");
            }
        }
        // Every rank's atoms of real plans.
        let sys = MolecularSystem::generate(6_000, 3).unwrap();
        for dims in [[1, 1, 1], [2, 1, 1], [2, 2, 1], [2, 2, 2], [3, 1, 2]] {
            let plan = HaloPlan::build(&sys, RankGrid::new(dims).unwrap(), 1.1).unwrap();
            for r in 0..plan.ranks.len() {
                let a = LocalAtoms::from_plan(&plan, r, &sys.positions, &sys.types).unwrap();
                assert_eq!(fact_bits(&a.zone_facts().unwrap()), fact_bits(&a.zone_facts_by_atom()), "{dims:?} rank {r}");
            }
        }
        let _ = rng.random::<u8>();
    }

    #[test]
    fn zone_facts_refuse_what_validate_refuses_with_its_error() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(22);
        let bad_values = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1e-30, 2.5, 4.0, 7.0, -f32::MAX];
        for round in 0..400 {
            let periodic = [rng.random::<bool>(), rng.random::<bool>(), rng.random::<bool>()];
            let n = rng.random_range(1..80);
            let mut a = random_atoms(&mut rng, n, periodic);
            // One to three faults anywhere: a coordinate, a zone, a type, the shape.
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..n);
                match rng.random_range(0..8) {
                    0..=2 => {
                        let mut c = [a.positions[at].x, a.positions[at].y, a.positions[at].z];
                        c[rng.random_range(0..3)] = bad_values[rng.random_range(0..bad_values.len())];
                        a.positions[at] = Float3::new(c[0], c[1], c[2]);
                    }
                    3 => a.zones[at] = [0u8, 1, 7, 8, 200][rng.random_range(0..5)],
                    4 => {
                        // (The types may be one short already.)
                        if let Some(t) = a.types.get_mut(at) {
                            *t = rng.random_range(3..9);
                        }
                    }
                    5 => a.ntypes = rng.random_range(0..3),
                    6 => match rng.random_range(0..4) {
                        0 => a.home = n + 1,
                        1 => {
                            a.types.pop();
                        }
                        2 => a.zones.push(0),
                        _ => a.box_size[rng.random_range(0..3)] = [0.0, -1.0, f32::NAN, f32::INFINITY][rng.random_range(0..4)],
                    },
                    _ => a.home = rng.random_range(0..=n),
                }
            }
            match (a.validate(), a.zone_facts()) {
                (Ok(()), Ok(f)) => assert_eq!(fact_bits(&f), fact_bits(&a.zone_facts_by_atom()), "round {round}"),
                // Compared as text: a NaN in an error is not equal to itself.
                (Err(e), Err(f)) => assert_eq!(format!("{e:?}"), format!("{f:?}"), "round {round}"),
                (v, f) => panic!("round {round}: validate {v:?}, zone facts {f:?}"),
            }
        }
    }

    /// Every rank's local positions as [`crate::decomp::redecompose`] hands them over (aligned
    /// with the plan's global ids, wrapped), or `unwrapped`: each id's position as given.
    fn local_positions(plan: &HaloPlan, positions: &[Float3], wrapped: bool) -> Vec<Vec<Float3>> {
        let at = |g: u32| if wrapped { wrap_position(positions[g as usize], plan.box_size) } else { positions[g as usize] };
        plan.ranks.iter().map(|r| r.global_ids.iter().map(|&g| at(g)).collect()).collect()
    }

    /// Positions moved off the lattice: some by whole boxes, some onto a cell edge or the box edge.
    fn moved(sys: &MolecularSystem, seed: u64) -> Vec<Float3> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let b = sys.box_size;
        sys.positions
            .iter()
            .map(|p| {
                let mut x = [p.x, p.y, p.z];
                match rng.random_range(0..50) {
                    0 => x[0] = 0.0,
                    1 => x[1] = b[1] * 0.5,
                    2 => x[2] = -b[2],
                    3 => x[0] += b[0] * rng.random_range(-2..3) as f32,
                    _ => x.iter_mut().for_each(|v| *v += rng.random_range(-0.2..0.2)),
                }
                Float3::new(x[0], x[1], x[2])
            })
            .collect()
    }

    #[test]
    fn local_atoms_from_the_ranks_own_positions_equal_those_from_the_system() {
        let sys = MolecularSystem::generate(6_000, 9).unwrap();
        let positions = moved(&sys, 2);
        let mut buf = LocalAtoms::default();
        for dims in [[2, 1, 1], [1, 3, 1], [2, 2, 1], [3, 2, 2], [1, 1, 1]] {
            let plan = HaloPlan::from_positions(&positions, sys.box_size, RankGrid::new(dims).unwrap(), 1.1).unwrap();
            for wrapped in [true, false] {
                let locals = local_positions(&plan, &positions, wrapped);
                for (r, local) in locals.iter().enumerate() {
                    let want = LocalAtoms::from_plan(&plan, r, &positions, &sys.types).unwrap();
                    let got = LocalAtoms::from_local(&plan, r, local, &sys.types).unwrap();
                    // Bit for bit: `PartialEq` on floats would let 0.0 equal -0.0.
                    let bits = |a: &LocalAtoms| a.positions.iter().map(|p| [p.x.to_bits(), p.y.to_bits(), p.z.to_bits()]).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{dims:?} rank {r}");
                    assert_eq!(got, want, "{dims:?} rank {r}");
                    for w in [Workers::serial(), Workers::new(3).unwrap()] {
                        let mut mine = local.clone();
                        LocalAtoms::from_local_into(&plan, r, &mut mine, &sys.types, &w, &mut buf).unwrap();
                        assert_eq!(buf, want, "{dims:?} rank {r}, {} workers", w.threads());
                    }
                }
            }
        }
    }

    /// Local atoms from the halo atoms' positions only (the home atoms' stayed on the GPU, their
    /// scan exact): the same halo positions, zones and types as from every position, the home
    /// part of the positions left as an earlier build left it (poisoned here: never read), the
    /// same zone facts with the scan's token (also where a halo zone has a zero bound and the
    /// facts fold atom by atom); refused without a scan, by the host's grid, and without the token.
    #[test]
    fn home_positions_left_on_the_gpu_give_the_same_halo_and_zone_facts() {
        let sys = MolecularSystem::generate(6_000, 9).unwrap();
        let positions = moved(&sys, 2);
        let (mut buf, mut plain) = (LocalAtoms::default(), LocalAtoms::default());
        let mut taken = 0;
        for dims in [[2, 1, 1], [1, 3, 1], [2, 2, 1], [3, 2, 2]] {
            let plan = HaloPlan::from_positions(&positions, sys.box_size, RankGrid::new(dims).unwrap(), 1.1).unwrap();
            for (r, local) in local_positions(&plan, &positions, true).iter().enumerate() {
                let home = plan.ranks[r].home_atoms;
                let whole = crate::decomp::scan(&local[..home], [0.0; 3], sys.box_size);
                let what = format!("{dims:?} rank {r}");
                LocalAtoms::from_local_unvalidated_into(&plan, r, &mut local.clone(), &sys.types, &Workers::serial(), &mut plain).unwrap();
                // What an earlier build left: NaN everywhere (the home part must never be read).
                buf.positions = vec![Float3::new(f32::NAN, f32::NAN, f32::NAN); local.len() + 7];
                let mut halo = local[home..].to_vec();
                let checked = LocalAtoms::from_local_scanned_into(&plan, r, &mut halo, Some(whole), &sys.types, false, &Workers::serial(), &mut buf)
                    .unwrap()
                    .expect("wrapped home atoms lie in the box");
                assert_eq!(buf.positions_from, home, "{what}");
                assert_eq!(buf.positions.len(), local.len(), "{what}");
                assert!(buf.positions[..home].iter().all(|p| p.x.is_nan()), "{what}: the home part untouched");
                let bits = |v: &[Float3]| v.iter().map(|p| [p.x.to_bits(), p.y.to_bits(), p.z.to_bits()]).collect::<Vec<_>>();
                assert_eq!(bits(&buf.positions[home..]), bits(&plain.positions[home..]), "{what}: the halo positions");
                assert_eq!((&buf.types, &buf.zones, buf.home), (&plain.types, &plain.zones, plain.home), "{what}");
                assert_eq!(buf.held_position(home.saturating_sub(1)), None, "{what}");
                buf.validate().unwrap();
                assert!(
                    matches!(super::super::ClusterGrid::build_into(&buf, &Workers::serial(), &mut Default::default()), Err(NbnxmError::PositionsOnGpu { from }) if from == home)
                );
                let want = plain.zone_facts().unwrap();
                if checked.exact(buf.periodic) {
                    taken += 1;
                    assert_eq!(fact_bits(&buf.zone_facts_with(Some(checked)).unwrap()), fact_bits(&want), "{what}");
                    // A halo atom on a zero bound: the halo zones folded atom by atom, the same.
                    if let Some(k) = (home..buf.len()).find(|&k| buf.zones[k] != 0) {
                        let d = (0..3).find(|&d| !buf.periodic[d]).expect("a decomposed dimension");
                        let mut edge = buf.clone();
                        let mut full = plain.clone();
                        for a in [&mut edge, &mut full] {
                            let p = &mut a.positions[k];
                            *[&mut p.x, &mut p.y, &mut p.z][d] = 0.0;
                        }
                        assert_eq!(
                            fact_bits(&edge.zone_facts_with(Some(checked)).unwrap()),
                            fact_bits(&full.zone_facts().unwrap()),
                            "{what}: a zero bound"
                        );
                    }
                } else {
                    assert!(matches!(buf.zone_facts_with(Some(checked)), Err(NbnxmError::PositionsOnGpu { .. })), "{what}: an inexact scan");
                }
                assert!(matches!(buf.zone_facts_with(None), Err(NbnxmError::PositionsOnGpu { .. })), "{what}: no token");
                // Without a scan the home positions are needed.
                let e =
                    LocalAtoms::from_local_scanned_into(&plan, r, &mut local[home..].to_vec(), None, &sys.types, false, &Workers::serial(), &mut buf)
                        .unwrap_err();
                assert!(matches!(e, NbnxmError::PositionsOnGpu { from } if from == home), "{what}: {e}");
            }
        }
        assert!(taken > 3, "{taken} ranks' scans taken");
    }

    #[test]
    fn home_atoms_scanned_beforehand_give_the_same_atoms_and_zone_facts() {
        let sys = MolecularSystem::generate(6_000, 9).unwrap();
        let positions = moved(&sys, 2);
        let (mut buf, mut plain) = (LocalAtoms::default(), LocalAtoms::default());
        let (mut used, mut refused) = (0, 0);
        for dims in [[2, 1, 1], [1, 3, 1], [2, 2, 1], [3, 2, 2], [1, 1, 1]] {
            let plan = HaloPlan::from_positions(&positions, sys.box_size, RankGrid::new(dims).unwrap(), 1.1).unwrap();
            for (r, local) in local_positions(&plan, &positions, true).iter().enumerate() {
                let home = plan.ranks[r].home_atoms;
                let whole = crate::decomp::scan(&local[..home], [0.0; 3], sys.box_size);
                let mut mine = local.clone();
                LocalAtoms::from_local_unvalidated_into(&plan, r, &mut mine, &sys.types, &Workers::serial(), &mut plain).unwrap();
                let want = plain.zone_facts().unwrap();
                let mut mine = local.clone();
                let checked =
                    LocalAtoms::from_local_scanned_into(&plan, r, &mut mine, Some(whole), &sys.types, false, &Workers::serial(), &mut buf).unwrap();
                assert_eq!(buf, plain, "{dims:?} rank {r}: the same atoms");
                let checked = checked.expect("wrapped home atoms lie in the box");
                assert_eq!(fact_bits(&buf.zone_facts_with(Some(checked)).unwrap()), fact_bits(&want), "{dims:?} rank {r}");
                if checked.exact(buf.periodic) {
                    used += 1
                } else {
                    refused += 1
                }
                // A token for other atoms (another home count) is not taken.
                let other = HomeChecked { home: home + 1, ..checked };
                assert_eq!(fact_bits(&buf.zone_facts_with(Some(other)).unwrap()), fact_bits(&want), "{dims:?} rank {r}: other atoms");
                // A zero bound is the fold's to the sign only: not taken either.
                let zero = HomeChecked { lo: [-0.0; 3], ..checked };
                assert!(!zero.exact([false; 3]));
                // A scan that saw a coordinate outside the box gives no token.
                let outside = crate::decomp::Scan { in_range: false, ..whole };
                let mut mine = local.clone();
                let none =
                    LocalAtoms::from_local_scanned_into(&plan, r, &mut mine, Some(outside), &sys.types, false, &Workers::serial(), &mut buf).unwrap();
                assert!(none.is_none() && buf == plain, "{dims:?} rank {r}");
            }
        }
        // The moved positions put atoms on cell and box edges: both cases ran.
        assert!(used > 0 && refused > 0, "{used} scans taken, {refused} refused");
        // The halo atoms are still checked: a bad one is the error `validate` names.
        let plan = HaloPlan::from_positions(&positions, sys.box_size, RankGrid::new([2, 1, 1]).unwrap(), 1.1).unwrap();
        let local = &local_positions(&plan, &positions, true)[0];
        let home = plan.ranks[0].home_atoms;
        let mut mine = local.clone();
        let checked = LocalAtoms::from_local_scanned_into(
            &plan,
            0,
            &mut mine,
            Some(crate::decomp::scan(&local[..home], [0.0; 3], sys.box_size)),
            &sys.types,
            false,
            &Workers::serial(),
            &mut buf,
        )
        .unwrap();
        buf.positions[home + 3].y = f32::NAN;
        assert_eq!(buf.zone_facts_with(checked).unwrap_err().to_string(), buf.validate().unwrap_err().to_string());
    }

    #[test]
    fn home_types_left_to_the_gpu_are_not_gathered_and_only_a_gpu_grid_takes_them() {
        let sys = MolecularSystem::generate(12_000, 4).unwrap();
        let positions = moved(&sys, 3);
        for dims in [[2, 1, 1], [2, 2, 1], [2, 2, 2]] {
            let plan = HaloPlan::from_positions(&positions, sys.box_size, RankGrid::new(dims).unwrap(), 1.1).unwrap();
            for (r, local) in local_positions(&plan, &positions, true).iter().enumerate() {
                let home = plan.ranks[r].home_atoms;
                let mut plain = LocalAtoms::default();
                LocalAtoms::from_local_unvalidated_into(&plan, r, &mut local.clone(), &sys.types, &Workers::serial(), &mut plain).unwrap();
                let want = plain.zone_facts().unwrap();
                for threads in [1, 3] {
                    // Poisoned: a type written for a home atom would show.
                    let mut buf = LocalAtoms { types: vec![u32::MAX; local.len()], ..LocalAtoms::default() };
                    let workers = Workers::new(threads).unwrap();
                    let scan = crate::decomp::scan(&local[..home], [0.0; 3], sys.box_size);
                    let checked =
                        LocalAtoms::from_local_scanned_into(&plan, r, &mut local.clone(), Some(scan), &sys.types, true, &workers, &mut buf).unwrap();
                    let what = format!("{dims:?} rank {r}, {threads} threads");
                    assert_eq!(buf.types_from, home, "{what}");
                    assert!(buf.types[..home].iter().all(|&t| t == u32::MAX), "{what}: no home type gathered");
                    assert_eq!(buf.types[home..], plain.types[home..], "{what}: every halo type");
                    assert_eq!(
                        (&buf.positions, &buf.zones, buf.home, buf.ntypes),
                        (&plain.positions, &plain.zones, plain.home, plain.ntypes),
                        "{what}"
                    );
                    // The GPU grid's checks pass over what is held, with the token or without.
                    assert_eq!(fact_bits(&buf.zone_facts_with(checked).unwrap()), fact_bits(&want), "{what}");
                    assert_eq!(fact_bits(&buf.zone_facts_with(None).unwrap()), fact_bits(&want), "{what}");
                    buf.validate().unwrap();
                    // The host's grid reads every type: refused, with what to do.
                    let e = crate::nbnxm::ClusterGrid::build(&buf).unwrap_err();
                    assert!(matches!(e, NbnxmError::TypesOnGpu { from } if from == home), "{what}: {e}");
                    assert!(e.to_string().contains("build them with their types"), "{e}");
                    // A halo type beyond the table is still named.
                    if buf.len() > home {
                        buf.types[home] = 7;
                        let e = buf.validate().unwrap_err();
                        assert!(matches!(e, NbnxmError::Type { atom, ty: 7, .. } if atom == home), "{what}: {e}");
                        assert!(buf.zone_facts_with(None).is_err(), "{what}");
                    }
                }
            }
        }
        // The home atoms' ids are still checked against the types.
        let mut plan = HaloPlan::build(&sys, RankGrid::new([2, 1, 1]).unwrap(), 1.1).unwrap();
        let local = local_positions(&plan, &sys.positions, true).swap_remove(0);
        plan.ranks[0].global_ids[5] = 99_999;
        let e =
            LocalAtoms::from_local_scanned_into(&plan, 0, &mut local.clone(), None, &sys.types, true, &Workers::serial(), &mut LocalAtoms::default())
                .unwrap_err();
        assert!(matches!(e, NbnxmError::Plan(PlanError::GlobalId { local: 5, id: 99_999, .. })), "{e}");
    }

    #[test]
    fn local_atoms_from_the_ranks_own_positions_name_bad_inputs() {
        let sys = MolecularSystem::generate(20_000, 5).unwrap();
        let mut plan = HaloPlan::build(&sys, RankGrid::new([2, 1, 1]).unwrap(), 1.1).unwrap();
        let local = local_positions(&plan, &sys.positions, true).swap_remove(0);
        let e = LocalAtoms::from_local(&plan, 0, &local[1..], &sys.types).unwrap_err();
        assert!(matches!(e, NbnxmError::Length { what: "local positions (every local atom's, or the halo atoms' only)", .. }), "{e}");
        let e = LocalAtoms::from_local(&plan, 2, &local, &sys.types).unwrap_err();
        assert!(matches!(e, NbnxmError::NoSuchRank { rank: 2, .. }), "{e}");
        // A global id beyond the types: the first bad atom, on any number of workers.
        let n = plan.ranks[0].global_ids.len();
        plan.ranks[0].global_ids[n - 10] = 99_999;
        plan.ranks[0].global_ids[n - 3] = 99_998;
        let one = LocalAtoms::from_local(&plan, 0, &local, &sys.types).unwrap_err();
        assert!(one.to_string().contains("99999"), "{one}");
        for t in [2, 5] {
            let e = LocalAtoms::from_local_into(&plan, 0, &mut local.clone(), &sys.types, &Workers::new(t).unwrap(), &mut LocalAtoms::default())
                .unwrap_err();
            assert_eq!(e, one);
        }
        // A non-finite position: whatever `from_plan` makes of it at that id (wrapping takes NaN to 0).
        let plan = HaloPlan::build(&sys, RankGrid::new([2, 1, 1]).unwrap(), 1.1).unwrap();
        let (mut bad, mut system) = (local.clone(), sys.positions.clone());
        bad[5].y = f32::NAN;
        system[plan.ranks[0].global_ids[5] as usize].y = f32::NAN;
        assert_eq!(LocalAtoms::from_local(&plan, 0, &bad, &sys.types), LocalAtoms::from_plan(&plan, 0, &system, &sys.types));
    }

    /// The search's builders skip the last pass, `validate`, because every grid build repeats it:
    /// on valid atoms they give the same atoms; on invalid ones the grid builds (host and GPU zone
    /// plan) refuse them with the error the validating builders give.
    #[test]
    fn unvalidated_local_atoms_are_the_same_and_the_grid_builds_refuse_bad_ones_alike() {
        use crate::nbnxm::ClusterGrid;
        let sys = MolecularSystem::generate(6_000, 8).unwrap();
        let plan = HaloPlan::build(&sys, RankGrid::new([2, 2, 1]).unwrap(), 1.1).unwrap();
        let locals = local_positions(&plan, &sys.positions, true);
        let workers = Workers::new(2).unwrap();
        for (r, local) in locals.iter().enumerate() {
            let (mut a, mut b) = (LocalAtoms::default(), LocalAtoms::default());
            LocalAtoms::from_local_into(&plan, r, &mut local.clone(), &sys.types, &workers, &mut a).unwrap();
            LocalAtoms::from_local_unvalidated_into(&plan, r, &mut local.clone(), &sys.types, &workers, &mut b).unwrap();
            assert_eq!(a, b, "rank {r}, from local positions");
            LocalAtoms::from_plan_into(&plan, r, &sys.positions, &sys.types, &workers, &mut a).unwrap();
            LocalAtoms::from_plan_unvalidated_into(&plan, r, &sys.positions, &sys.types, &workers, &mut b).unwrap();
            assert_eq!(a, b, "rank {r}, from the system");
        }
        // A halo atom inside the rank's own cell (zone 0 past the home atoms): the validating
        // builder refuses it. (Positions cannot be non-finite here: the builders wrap them.)
        let r = 1;
        let at = plan.ranks[r].home_atoms + 3;
        let mut bad = locals[r].clone();
        bad[at] = bad[0];
        let want = LocalAtoms::from_local_into(&plan, r, &mut bad.clone(), &sys.types, &workers, &mut LocalAtoms::default()).unwrap_err();
        assert!(matches!(want, NbnxmError::Zone { .. }), "{want}");
        let mut atoms = LocalAtoms::default();
        LocalAtoms::from_local_unvalidated_into(&plan, r, &mut bad, &sys.types, &workers, &mut atoms).unwrap();
        assert_eq!(atoms.validate().unwrap_err(), want);
        assert_eq!(atoms.zone_facts().unwrap_err(), want, "the GPU grid's zone plan");
        assert_eq!(ClusterGrid::build(&atoms).unwrap_err(), want, "the host grid");
    }
}
