//! Where a search step's host time goes, part by part: the library wraps each part of a search
//! step in a `tracing` span named `search` or `search.<part>` (debug level; `halo_md::run`'s
//! search, `halo::decomp`'s redecomposition, the exchange's replan). [`layer`] records how long
//! each such span lived while [`start`] has switched recording on; [`take`] switches it off and
//! summarises what was recorded per span name. `halo md-bench --search-parts` records the timed
//! repeats of every row; `HALO_LOG=halo=debug,halo_md=debug` prints every span as it closes
//! instead.
//!
//! Recording costs a lock and a clock read per span (a few dozen per search step); switched off,
//! the filter refuses the spans, and the library's spans cost what a disabled `tracing` span costs.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tracing::span;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Whether spans are recorded now.
static RECORDING: AtomicBool = AtomicBool::new(false);
/// Each span name's lifetimes (µs) since [`start`].
static TIMES: Mutex<BTreeMap<&'static str, Vec<f64>>> = Mutex::new(BTreeMap::new());

/// The span of a whole search step; its parts are named `search.<part>`.
pub const SEARCH: &str = "search";

/// Whether a span of this name is a search step or one of its parts.
pub fn is_search_span(name: &str) -> bool {
    name == SEARCH || name.strip_prefix(SEARCH).is_some_and(|rest| rest.starts_with('.'))
}

/// When a recorded span was made.
struct Born(Instant);

/// The layer that records the search spans' lifetimes while [`start`] has switched it on.
struct SearchParts;

impl<S> Layer<S> for SearchParts
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, _attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Born(Instant::now()));
        }
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(born) = span.extensions().get::<Born>().map(|b| b.0) else { return };
        if !RECORDING.load(Ordering::Relaxed) {
            return;
        }
        let us = born.elapsed().as_secs_f64() * 1e6;
        if let Ok(mut times) = TIMES.lock() {
            times.entry(span.name()).or_default().push(us);
        }
    }
}

/// The recording layer, filtered to the search spans (at any level) while recording is on: add
/// it to the process's subscriber once.
pub fn layer<S>() -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    // Which callsites are search spans is known once per callsite; whether to record, per span.
    let filter =
        tracing_subscriber::filter::DynFilterFn::new(|meta, _| meta.is_span() && RECORDING.load(Ordering::Relaxed)).with_callsite_filter(|meta| {
            if meta.is_span() && is_search_span(meta.name()) {
                tracing::subscriber::Interest::sometimes()
            } else {
                tracing::subscriber::Interest::never()
            }
        });
    SearchParts.with_filter(filter)
}

/// Forgets what was recorded and records from now on.
pub fn start() {
    if let Ok(mut times) = TIMES.lock() {
        times.clear();
    }
    RECORDING.store(true, Ordering::Relaxed);
}

/// Stops recording and summarises what was recorded since [`start`] (empty when nothing was:
/// no search step ran, or no subscriber carries [`layer`]).
pub fn take(rank: usize) -> SearchPartsSummary {
    RECORDING.store(false, Ordering::Relaxed);
    let times = TIMES.lock().map(|mut t| std::mem::take(&mut *t)).unwrap_or_default();
    SearchPartsSummary::of(rank, &times)
}

/// One part of a search step as the recording saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchPart {
    /// The span's name (`search` for the whole step, `search.<part>` for its parts).
    pub name: String,
    /// How often it ran per search step (parts per rank run once per rank this process drives;
    /// an all-gather once per collective).
    pub per_search: f64,
    /// Its median time, µs.
    pub median_us: f64,
    /// Its time per search step (the sum over the recording divided by the search steps), µs.
    pub us_per_search: f64,
}

/// The search parts of one process (its first rank): medians of the recorded search steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchPartsSummary {
    /// The first rank this process drives.
    pub rank: usize,
    /// Search steps recorded (lifetimes of the `search` span).
    pub searches: usize,
    /// Every part, by name.
    pub parts: Vec<SearchPart>,
}

impl SearchPartsSummary {
    /// The summary of `times` (µs per span name), for the process of `rank`.
    pub fn of(rank: usize, times: &BTreeMap<&'static str, Vec<f64>>) -> Self {
        let searches = times.get(SEARCH).map_or(0, Vec::len);
        let per = searches.max(1) as f64;
        let parts = times
            .iter()
            .filter_map(|(name, t)| {
                let median_us = crate::bench::stats::Summary::of(t)?.median;
                Some(SearchPart { name: (*name).to_owned(), per_search: t.len() as f64 / per, median_us, us_per_search: t.iter().sum::<f64>() / per })
            })
            .collect();
        Self { rank, searches, parts }
    }

    /// The summary's lines: one per part, by name, so that a part's pieces follow it.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "rank {}: {} search steps recorded (median µs of one, µs per search step, times per search step)",
            self.rank, self.searches
        )];
        for p in &self.parts {
            out.push(format!("  {:<32} {:>9.1} {:>9.1} {:>5.1}", p.name, p.median_us, p.us_per_search, p.per_search));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn only_search_and_its_dotted_parts_are_search_spans() {
        assert!(is_search_span("search"));
        assert!(is_search_span("search.merge.wait"));
        assert!(!is_search_span("searches"));
        assert!(!is_search_span("search_x"));
        assert!(!is_search_span("replan"));
    }

    #[test]
    fn recorded_spans_are_summarised_by_name_and_nothing_is_recorded_when_off() {
        let subscriber = tracing_subscriber::registry().with(layer());
        tracing::subscriber::with_default(subscriber, || {
            // Off: nothing recorded.
            let _ = tracing::debug_span!("search").entered();
            start();
            for _ in 0..3 {
                let _step = tracing::debug_span!("search").entered();
                for _ in 0..2 {
                    let _part = tracing::debug_span!("search.update").entered();
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                let _other = tracing::debug_span!("unrelated").entered();
            }
            let s = take(1);
            assert_eq!(s.rank, 1);
            assert_eq!(s.searches, 3);
            let names: Vec<&str> = s.parts.iter().map(|p| p.name.as_str()).collect();
            assert_eq!(names, ["search", "search.update"], "only the search spans, by name");
            let update = &s.parts[1];
            assert_eq!(update.per_search, 2.0);
            assert!(update.median_us >= 2000.0, "{update:?}");
            assert!(s.parts[0].median_us >= 2.0 * update.median_us, "the step holds both parts: {s:?}");
            assert!((update.us_per_search - 2.0 * update.median_us).abs() < update.median_us, "{update:?}");
            // Off again after `take`.
            let _ = tracing::debug_span!("search").entered();
            assert_eq!(take(1).searches, 0);
            assert!(s.lines()[2].trim_start().starts_with("search.update"));
        });
    }
}
