//! The bounded gathers of a search, `out[i] = table[keys[i]]` for a rank's home atoms, made on the
//! GPU where their keys are (kernel side: `gather_bounded`, `kernels-gpu/src/kernels/md.rs`): the
//! home atoms' types from their ids ([`TypesByIdKernel`]) and their `1 / m` from their types
//! ([`InverseMassesKernel`]). One launcher, [`enqueue_lookup`], tied to each kernel's value type.

use crate::abi;
use crate::error::{HaloError, Result};
use crate::gpu::{CudaStream, DeviceMemory, KernelModule, LaunchShape};
use crate::kernel_args;
use crate::kernels::MAX_GATHER_BLOCKS;
use bytemuck::Pod;

/// A kernel `name(keys, n, table, len, out)` that writes `out[i] = table[keys[i]]` for `i < n`,
/// and a fixed out-of-table value for a key at or past `len`.
pub(crate) trait Lookup {
    /// What the table holds.
    type Value: Pod;
    /// The kernel's entry point.
    const KERNEL: &'static str;
    /// What the keys are, for errors ("ids").
    const KEYS: &'static str;
    /// What the values are, for errors ("types").
    const VALUES: &'static str;
}

/// `types_by_id`: the home atoms' types from their global ids (`u32::MAX` past the table).
pub(crate) struct TypesByIdKernel;

impl Lookup for TypesByIdKernel {
    type Value = u32;
    const KERNEL: &'static str = abi::TYPES_BY_ID;
    const KEYS: &'static str = "ids";
    const VALUES: &'static str = "types";
}

/// `inverse_masses`: the home atoms' `1 / m` from their types (NaN past the table; the search that
/// copied the types refuses such a type, the grid's largest type against the LJ table of the same
/// type count, before any step reads the masses).
pub(crate) struct InverseMassesKernel;

impl Lookup for InverseMassesKernel {
    type Value = f32;
    const KERNEL: &'static str = abi::INVERSE_MASSES;
    const KEYS: &'static str = "types";
    const VALUES: &'static str = "masses";
}

/// Enqueues kernel `K` on `stream` for the first `home` atoms: `out[i] = table[keys[i]]`, after
/// what `stream` holds. Nothing for no atom; an error, before any launch, when `keys` or `out`
/// hold fewer than `home` elements, or `home` or the table's length exceed a `u32`. The caller
/// keeps the three buffers until `stream` has run the launch.
pub(crate) fn enqueue_lookup<K: Lookup>(
    module: &KernelModule,
    keys: &dyn DeviceMemory<u32>,
    table: &dyn DeviceMemory<K::Value>,
    out: &dyn DeviceMemory<K::Value>,
    home: usize,
    stream: &CudaStream,
) -> Result<()> {
    if home == 0 {
        return Ok(());
    }
    if keys.len() < home || out.len() < home {
        return Err(HaloError::InvalidInput(format!("{home} home atoms, room for {} {} and {} {}", keys.len(), K::KEYS, out.len(), K::VALUES)));
    }
    let len = u32::try_from(table.len())
        .map_err(|_| HaloError::InvalidInput(format!("a table of {} {}: more than a u32 counts", table.len(), K::VALUES)))?;
    let n32 = u32::try_from(home).map_err(|_| HaloError::InvalidInput(format!("{home} home atoms: more than a u32 counts")))?;
    let (mut k, mut n, mut t, mut tl, mut o) = (keys.device_ptr(), n32, table.device_ptr(), len, out.device_ptr());
    let mut args = kernel_args![k, n, t, tl, o];
    // SAFETY: the arguments match `K::KERNEL(keys, n, table, len, out)` (each `Lookup` names a
    // `gather_bounded` kernel of its value type); `keys` and `out` hold at least `home` elements
    // (checked), the table `len`; the caller keeps the buffers until `stream` has run the launch.
    unsafe { module.launch(K::KERNEL, LaunchShape::for_items(home, MAX_GATHER_BLOCKS), stream, &mut args) }
}
