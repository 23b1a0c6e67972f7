//! Names that end up in Kubernetes objects: job ids, host names, environment variable names.

/// The longest DNS-1123 label (RFC 1123): object names such as the VolcanoJob `j-<id>` and pod host names.
pub const DNS_LABEL_MAX: usize = 63;
/// The longest DNS-1123 subdomain: host aliases and public domains.
pub const DNS_SUBDOMAIN_MAX: usize = 253;

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    let inner = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-';
    let end = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= DNS_LABEL_MAX && end(first) && end(last) && bytes.iter().all(inner)
        }
        _ => false,
    }
}

/// Dot-separated DNS-1123 labels, at most 253 characters in all.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= DNS_SUBDOMAIN_MAX && s.split('.').all(is_dns_label)
}

/// A peer's host name, the one rule for validation and the runner: the runner makes it the hostname of an
/// endpoint of the job's peers Service, which its pods find by a bare name searched under that Service's
/// domain, so it is a DNS-1035 label (lower-case letters, digits and `-`, at most 63, starting with a
/// letter and ending with a letter or digit: no dots, since an endpoint's hostname is one label),
/// and it does not start with `j-`, the prefix of the job's own names (`j-<jobId>`, `j-<jobId>-job-<rank>`),
/// which the namespace's search domain would answer first.
pub fn is_peer_hostname(s: &str) -> bool {
    is_dns_label(s) && s.as_bytes()[0].is_ascii_lowercase() && !s.starts_with("j-")
}

/// An environment variable name as the Kubernetes API has long validated it: letters, digits, `_`, `-`
/// and `.`, not starting with a digit. (Recent API servers accept more; this rule works on every one.)
pub fn is_env_var_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    let allowed = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.');
    match bytes.first() {
        Some(first) => !first.is_ascii_digit() && bytes.iter().all(allowed),
        None => false,
    }
}

/// An origin as browsers serialize it, lower-case and without the scheme's default port:
/// `https://host[:port]`. `None` for `null`, another scheme, or anything with a path, user or query.
pub fn normalize_origin(origin: &str) -> Option<String> {
    let origin = origin.trim();
    let (scheme, rest) = origin.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "https" => "443",
        "http" => "80",
        _ => return None,
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() || rest.contains(['/', '?', '#', '@', ' ', ',']) {
        return None;
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (h, Some(p)),
        _ => (rest, None),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() {
        return None;
    }
    match port {
        Some(p) if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) => None,
        Some(p) if p.trim_start_matches('0') == default_port => Some(format!("{scheme}://{host}")),
        Some(p) => Some(format!("{scheme}://{host}:{}", p.trim_start_matches('0'))),
        None => Some(format!("{scheme}://{host}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DNS labels: lower case, dashes inside only, 63 characters at most.
    #[test]
    fn dns_labels() {
        for ok in ["a", "j-4817", "0", "a-b-c", &"x".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "ø", &"x".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    /// Subdomains are labels joined by dots, 253 characters at most.
    #[test]
    fn dns_subdomains() {
        for ok in ["postgres", "app-mylink.cloud.sdu.dk", "j-1-job-0.j-1"] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        let long = vec!["a".repeat(63); 4].join(".");
        assert_eq!(long.len(), 255);
        for bad in ["", "a..b", ".a", "a.", "Postgres", "my db", &long] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    /// Peer host names: Service names (no dots, no leading digit), never `j-...`.
    #[test]
    fn peer_hostnames() {
        for ok in ["postgres", "db-1", "j", "jupyter-j-2", &"p".repeat(63)] {
            assert!(is_peer_hostname(ok), "{ok}");
        }
        for bad in [
            "",
            "db.internal",
            "j-4817",
            "j-",
            "1db",
            "-db",
            "db-",
            "Db",
            &"p".repeat(64),
        ] {
            assert!(!is_peer_hostname(bad), "{bad}");
        }
    }

    /// Environment variable names.
    #[test]
    fn env_var_names() {
        for ok in ["OMP_NUM_THREADS", "_x", "a.b-c", "PATH2"] {
            assert!(is_env_var_name(ok), "{ok}");
        }
        for bad in ["", "1BAD", "A=B", "A B", "Ä"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }
}
