//! The `halo` command's log: `tracing` events on stderr, filtered by `HALO_LOG`, else by the usual
//! `RUST_LOG`, else at `warn`; spans the filter lets through are printed when they close, with the
//! time they were busy (the library's search step and its parts are debug spans named `search` and
//! `search.<part>`: `HALO_LOG=halo=debug,halo_md=debug`). A second layer records the search spans
//! for `md-bench --search-parts` ([`crate::bench::search_parts`]).

use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// halo's own filter variable; it beats [`RUST_LOG`] when both are set.
pub const HALO_LOG: &str = "HALO_LOG";
/// The filter variable every `tracing` program reads.
pub const RUST_LOG: &str = "RUST_LOG";
/// The filter when neither variable is set.
pub const DEFAULT: &str = "warn";

/// The filter directives that apply and the variable they came from (`None`: the default).
/// An empty value counts as unset.
pub fn directives(halo_log: Option<String>, rust_log: Option<String>) -> (String, Option<&'static str>) {
    let set = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    match (set(halo_log), set(rust_log)) {
        (Some(h), _) => (h, Some(HALO_LOG)),
        (None, Some(r)) => (r, Some(RUST_LOG)),
        (None, None) => (DEFAULT.to_owned(), None),
    }
}

/// The filter for these values; a value that is not a filter is an error naming its variable.
pub fn filter(halo_log: Option<String>, rust_log: Option<String>) -> Result<EnvFilter, String> {
    let (text, source) = directives(halo_log, rust_log);
    EnvFilter::try_new(&text).map_err(|e| format!("{}={text:?} is not a log filter ({e}); logging at {DEFAULT}", source.unwrap_or("the default")))
}

/// Installs the stderr subscriber with the process environment's filter. A bad filter is reported
/// on stderr and replaced by the default, so that a typo does not stop the command.
pub fn init() {
    let filter = filter(std::env::var(HALO_LOG).ok(), std::env::var(RUST_LOG).ok()).unwrap_or_else(|e| {
        eprintln!("halo: {e}");
        EnvFilter::new(DEFAULT)
    });
    let log = tracing_subscriber::fmt::layer().with_span_events(FmtSpan::CLOSE).with_writer(std::io::stderr).with_filter(filter);
    tracing_subscriber::registry().with(log).with(crate::bench::search_parts::layer()).init();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    #[test]
    fn halo_log_beats_rust_log_which_beats_the_default() {
        assert_eq!(directives(some("halo=debug"), some("info")), ("halo=debug".to_owned(), Some(HALO_LOG)));
        assert_eq!(directives(None, some("info")), ("info".to_owned(), Some(RUST_LOG)));
        assert_eq!(directives(some("  "), some("trace")), ("trace".to_owned(), Some(RUST_LOG)), "an empty HALO_LOG counts as unset");
        assert_eq!(directives(None, None), (DEFAULT.to_owned(), None));
        assert_eq!(directives(None, some("")), (DEFAULT.to_owned(), None));
    }

    #[test]
    fn the_chosen_value_sets_the_level() {
        let level = |h: Option<String>, r: Option<String>| filter(h, r).expect("a valid filter").max_level_hint();
        assert_eq!(level(None, some("info")), Some(tracing::level_filters::LevelFilter::INFO));
        assert_eq!(level(some("error"), some("trace")), Some(tracing::level_filters::LevelFilter::ERROR));
        assert_eq!(level(None, None), Some(tracing::level_filters::LevelFilter::WARN));
    }

    #[test]
    fn a_bad_filter_names_its_variable() {
        let e = filter(None, some("halo=[")).expect_err("not a filter");
        assert!(e.starts_with("RUST_LOG=\"halo=[\" is not a log filter"), "{e}");
        let e = filter(some("=nonsense="), None).expect_err("not a filter");
        assert!(e.starts_with("HALO_LOG="), "{e}");
    }
}
