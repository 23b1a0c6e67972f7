//! A parser for container image references, following the grammar of the distribution project's
//! `reference` package:
//!
//! ```text
//! reference        := name [ ":" tag ] [ "@" digest ]
//! name             := [ domain "/" ] path-component { "/" path-component }     (at most 255 characters)
//! domain           := host [ ":" port ]
//! host             := domain-name | "[" IPv6 address "]"
//! domain-name      := domain-component { "." domain-component }
//! domain-component := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
//! path-component   := [a-z0-9]+ { separator [a-z0-9]+ }
//! separator        := "." | "_" | "__" | "-"+
//! tag              := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
//! digest           := algorithm ":" [0-9a-fA-F]{32,}
//! algorithm        := [A-Za-z][A-Za-z0-9]* { [+._-] [A-Za-z][A-Za-z0-9]* }
//! ```
//!
//! As in Docker, the first component is the registry when there is more than one component and it
//! contains a `.` or a `:`, is `localhost`, or has an upper-case letter; it must then be a valid domain.

use std::fmt;

/// A well-formed image reference, split into its parts (borrowed from the input).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageReference<'a> {
    /// The registry, e.g. `dreg.cloud.sdu.dk` or `localhost:5000`; `None` for Docker Hub short names.
    pub domain: Option<&'a str>,
    /// The repository path below the registry, e.g. `ucloud/figlet`.
    pub path: &'a str,
    pub tag: Option<&'a str>,
    pub digest: Option<&'a str>,
}

/// What is wrong with an image reference, in words for the person who wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageError {
    Empty,
    TooLong(usize),
    Digest(String),
    Tag(String),
    Domain(String),
    PathComponent(String),
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageError::Empty => f.write_str("the image reference is empty"),
            ImageError::TooLong(n) => {
                write!(
                    f,
                    "the repository name is {n} characters long, at most 255 are allowed"
                )
            }
            ImageError::Digest(d) => write!(
                f,
                "invalid digest {d:?}: expected <algorithm>:<at least 32 hex digits>, e.g. sha256:<64 hex digits>"
            ),
            ImageError::Tag(t) => write!(
                f,
                "invalid tag {t:?}: at most 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'"
            ),
            ImageError::Domain(d) => write!(
                f,
                "invalid registry {d:?}: expected a host name or [IPv6 address], optionally with :port"
            ),
            ImageError::PathComponent(c) => write!(
                f,
                "invalid repository path component {c:?}: lower-case letters and digits, separated by \
                 '.', '_', '__' or dashes"
            ),
        }
    }
}

impl std::error::Error for ImageError {}

/// Parses an image reference. Pure; never panics.
pub fn parse(reference: &str) -> Result<ImageReference<'_>, ImageError> {
    if reference.is_empty() {
        return Err(ImageError::Empty);
    }
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => {
            if !is_digest(digest) {
                return Err(ImageError::Digest(digest.to_owned()));
            }
            (rest, Some(digest))
        }
        None => (reference, None),
    };
    // A ':' after the last '/' separates the tag; one before it belongs to a registry port.
    let last_slash = rest.rfind('/');
    let (name, tag) = match rest.rfind(':') {
        Some(colon) if last_slash.is_none_or(|slash| colon > slash) => {
            (&rest[..colon], Some(&rest[colon + 1..]))
        }
        _ => (rest, None),
    };
    if let Some(tag) = tag.filter(|t| !is_tag(t)) {
        return Err(ImageError::Tag(tag.to_owned()));
    }
    if name.is_empty() {
        return Err(ImageError::PathComponent(String::new()));
    }
    if name.len() > 255 {
        return Err(ImageError::TooLong(name.len()));
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, path)) if looks_like_domain(first) => {
            if !is_domain(first) {
                return Err(ImageError::Domain(first.to_owned()));
            }
            (Some(first), path)
        }
        _ => (None, name),
    };
    if let Some(bad) = path.split('/').find(|c| !is_path_component(c)) {
        return Err(ImageError::PathComponent(bad.to_owned()));
    }
    Ok(ImageReference {
        domain,
        path,
        tag,
        digest,
    })
}

fn looks_like_domain(first: &str) -> bool {
    first.contains(['.', ':'])
        || first == "localhost"
        || first.bytes().any(|b| b.is_ascii_uppercase())
}

fn is_domain(domain: &str) -> bool {
    let is_port = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if let Some(bracketed) = domain.strip_prefix('[') {
        // "[IPv6]" or "[IPv6]:port"
        let Some((address, after)) = bracketed.split_once(']') else {
            return false;
        };
        let port_ok = after.is_empty() || after.strip_prefix(':').is_some_and(is_port);
        return port_ok && address.parse::<std::net::Ipv6Addr>().is_ok();
    }
    let (host, port_ok) = match domain.split_once(':') {
        Some((host, port)) => (host, is_port(port)),
        None => (domain, true),
    };
    port_ok && host.split('.').all(is_domain_component)
}

fn is_domain_component(c: &str) -> bool {
    let bytes = c.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        }
        _ => false,
    }
}

/// `[a-z0-9]+ (separator [a-z0-9]+)*` with separator `.`, `_`, `__` or one or more `-`.
fn is_path_component(c: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    let mut i = 0;
    loop {
        // A run of alphanumerics.
        let start = i;
        while i < bytes.len() && alnum(bytes[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == bytes.len() {
            return true;
        }
        // A separator.
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += if bytes.get(i + 1) == Some(&b'_') {
                    2
                } else {
                    1
                }
            }
            b'-' => {
                while i < bytes.len() && bytes[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
    }
}

fn is_tag(tag: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = tag.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && word(bytes[0])
        && bytes[1..]
            .iter()
            .all(|&b| word(b) || b == b'.' || b == b'-')
}

fn is_digest(digest: &str) -> bool {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return false;
    };
    let component = |c: &str| {
        let bytes = c.as_bytes();
        !bytes.is_empty()
            && bytes[0].is_ascii_alphabetic()
            && bytes.iter().all(|b| b.is_ascii_alphanumeric())
    };
    algorithm.split(['+', '.', '_', '-']).all(component)
        && hex.len() >= 32
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:6c3c624b58dbbcd3c0dd82b4c53f04194d1247c6eebdaab7c610cf7d66709b3b";

    /// Realistic references parse into the expected parts.
    #[test]
    fn well_formed_references() {
        let cases: &[(&str, Option<&str>, &str, Option<&str>)] = &[
            ("figlet", None, "figlet", None),
            ("ubuntu:24.04", None, "ubuntu", Some("24.04")),
            ("library/ubuntu", None, "library/ubuntu", None),
            (
                "dreg.cloud.sdu.dk/ucloud/figlet:1.0.0",
                Some("dreg.cloud.sdu.dk"),
                "ucloud/figlet",
                Some("1.0.0"),
            ),
            ("localhost:5000/app", Some("localhost:5000"), "app", None),
            ("localhost/app:dev", Some("localhost"), "app", Some("dev")),
            (
                "[::1]:5000/a/b-c__d:v_1",
                Some("[::1]:5000"),
                "a/b-c__d",
                Some("v_1"),
            ),
            (
                "ghcr.io/a---b/c.d_e:latest",
                Some("ghcr.io"),
                "a---b/c.d_e",
                Some("latest"),
            ),
            ("Registry/app", Some("Registry"), "app", None),
        ];
        for &(input, domain, path, tag) in cases {
            let r = parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(
                (r.domain, r.path, r.tag, r.digest),
                (domain, path, tag, None),
                "{input}"
            );
        }
        let with_digest = format!("quay.io/jupyter/base-notebook:2024-10-07@{DIGEST}");
        let r = parse(&with_digest).unwrap();
        assert_eq!(r.digest, Some(DIGEST));
        assert_eq!(r.tag, Some("2024-10-07"));
    }

    /// Each rule of the grammar rejects what it should, with the part that is wrong in the error.
    #[test]
    fn malformed_references() {
        let cases: &[(&str, ImageError)] = &[
            ("", ImageError::Empty),
            ("Figlet", ImageError::PathComponent("Figlet".into())),
            (
                "dreg.cloud.sdu.dk/UCloud/figlet",
                ImageError::PathComponent("UCloud".into()),
            ),
            ("ubuntu::24.04", ImageError::PathComponent("ubuntu:".into())),
            ("ubuntu:", ImageError::Tag(String::new())),
            ("ubuntu:-rc", ImageError::Tag("-rc".into())),
            ("a//b", ImageError::PathComponent(String::new())),
            ("a/b/", ImageError::PathComponent(String::new())),
            ("a_-b", ImageError::PathComponent("a_-b".into())),
            ("a___b", ImageError::PathComponent("a___b".into())),
            ("a.", ImageError::PathComponent("a.".into())),
            ("-a.io/b", ImageError::Domain("-a.io".into())),
            ("a..io/b", ImageError::Domain("a..io".into())),
            ("a.io:port/b", ImageError::Domain("a.io:port".into())),
            ("[::1/b", ImageError::Domain("[::1".into())),
            ("ubuntu@sha256:abc", ImageError::Digest("sha256:abc".into())),
            ("ubuntu@", ImageError::Digest(String::new())),
            (":tag", ImageError::PathComponent(String::new())),
            ("my image", ImageError::PathComponent("my image".into())),
        ];
        for (input, expected) in cases {
            assert_eq!(parse(input).as_ref().err(), Some(expected), "{input:?}");
        }
        let long = format!("a/{}", "b".repeat(254));
        assert_eq!(parse(&long), Err(ImageError::TooLong(256)));
        let tag_129 = format!("ubuntu:{}", "t".repeat(129));
        assert!(matches!(parse(&tag_129), Err(ImageError::Tag(_))));
    }
}
