//! Kubernetes names, UCloud-compatible: VolcanoJob `j-<jobId>`, task `job`, container `user-job`, pods
//! `j-<jobId>-job-<rank>` with hostnames `j-<jobId>-job-<rank>.j-<jobId>`; and the deterministic
//! per-owner namespace and per-project queue names. Also the small syntax checks Kubernetes applies to
//! names, labels, quantities and CIDRs, so the pipeline can refuse what the API server would reject.

use sha2::{Digest, Sha256};

use crate::messages::v1::Owner;

/// The one Volcano task of every job.
pub const TASK_NAME: &str = "job";
/// The container the user's program runs in; logs are read from it.
pub const USER_CONTAINER: &str = "user-job";
/// `app.kubernetes.io/managed-by` value on everything volcano-runner creates, so it can list its own.
pub const MANAGED_BY: &str = "volcano-runner";
/// The standard label key for [`MANAGED_BY`].
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// `j-<jobId>`: the VolcanoJob, its headless Service and its pods' subdomain.
pub fn vcjob_name(job_id: &str) -> String {
    format!("j-{job_id}")
}

/// The job id back from a VolcanoJob name, or `None` for a name volcano-runner did not make.
pub fn job_id_from_vcjob_name(name: &str) -> Option<&str> {
    name.strip_prefix("j-").filter(|id| !id.is_empty())
}

/// `j-<jobId>-job-<rank>`: the pod of one rank (Volcano names pods `<job>-<task>-<index>`).
pub fn pod_name(job_id: &str, rank: u32) -> String {
    format!("j-{job_id}-{TASK_NAME}-{rank}")
}

/// `j-<jobId>-job-<rank>.j-<jobId>`: the rank's hostname, resolvable inside its namespace through the
/// headless Service Volcano's `svc` plugin creates. Deterministic, so it can be written before any pod
/// exists.
pub fn rank_hostname(job_id: &str, rank: u32) -> String {
    format!("j-{job_id}-{TASK_NAME}-{rank}.j-{job_id}")
}

/// The rank of a pod from its name (`j-<jobId>-job-<rank>`), if the name has that shape.
pub fn rank_from_pod_name(job_id: &str, pod_name: &str) -> Option<u32> {
    pod_name
        .strip_prefix("j-")?
        .strip_prefix(job_id)?
        .strip_prefix("-job-")?
        .parse()
        .ok()
}

/// Hex of the SHA-256 of `data`, first `len` characters.
pub(crate) fn short_hash(data: &[u8], len: usize) -> String {
    let digest = Sha256::digest(data);
    let mut out = String::with_capacity(64);
    for byte in digest {
        out.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
    }
    out.truncate(len);
    out
}

/// Length of the hash in owner-derived names: 12 hex digits (48 bits) keep names of distinct owners
/// apart even when their readable parts sanitise to the same text.
const OWNER_HASH_LEN: usize = 12;

/// What an owner-derived name is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerKind {
    /// A user without a project.
    User,
    /// A project.
    Project,
}

impl OwnerKind {
    /// The owner that decides the namespace: the project when there is one, else the user.
    pub fn of(owner: &Owner) -> (Self, &str) {
        match owner.project.as_deref() {
            Some(project) if !project.is_empty() => (Self::Project, project),
            _ => (Self::User, owner.user.as_str()),
        }
    }

    /// `u` or `p`.
    pub fn letter(self) -> char {
        match self {
            Self::User => 'u',
            Self::Project => 'p',
        }
    }

    /// `user` or `project`, for labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Project => "project",
        }
    }
}

/// `<prefix><u|p>-<sanitised owner>-<hash>`: a DNS-1123 label of at most 63 characters for any owner
/// name. The readable part helps operators; the hash of the kind and the exact name keeps distinct owners
/// apart (e.g. `Alice` and `alice`, or a user and a project with the same name).
pub fn owner_scoped_name(prefix: &str, kind: OwnerKind, owner: &str) -> String {
    let hash = short_hash(
        format!("{}:{owner}", kind.as_str()).as_bytes(),
        OWNER_HASH_LEN,
    );
    // prefix + "u-" + readable + "-" + hash <= 63
    let budget = 63usize.saturating_sub(prefix.len() + 2 + 1 + OWNER_HASH_LEN);
    let readable = sanitise(owner, budget);
    let mut name = String::with_capacity(63);
    name.push_str(prefix);
    name.push(kind.letter());
    name.push('-');
    if !readable.is_empty() {
        name.push_str(&readable);
        name.push('-');
    }
    name.push_str(&hash);
    name
}

/// The namespace of an owner in per-owner mode.
pub fn owner_namespace(prefix: &str, owner: &Owner) -> String {
    let (kind, name) = OwnerKind::of(owner);
    owner_scoped_name(prefix, kind, name)
}

/// Lowercase letters and digits of `text`, other runs of characters as one `-`, no leading or trailing
/// `-`, at most `max` characters.
fn sanitise(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(max.min(text.len()));
    let mut dash = false;
    for c in text.chars() {
        if out.len() >= max {
            break;
        }
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            if dash && !out.is_empty() {
                if out.len() + 1 >= max {
                    break;
                }
                out.push('-');
            }
            dash = false;
            out.push(c);
        } else {
            dash = true;
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// RFC 1123 label: 1–63 lowercase letters, digits and `-`, starting and ending with a letter or digit.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// RFC 1035 label (Service names): a DNS-1123 label that starts with a letter.
pub fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// RFC 1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// A label value: empty, or up to 63 of `[A-Za-z0-9_.-]` starting and ending alphanumeric.
pub fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    b.is_empty()
        || (b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric())
}

/// A label or annotation key: `[prefix/]name`, prefix a DNS subdomain, name a non-empty label value.
pub fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    prefix.is_none_or(is_dns1123_subdomain) && !name.is_empty() && is_label_value(name)
}

/// A Kubernetes resource quantity such as `500m`, `16Mi`, `1G`, `2`, `1.5`, `1e3`.
pub fn is_quantity(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    let valid_number = !number.is_empty()
        && number != "."
        && number.matches('.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit());
    let valid_suffix = matches!(
        suffix,
        "" | "Ki"
            | "Mi"
            | "Gi"
            | "Ti"
            | "Pi"
            | "Ei"
            | "n"
            | "u"
            | "m"
            | "k"
            | "M"
            | "G"
            | "T"
            | "P"
            | "E"
    ) || suffix
        .strip_prefix(['e', 'E'])
        .map(|exp| {
            let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            !exp.is_empty() && exp.chars().all(|c| c.is_ascii_digit())
        })
        .unwrap_or(false);
    valid_number && valid_suffix
}

/// An IPv4 or IPv6 CIDR such as `10.0.0.0/8`.
pub fn is_cidr(s: &str) -> bool {
    let Some((addr, bits)) = s.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => bits <= 32,
        Ok(std::net::IpAddr::V6(_)) => bits <= 128,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(user: &str, project: Option<&str>) -> Owner {
        Owner {
            user: user.into(),
            project: project.map(Into::into),
        }
    }

    #[test]
    fn job_names_follow_ucloud() {
        assert_eq!(vcjob_name("42"), "j-42");
        assert_eq!(pod_name("42", 3), "j-42-job-3");
        assert_eq!(rank_hostname("42", 1), "j-42-job-1.j-42");
        assert_eq!(job_id_from_vcjob_name("j-42"), Some("42"));
        assert_eq!(job_id_from_vcjob_name("x-42"), None);
        assert_eq!(rank_from_pod_name("42", "j-42-job-7"), Some(7));
        assert_eq!(rank_from_pod_name("42", "j-421-job-7"), None);
        assert_eq!(rank_from_pod_name("4", "j-42-job-7"), None);
    }

    #[test]
    fn owner_namespaces_are_readable_and_distinct() {
        let alice = owner_namespace("app-", &owner("alice", None));
        assert!(alice.starts_with("app-u-alice-"), "{alice}");
        assert!(is_dns1123_label(&alice));
        let project = owner_namespace("app-", &owner("alice", Some("p1")));
        assert!(project.starts_with("app-p-p1-"), "{project}");
        let upper = owner_namespace("app-", &owner("Alice", None));
        assert_ne!(alice, upper, "case must not merge owners");
        let user_named_p1 = owner_namespace("app-", &owner("p1", None));
        assert_ne!(
            project, user_named_p1,
            "user and project with one name differ"
        );
    }

    #[test]
    fn hostile_owner_names_still_make_labels() {
        for name in ["", "---", "Ærø Øst", &"x".repeat(300), "a.b@c.d", "🙂"] {
            let ns = owner_namespace("app-", &owner(name, None));
            assert!(is_dns1123_label(&ns), "{name:?} gave {ns:?}");
        }
        let ns = owner_namespace("", &owner("---", None));
        assert!(is_dns1123_label(&ns), "{ns}");
    }

    #[test]
    fn syntax_checks() {
        assert!(
            is_quantity("500m") && is_quantity("16Mi") && is_quantity("1G") && is_quantity("1.5")
        );
        assert!(is_quantity("1e3") && !is_quantity("1x") && !is_quantity("") && !is_quantity("Mi"));
        assert!(
            is_cidr("10.0.0.0/8") && is_cidr("::/0") && !is_cidr("10.0.0.0/33") && !is_cidr("x/1")
        );
        assert!(is_qualified_name("ucloud.dk/machine") && is_qualified_name("app"));
        assert!(!is_qualified_name("ucloud.dk/") && !is_qualified_name("Bad_/x"));
        assert!(is_label_value("") && is_label_value("u1-standard") && !is_label_value("-x"));
        assert!(is_dns1035_label("db") && !is_dns1035_label("1db"));
    }
}
