//! The `halo` command on top of the `halo` library: one module per subcommand ([`cli`]), the
//! benchmarks and their plots ([`mod@bench`]), and the process launcher of `halo launch` ([`launch`]).
//! The binary (`src/main.rs`) installs the crash report ([`crash`]) and calls [`cli::main`].

pub mod bench;
pub mod cli;
pub mod crash;
pub mod exit;
pub mod launch;
pub mod machine;
pub mod reference;

// `bench` and `launch` moved here from the `halo` library and name its items `crate::…`.
use halo::*;
