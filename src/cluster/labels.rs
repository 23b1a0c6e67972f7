//! Labels on the runner's own bookkeeping objects, and the name checks Kubernetes applies.
//!
//! The runner's internal objects (tombstones, the pause switch, leases) use the well-known
//! `app.kubernetes.io/*` labels plus a few `volcano-runner/*` keys, independent of the job annotation
//! prefix (`ucloud.dk/`), which belongs to the pipeline.

/// Well-known label naming the tool that manages an object.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY`] on everything volcano-runner creates.
pub const MANAGER: &str = "volcano-runner";
/// Well-known label saying what an object is for (`tombstone`, `pause-switch`, `shard-lease`, ...).
pub const COMPONENT: &str = "app.kubernetes.io/component";
/// Label grouping the leases of one runner deployment (the lease name prefix).
pub const LEASE_GROUP: &str = "volcano-runner/lease-group";
/// Annotation on a runner's member lease: what keeps the runner from its work, in words for an operator
/// (absent when nothing), for `admin status` to show. Today: `no queue receives compute.events`.
pub const RUNNER_PROBLEM: &str = "volcano-runner/problem";
/// Annotation on a shard lease, valued with the identity of the runner that wrote it while holding
/// the shard: that runner's monitor tells the QUEUED of a job created with `<prefix>queuedBy: monitor`
/// (docs/monitor.md, *Order of a job's events*). A runner older than that writes no such annotation,
/// and keeps the one it finds when it takes a lease over (its writes copy the lease), so the value
/// counts only while it names the lease's holder: a submit path leaves a job's QUEUED to the holder
/// only then, and otherwise tells QUEUED itself (a rolling upgrade, docs/ops.md).
pub const TELLS_QUEUED: &str = "volcano-runner/tells-queued";
/// Annotation on a shard lease: the jobs of the shard whose QUEUED its holder had confirmed by the
/// broker and whose record of that (`<prefix>queuedConfirmed`) still rides on its monitor's next write of
/// the job, as `<namespace>/<name>@<confirmed, ms since the epoch>` separated by spaces. Written with every
/// write of the holder (no request of its own); a runner that takes the shard over from a holder that
/// died reads it and sends no copy of those QUEUEDs (docs/monitor.md, *When QUEUED goes out twice*;
/// [`crate::monitor::queued`]).
pub const QUEUED_CARRIED: &str = "volcano-runner/queued-carried";
/// How many records [`QUEUED_CARRIED`] holds at most (the newest): some kilobytes with every write of a
/// lease. A record left out only costs a copy of QUEUED if its runner is killed while it carries it.
pub const QUEUED_CARRIED_MAX: usize = 256;
/// Label on a VolcanoJob once the monitor has nothing left to do for it: set in the write that removes
/// the cleanup finalizer, the last of a job's end. The monitor's job watch and lists exclude it
/// (`!volcano-runner/ended`), so a job kept for `ended_job_retention` as the record of its submission
/// costs a runner no memory and its reconciliation no list page; what is still read of ended jobs (a
/// redelivered submission's check, `job`, `logs`, admin) reads them by name or without it. Its finished
/// pods are not labelled (a write per pod): the pod lists leave finished pods out by a field selector
/// and the cache drops them with their job (see [`crate::monitor::live_pods`]).
pub const ENDED: &str = "volcano-runner/ended";

/// Annotation on a VolcanoJob that an attempt to submit it created and then rolled back (a later step
/// failed): written, with the attempt's cleanup finalizer taken off, just before the delete. The job will
/// never run; the submission's next delivery creates it afresh. Every reader passes such a job by: the
/// submit path does not take it for an ended job of the submission (it removes what is left of it and
/// tries again), and a monitor publishes nothing of it, neither its end nor that it vanished.
pub const ROLLED_BACK: &str = "volcano-runner/rolled-back";

/// Whether an object carries [`ROLLED_BACK`]: the one test every reader of a rolled-back job makes.
pub fn is_rolled_back(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ROLLED_BACK))
}

/// The field manager name used for every write, so `kubectl get -o yaml --show-managed-fields` shows who
/// wrote what.
pub const FIELD_MANAGER: &str = "volcano-runner";

/// Checks an RFC 1123 DNS label: what Kubernetes requires of namespace names, and what we require of
/// names we build objects from. Returns a reason a user can act on.
pub fn check_dns_label(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > 63 {
        return Err(format!(
            "must be at most 63 characters, not {}",
            value.len()
        ));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(format!(
            "{value:?} may contain only lower-case letters, digits and '-'"
        ));
    }
    if value.starts_with('-') || value.ends_with('-') {
        return Err(format!(
            "{value:?} must start and end with a letter or digit"
        ));
    }
    Ok(())
}

/// Whether a string can be a label value: at most 63 characters of `[A-Za-z0-9._-]`, beginning and
/// ending with an alphanumeric character (or empty).
pub fn is_label_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && value.as_bytes()[0].is_ascii_alphanumeric()
            && value.as_bytes()[value.len() - 1].is_ascii_alphanumeric())
}

/// Parses an equality label selector (`a=b,c=d`), the only form the runner's configuration needs. The
/// pairs are returned so the selector can also be checked against an object on this side.
pub fn parse_equality_selector(selector: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    for term in selector.split(',') {
        let term = term.trim();
        let Some((key, value)) = term.split_once('=') else {
            return Err(format!("{term:?} is not of the form key=value"));
        };
        let (key, value) = (key.trim(), value.trim_start_matches('=').trim());
        let name = key.rsplit('/').next().unwrap_or_default();
        if name.is_empty() || !is_label_value(name) || key.matches('/').count() > 1 {
            return Err(format!("{key:?} is not a valid label key"));
        }
        if !is_label_value(value) {
            return Err(format!("{value:?} is not a valid label value"));
        }
        pairs.push((key.to_owned(), value.to_owned()));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        assert!(check_dns_label("volcano-runner").is_ok());
        assert!(check_dns_label("a1").is_ok());
        assert!(check_dns_label("").is_err());
        assert!(check_dns_label("-a").is_err());
        assert!(check_dns_label("a-").is_err());
        assert!(check_dns_label("A").is_err());
        assert!(check_dns_label("a.b").is_err());
        assert!(check_dns_label(&"a".repeat(64)).is_err());
        assert!(check_dns_label(&"a".repeat(63)).is_ok());
    }

    #[test]
    fn label_values() {
        assert!(is_label_value(""));
        assert!(is_label_value("Job_1.a-b"));
        assert!(!is_label_value("-a"));
        assert!(!is_label_value("a/b"));
        assert!(!is_label_value(&"a".repeat(64)));
    }

    #[test]
    fn equality_selectors() {
        assert_eq!(
            parse_equality_selector("app.kubernetes.io/managed-by=volcano-runner, x==y").unwrap(),
            vec![
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    "volcano-runner".to_owned()
                ),
                ("x".to_owned(), "y".to_owned())
            ]
        );
        assert!(parse_equality_selector("a in (b)").is_err());
        assert!(parse_equality_selector("a/b/c=d").is_err());
        assert!(parse_equality_selector("a=b c").is_err());
        assert!(parse_equality_selector("").is_err());
    }
}
