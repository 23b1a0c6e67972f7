//! Name, label and annotation rules of Kubernetes (`k8s.io/apimachinery/pkg/util/validation`), with the
//! messages the API server prints, so that a name a real cluster would refuse is refused here too.

/// Which rule an object's name follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain: most objects (pods, configmaps, custom resources).
    Subdomain,
    /// RFC 1123 label: namespaces.
    Label,
    /// RFC 1035 label (starts with a letter): services.
    Dns1035,
    /// Path-segment names only (events, leases allow any name without `/` or `%`).
    PathSegment,
}

/// The API server's text for a name that is not an RFC 1123 label.
pub const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
/// The API server's text for a name that is not an RFC 1123 subdomain.
pub const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
/// The API server's text for a name that is not an RFC 1035 label (services).
pub const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn is_lower_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn label_shape(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| is_lower_alnum(c) || c == '-')
        && s.starts_with(is_lower_alnum)
        && s.ends_with(is_lower_alnum)
}

/// `validation.IsDNS1123Label`: the list of problems, empty when valid.
pub fn dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !label_shape(s) {
        errs.push(DNS1123_LABEL_MSG.to_string());
    }
    errs
}

/// `validation.IsDNS1123Subdomain`.
pub fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if s.is_empty() || !s.split('.').all(label_shape) {
        errs.push(DNS1123_SUBDOMAIN_MSG.to_string());
    }
    errs
}

/// `validation.IsDNS1035Label`.
pub fn dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !label_shape(s) || !s.starts_with(|c: char| c.is_ascii_lowercase()) {
        errs.push(DNS1035_LABEL_MSG.to_string());
    }
    errs
}

fn qualified_part(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// `validation.IsQualifiedName`: label and annotation keys, `[prefix/]name`.
pub fn qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            errs.push("prefix part must be non-empty".to_string());
        } else {
            for e in dns1123_subdomain(prefix) {
                errs.push(format!("prefix part {e}"));
            }
        }
        if name.contains('/') {
            errs.push(format!(
                "a qualified name {QUALIFIED_NAME_MSG} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            ));
            return errs;
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    }
    if !name.is_empty() && !qualified_part(name) {
        errs.push(QUALIFIED_NAME_MSG.to_string());
    }
    errs
}

/// `validation.IsValidLabelValue`.
pub fn label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !s.is_empty() && !qualified_part(s) {
        errs.push(LABEL_VALUE_MSG.to_string());
    }
    errs
}

/// Problems with an object name under `rule`.
pub fn check_name(rule: NameRule, name: &str) -> Vec<String> {
    match rule {
        NameRule::Subdomain => dns1123_subdomain(name),
        NameRule::Label => dns1123_label(name),
        NameRule::Dns1035 => dns1035_label(name),
        NameRule::PathSegment => {
            if name == "." || name == ".." {
                vec![format!("may not be {name:?}")]
            } else if name.contains('/') || name.contains('%') {
                vec![format!(
                    "may not contain '{}'",
                    if name.contains('/') { "/" } else { "%" }
                )]
            } else {
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert!(dns1123_label("j-42").is_empty());
        assert!(dns1123_label("job").is_empty());
        assert_eq!(dns1123_label("Job"), vec![DNS1123_LABEL_MSG.to_string()]);
        assert_eq!(dns1123_label("-a").len(), 1);
        assert_eq!(dns1123_label(&"a".repeat(64)).len(), 1);
        assert_eq!(dns1123_label("").len(), 1);
    }

    #[test]
    fn subdomains() {
        assert!(dns1123_subdomain("j-42.example").is_empty());
        assert!(!dns1123_subdomain("a..b").is_empty());
        assert!(!dns1123_subdomain("under_score").is_empty());
    }

    #[test]
    fn dns1035_needs_a_letter_first() {
        assert!(dns1035_label("j-42").is_empty());
        assert!(!dns1035_label("42-j").is_empty());
    }

    #[test]
    fn qualified_names() {
        assert!(qualified_name("volcano.sh/job-name").is_empty());
        assert!(qualified_name("app").is_empty());
        assert!(!qualified_name("ucloud.dk/").is_empty());
        assert!(!qualified_name("Bad_Prefix/x").is_empty());
        assert!(!qualified_name("a/b/c").is_empty());
    }

    #[test]
    fn label_values() {
        assert!(label_value("").is_empty());
        assert!(label_value("alice_1.x").is_empty());
        assert!(!label_value("alice@example.com").is_empty());
        assert!(!label_value(&"x".repeat(64)).is_empty());
    }
}
