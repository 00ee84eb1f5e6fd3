//! Which peers a PE reaches by loads and stores, agreed by both ends of every pair.
//!
//! Each end of a pulse decides from its own view of the other how the pulse travels
//! ([`super::rank::WordPaths`]): the sender stores low-latency words where it maps the receiver
//! and puts (with a signal) otherwise, and the receiver polls words where it maps the sender and
//! waits for the signal otherwise; forces likewise, the other way. Nothing promises that
//! `nvshmem_ptr` maps a pair both ways, and a router's direct pair falls back to puts on an end
//! where NVSHMEM gives no address; a pair mapped one way only left one end polling words that
//! never came (or storing words nobody polled). So every PE publishes which PEs it maps, once per
//! exchange (collective), and a pair takes loads and stores only where each end maps the other;
//! puts, which need no mapping, everywhere else.

use crate::error::{HaloError, Result};
use crate::nvshmem::Nvshmem;
use std::sync::Arc;

/// `mapped` (one flag per PE) packed into bytes, eight PEs a byte, PE 0 in the lowest bit.
pub fn encode(mapped: &[bool]) -> Vec<u8> {
    let mut out = vec![0u8; mapped.len().div_ceil(8)];
    for (pe, _) in mapped.iter().enumerate().filter(|(_, m)| **m) {
        out[pe / 8] |= 1 << (pe % 8);
    }
    out
}

/// Whether the row `row` ([`encode`]) of one PE says it maps PE `pe`.
fn maps(row: &[u8], pe: usize) -> bool {
    row.get(pe / 8).is_some_and(|b| b & (1 << (pe % 8)) != 0)
}

/// PE `me`'s agreed mapping from every PE's row (`rows[pe]`, [`encode`]d): peer `p` is mapped
/// exactly when `me` maps `p` and `p` maps `me`, so both ends of every pair decide alike. An
/// error when a row is too short for the PEs there are (a PE of another layout).
pub fn agreed(me: usize, rows: &[Vec<u8>]) -> Result<Vec<bool>> {
    let n = rows.len();
    if let Some((pe, _)) = rows.iter().enumerate().find(|(_, r)| r.len() != n.div_ceil(8)) {
        return Err(HaloError::InvalidInput(format!("PE {pe} published the mapping of {} PEs, but {n} are running", 8 * rows[pe].len())));
    }
    let mine = rows.get(me).ok_or_else(|| HaloError::InvalidInput(format!("PE {me} of {n}")))?;
    Ok((0..n).map(|p| maps(mine, p) && maps(&rows[p], me)).collect())
}

/// The pairs `agreed` drops for PE `me`: peers it maps itself that do not map it back.
pub fn one_sided(me: usize, rows: &[Vec<u8>]) -> Vec<usize> {
    let Some(mine) = rows.get(me) else { return Vec::new() };
    (0..rows.len()).filter(|&p| maps(mine, p) && !maps(&rows[p], me)).collect()
}

/// Every PE's `mapped` (this PE's own view, one flag per PE) all-gathered, and this PE's agreed
/// mapping ([`agreed`]). Collective: every PE calls it at the same point. A pair mapped one way
/// only is logged (a warning) and reached by puts from both ends.
pub fn agree(nvshmem: &Arc<Nvshmem>, mapped: &[bool]) -> Result<Vec<bool>> {
    let me = nvshmem.my_pe();
    let rows = nvshmem.all_gather_bytes(&encode(mapped))?;
    let dropped = one_sided(me, &rows);
    if !dropped.is_empty() {
        tracing::warn!("PE {me} maps PE(s) {dropped:?}, which do not map it back: those pairs use NVSHMEM puts both ways");
    }
    agreed(me, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::rank::WordPaths;
    use crate::exchange::synthetic::{SyntheticShape, halos};

    /// Every pulse's two ends against each other: what `a` sends as words `b` polls as words, for
    /// coordinates (to `send_rank`) and forces (from it).
    fn mismatches(halos: &[crate::desc::RankHalo], mapped: &[Vec<bool>]) -> Vec<String> {
        let mut out = Vec::new();
        for (a, h) in halos.iter().enumerate() {
            for (p, spec) in h.pulses.iter().enumerate() {
                let b = spec.send_rank;
                let other = &halos[b].pulses[p];
                let mine = WordPaths::of(mapped[a][spec.send_rank], mapped[a][spec.recv_rank]);
                let theirs = WordPaths::of(mapped[b][other.send_rank], mapped[b][other.recv_rank]);
                if mine.sends_x_words != theirs.receives_x_words {
                    out.push(format!("pulse {p}: rank {a} stores words {} but rank {b} polls words {}", mine.sends_x_words, theirs.receives_x_words));
                }
                if mine.receives_f_words != theirs.sends_f_words {
                    out.push(format!(
                        "pulse {p}: rank {b} pushes force words {} but rank {a} polls words {}",
                        theirs.sends_f_words, mine.receives_f_words
                    ));
                }
            }
        }
        out
    }

    #[test]
    fn asymmetric_paths() {
        // Two PEs, two pulses each way: PE 0 maps PE 1, PE 1 does not map PE 0 (nvshmem_ptr one way
        // only, or the router's direct pair with no address on one end).
        let h = halos(SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 2, home_atoms: 50, send_fraction: 0.4, box_len: 3.0 }, 3);
        let own = [vec![true, true], vec![false, true]];
        // Each end deciding from its own view: PE 0 stores words that PE 1 never polls (it waits
        // for a put's signal), and PE 1 polls force words that PE 0 pushes as a put.
        assert!(!mismatches(&h, &own).is_empty(), "the layout must be one-sided");
        let rows: Vec<Vec<u8>> = own.iter().map(|m| encode(m)).collect();
        let both_ends: Vec<Vec<bool>> = (0..2).map(|me| agreed(me, &rows).unwrap()).collect();
        assert_eq!(both_ends, [vec![true, false], vec![false, true]], "the pair uses puts both ways");
        assert_eq!(mismatches(&h, &both_ends), Vec::<String>::new());
        assert_eq!((one_sided(0, &rows), one_sided(1, &rows)), (vec![1], vec![]));
        // A pair mapped both ways stays mapped.
        let both: Vec<Vec<u8>> = [[true, true], [true, true]].iter().map(|m| encode(m)).collect();
        assert_eq!(agreed(1, &both).unwrap(), [true, true]);
    }

    #[test]
    fn rows_pack_eight_pes_a_byte_and_must_cover_every_pe() {
        let m: Vec<bool> = (0..11).map(|pe| pe % 3 == 0).collect();
        let row = encode(&m);
        assert_eq!(row.len(), 2);
        assert!((0..11).all(|pe| maps(&row, pe) == m[pe]));
        assert!(!maps(&row, 40), "past the row: not mapped");
        let err = agreed(0, &[vec![0xFF], vec![]]).unwrap_err().to_string();
        assert!(err.contains("PE 1 published the mapping of 0 PEs, but 2 are running"), "{err}");
    }
}
