//! The arithmetic of the benchmark, without I/O: latency percentiles and sustained rates from the
//! instants the observers recorded.

use std::time::Duration;

use serde::Serialize;

/// Percentiles of a latency sample, in milliseconds (what people compare against a target).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Latency {
    pub count: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    /// Nearest-rank percentiles of `sample` (sorted here). `None` for an empty sample, so a phase that
    /// observed nothing reports no figures rather than zeros that look like a result.
    pub fn of(sample: &mut [Duration]) -> Option<Latency> {
        if sample.is_empty() {
            return None;
        }
        sample.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        Some(Latency {
            count: sample.len(),
            p50_ms: ms(nearest_rank(sample, 50.0)),
            p95_ms: ms(nearest_rank(sample, 95.0)),
            p99_ms: ms(nearest_rank(sample, 99.0)),
            max_ms: ms(sample[sample.len() - 1]),
        })
    }
}

/// The nearest-rank percentile of a sorted, non-empty sample: the smallest value with at least `p`
/// percent of the sample at or below it.
fn nearest_rank(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Jobs per second over the steady part of a run: between the completion of the first and the last
/// tenth of the jobs (offsets from the phase's start, in any order). Start-up (connections, the first
/// namespace, caches filling) and the tail (the last runner finishing its prefetch) are what a long run
/// would not see; a run with fewer than 20 completions uses the whole span.
pub fn sustained_rate(completions: &mut [Duration]) -> Option<f64> {
    let window = steady_window(completions)?;
    Some(window.jobs as f64 / window.span().as_secs_f64())
}

/// The steady part of a run that [`sustained_rate`] measures: from the completion of the first tenth
/// of the jobs to that of the last tenth (the whole span under 20 completions), and how many jobs
/// completed in it after its start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SteadyWindow {
    pub start: Duration,
    pub end: Duration,
    pub jobs: usize,
}

impl SteadyWindow {
    pub fn span(&self) -> Duration {
        self.end.saturating_sub(self.start)
    }
}

/// The steady window of `completions` (sorted here); `None` with fewer than two completions or when
/// they all fall at one instant, where no rate can be told.
pub fn steady_window(completions: &mut [Duration]) -> Option<SteadyWindow> {
    if completions.len() < 2 {
        return None;
    }
    completions.sort_unstable();
    let n = completions.len();
    let (first, last) = if n < 20 {
        (0, n - 1)
    } else {
        (n / 10, n - 1 - n / 10)
    };
    let window = SteadyWindow {
        start: completions[first],
        end: completions[last],
        jobs: last - first,
    };
    (!window.span().is_zero()).then_some(window)
}

/// The share of a monitored phase's steady QUEUED window (`queued`: its QUEUED instants) that came
/// after its first terminal event (`ends`: its terminal instants, same origin), from 0 to 1.
///
/// Only from its first job's end on does a runner carry every stage of monitoring at once (RUNNING for
/// the jobs just started, the final tick, the end and its records for the jobs started a run time
/// ago); before it, it does part of the duty. A QUEUED rate measured while monitoring is partly
/// ahead, as in a phase shorter than a few run times, flatters the runner. `None` when the phase has
/// no steady window; 0 when no job ended before the window closed.
pub fn monitoring_overlap(queued: &mut [Duration], ends: &[Duration]) -> Option<f64> {
    let window = steady_window(queued)?;
    let Some(first_end) = ends.iter().min() else {
        return Some(0.0);
    };
    let overlapped = window.end.saturating_sub((*first_end).max(window.start));
    Some(overlapped.as_secs_f64() / window.span().as_secs_f64())
}

/// The median of `values` (the mean of the middle two for an even count); `None` for none. For
/// figures of whole phases (a few trials' ratios), where the nearest rank of [`Latency`] would pick one
/// trial's value over another's for no reason.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// `count` operations in `elapsed`, per second.
pub fn rate(count: usize, elapsed: Duration) -> f64 {
    if elapsed.is_zero() {
        return f64::INFINITY;
    }
    count as f64 / elapsed.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let mut sample: Vec<Duration> = (1..=100).rev().map(ms).collect();
        let l = Latency::of(&mut sample).unwrap();
        assert_eq!(l.count, 100);
        assert_eq!(l.p50_ms, 50.0);
        assert_eq!(l.p95_ms, 95.0);
        assert_eq!(l.p99_ms, 99.0);
        assert_eq!(l.max_ms, 100.0);

        let mut three = vec![ms(30), ms(10), ms(20)];
        let l = Latency::of(&mut three).unwrap();
        assert_eq!((l.p50_ms, l.p95_ms, l.p99_ms), (20.0, 30.0, 30.0));
        assert!(Latency::of(&mut []).is_none());
    }

    #[test]
    fn sustained_rate_leaves_out_start_and_tail() {
        // 100 jobs: a slow start (the first 10 over a second), then one every 10 ms, then a slow tail.
        let mut done: Vec<Duration> = (0..10).map(|i| ms(i * 100)).collect();
        done.extend((0..80).map(|i| ms(1000 + i * 10)));
        done.extend((0..10).map(|i| ms(1800 + i * 500)));
        let rate = sustained_rate(&mut done).unwrap();
        // Between the 11th (1000 ms) and the 90th (1790 ms... the 90th of the sorted sample, index 89).
        assert!((rate - 79.0 / 0.79).abs() < 1e-6, "{rate}");
        assert!(sustained_rate(&mut [ms(5)]).is_none());
        assert!(sustained_rate(&mut [ms(5), ms(5)]).is_none());
        assert_eq!(sustained_rate(&mut [ms(0), ms(500), ms(1000)]), Some(2.0));
    }

    /// A quick phase (1,000 submissions at 800/s, jobs of 2 s) has its steady window closed before any
    /// job ends: nothing of the ends' monitoring overlaps the rate measured. A long one (4,000 at
    /// 300/s) overlaps most of it; the window's start bounds the share at 1.
    #[test]
    fn the_monitoring_overlap_is_the_share_of_the_steady_window_after_the_first_end() {
        let phase = |jobs: u64, per_s: u64, run_ms: u64| {
            let queued: Vec<Duration> = (0..jobs).map(|i| ms(i * 1000 / per_s)).collect();
            let ends: Vec<Duration> = queued.iter().map(|q| *q + ms(run_ms)).collect();
            (queued, ends)
        };
        let (mut queued, ends) = phase(1000, 800, 2100);
        assert_eq!(monitoring_overlap(&mut queued, &ends), Some(0.0));
        let (mut queued, ends) = phase(4000, 300, 2100);
        let overlap = monitoring_overlap(&mut queued, &ends).unwrap();
        // Window 1,333..11,996 ms, first end at 2,100 ms.
        assert!(
            (overlap - (11_996.0 - 2_100.0) / (11_996.0 - 1_333.0)).abs() < 1e-3,
            "{overlap}"
        );
        let (mut queued, ends) = phase(4000, 300, 0);
        assert_eq!(monitoring_overlap(&mut queued, &ends), Some(1.0));
        // No end at all (an incomplete phase): nothing overlapped; no window: nothing to tell.
        let (mut queued, _) = phase(100, 100, 0);
        assert_eq!(monitoring_overlap(&mut queued, &[]), Some(0.0));
        assert_eq!(monitoring_overlap(&mut [ms(3)], &[ms(5)]), None);
    }

    #[test]
    fn the_steady_window_is_what_the_sustained_rate_measures() {
        let mut done: Vec<Duration> = (0..100).rev().map(|i| ms(i * 10)).collect();
        let w = steady_window(&mut done).unwrap();
        assert_eq!((w.start, w.end, w.jobs), (ms(100), ms(890), 79));
        assert_eq!(sustained_rate(&mut done), Some(79.0 / 0.79));
        assert!(steady_window(&mut [ms(5), ms(5)]).is_none());
    }

    #[test]
    fn the_median_is_the_middle_value_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[0.9, 0.5, 0.85]), Some(0.85));
        let middle = median(&[0.9, 0.5, 0.85, 0.6]).unwrap();
        assert!(
            (middle - 0.725).abs() < 1e-12,
            "the middle two's mean: {middle}"
        );
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn rate_counts_per_second() {
        assert_eq!(rate(500, Duration::from_millis(250)), 2000.0);
        assert!(rate(1, Duration::ZERO).is_infinite());
    }
}
