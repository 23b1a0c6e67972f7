//! Bounded retries of transient cluster errors.
//!
//! Every call to the API goes through [`RetryPolicy::run`] (one operation) or a [`Budget`] (several calls
//! that together make one step, such as applying a job's objects). Only [`ErrorClass::Retryable`]
//! errors are retried, with exponential backoff and jitter between `min_delay` and `max_delay`; a
//! server's `Retry-After` wins when it asks for longer. Each attempt is cut off after `request_timeout`.
//! When the next wait would end past the budget, the last error comes back wrapped in
//! [`ClusterError::GaveUp`], which is still retryable: the caller requeues the message instead of
//! failing the job.
//!
//! Time is `tokio::time`, so tests run on a paused clock.
//!
//! [`ErrorClass::Retryable`]: super::ErrorClass::Retryable

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio::time::Instant;

use super::{ClusterConfig, ClusterError};

/// How long and how often to retry. Built from `[cluster]` and `[cluster.retry]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Time after which no new attempt starts.
    pub max_elapsed: Duration,
    /// First backoff delay.
    pub min_delay: Duration,
    /// Cap on a backoff delay (not on a server's `Retry-After`).
    pub max_delay: Duration,
    /// Cut-off for a single attempt.
    pub request_timeout: Duration,
}

impl RetryPolicy {
    /// The policy the configuration describes.
    pub fn from_config(config: &ClusterConfig) -> Self {
        Self {
            max_elapsed: config.retry.max_elapsed,
            min_delay: config.retry.min_delay,
            max_delay: config.retry.max_delay,
            request_timeout: config.request_timeout,
        }
    }

    /// Starts a budget now, to be shared by the calls of one step.
    pub fn budget(&self) -> Budget<'_> {
        let started = Instant::now();
        Budget {
            policy: self,
            started,
            deadline: started + self.max_elapsed,
        }
    }

    /// Runs one operation with a budget of its own. `f` is called once per attempt; `op` names the
    /// operation in a timeout error.
    pub async fn run<T, F, Fut>(&self, op: &str, f: F) -> Result<T, ClusterError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ClusterError>>,
    {
        self.budget().run(op, f).await
    }
}

/// A deadline shared by several operations. Created by [`RetryPolicy::budget`].
#[derive(Debug)]
pub struct Budget<'a> {
    policy: &'a RetryPolicy,
    started: Instant,
    deadline: Instant,
}

impl Budget<'_> {
    /// Time left before no new attempt starts.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Runs one operation within this budget. See the module documentation.
    pub async fn run<T, F, Fut>(&self, op: &str, mut f: F) -> Result<T, ClusterError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ClusterError>>,
    {
        let attempts = AtomicU32::new(0);
        let timeout = self.policy.request_timeout;
        let attempt = || {
            attempts.fetch_add(1, Ordering::Relaxed);
            let fut = f();
            async move {
                match tokio::time::timeout(timeout, fut).await {
                    Ok(result) => result,
                    Err(_) => Err(ClusterError::Unavailable {
                        op: op.to_owned(),
                        message: format!("no answer within {timeout:?}"),
                        retry_after: None,
                    }),
                }
            }
        };
        let backoff = ExponentialBuilder::new()
            .with_jitter()
            .with_min_delay(self.policy.min_delay)
            .with_max_delay(self.policy.max_delay)
            .without_max_times();
        let result = attempt
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .when(ClusterError::is_retryable)
            .adjust(|err, delay| next_delay(delay, err.retry_after(), self.remaining()))
            .notify(|err, delay| {
                tracing::debug!(error = %err, ?delay, "Retrying a transient cluster error.");
            })
            .await;
        match result {
            Err(last) if last.is_retryable() => Err(ClusterError::GaveUp {
                attempts: attempts.load(Ordering::Relaxed),
                elapsed: self.started.elapsed(),
                last: Box::new(last),
            }),
            other => other,
        }
    }
}

/// The wait before the next attempt, or `None` to give up: the longer of the backoff delay and the
/// server's `Retry-After`, provided the next attempt can still start within the budget.
fn next_delay(
    backoff: Option<Duration>,
    retry_after: Option<Duration>,
    remaining: Duration,
) -> Option<Duration> {
    let delay = backoff?.max(retry_after.unwrap_or_default());
    (delay < remaining).then_some(delay)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_elapsed: Duration::from_secs(10),
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            request_timeout: Duration::from_secs(2),
        }
    }

    fn unavailable(retry_after: Option<Duration>) -> ClusterError {
        ClusterError::Unavailable {
            op: "create x".into(),
            message: "503".into(),
            retry_after,
        }
    }

    fn rejected() -> ClusterError {
        ClusterError::Rejected {
            op: "create x".into(),
            code: 422,
            reason: "Invalid".into(),
            message: "bad".into(),
        }
    }

    #[test]
    fn delay_is_the_longer_of_backoff_and_retry_after() {
        let s = Duration::from_secs;
        assert_eq!(next_delay(Some(s(1)), None, s(10)), Some(s(1)));
        assert_eq!(next_delay(Some(s(1)), Some(s(3)), s(10)), Some(s(3)));
        assert_eq!(next_delay(Some(s(4)), Some(s(3)), s(10)), Some(s(4)));
        assert_eq!(next_delay(Some(s(1)), Some(s(30)), s(10)), None);
        assert_eq!(next_delay(Some(s(1)), None, Duration::ZERO), None);
        assert_eq!(next_delay(None, None, s(10)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_until_success() {
        let calls = AtomicU32::new(0);
        let out = policy()
            .run("create x", || async {
                match calls.fetch_add(1, Ordering::SeqCst) {
                    0..=2 => Err(unavailable(None)),
                    _ => Ok("made"),
                }
            })
            .await;
        assert_eq!(out, Ok("made"));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_are_not_retried() {
        let calls = AtomicU32::new(0);
        let out: Result<(), _> = policy()
            .run("create x", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(rejected())
            })
            .await;
        assert_eq!(out, Err(rejected()));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn after_the_budget_the_error_is_still_retryable() {
        let start = Instant::now();
        let calls = AtomicU32::new(0);
        let out: Result<(), _> = policy()
            .run("create x", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(unavailable(None))
            })
            .await;
        let err = out.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        let ClusterError::GaveUp { attempts, last, .. } = &err else {
            panic!("expected GaveUp, got {err:?}");
        };
        assert_eq!(*attempts, calls.load(Ordering::SeqCst));
        assert!(*attempts > 3, "only {attempts} attempts");
        assert_eq!(**last, unavailable(None));
        let spent = start.elapsed();
        assert!(spent <= Duration::from_secs(10), "{spent:?}");
        assert!(spent >= Duration::from_secs(5), "{spent:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_honoured_when_longer() {
        let times = Mutex::new(Vec::new());
        let out = policy()
            .run("create x", || async {
                let mut t = times.lock().unwrap();
                t.push(Instant::now());
                if t.len() == 1 {
                    Err(unavailable(Some(Duration::from_secs(3))))
                } else {
                    Ok(())
                }
            })
            .await;
        assert_eq!(out, Ok(()));
        let t = times.lock().unwrap();
        let gap = t[1] - t[0];
        assert!(gap >= Duration::from_secs(3), "{gap:?}");
        assert!(gap < Duration::from_secs(4), "{gap:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_beyond_the_budget_gives_up_at_once() {
        let start = Instant::now();
        let out: Result<(), _> = policy()
            .run("create x", || async {
                Err(unavailable(Some(Duration::from_secs(60))))
            })
            .await;
        assert!(matches!(out, Err(ClusterError::GaveUp { attempts: 1, .. })));
        assert!(start.elapsed() < Duration::from_millis(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_request_times_out_and_is_retried() {
        let calls = AtomicU32::new(0);
        let out = policy()
            .run("get x", || async {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    std::future::pending::<()>().await;
                }
                Ok(5)
            })
            .await;
        assert_eq!(out, Ok(5));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shared_budget_spans_several_operations() {
        let p = policy();
        let budget = p.budget();
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert!(budget.remaining() <= Duration::from_secs(2));
        let out: Result<(), _> = budget
            .run("create y", || async { Err(unavailable(None)) })
            .await;
        let Err(ClusterError::GaveUp { attempts, .. }) = out else {
            panic!("expected GaveUp");
        };
        assert!(
            attempts < 8,
            "{attempts} attempts in the last 2 s of the budget"
        );
    }
}
