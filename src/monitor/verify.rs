//! The full reconciliation's check of the watches (W1): a metadata-only list of each watched kind,
//! compared object by object with the cache by resourceVersion.
//!
//! A watch that went quiet, or lost an event, leaves the cache behind the API; a metadata list shows it
//! at a fraction of a full list's cost (no specs, no statuses), so it can run often on a runner that
//! holds tens of thousands of jobs. A difference is not yet proof: the watch may simply not have
//! delivered a change made a moment ago. So each difference becomes a [`Suspect`] that must be
//! [resolved](Suspect::resolved) within a short grace; one that is not means the watch missed something,
//! and that kind is listed afresh in full.

use kube::api::ListParams;

use super::cache::{JobKey, Rv, share};
use super::listing;

/// Objects per page of a metadata list.
const PAGE: u32 = 500;

/// A whole metadata list (every page): each object's namespace and name, packed in one buffer (two
/// small strings per object would be tens of thousands of allocations per pass), its version read as a
/// number once, and the version of the collection it was read at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listed {
    text: String,
    items: Vec<Packed>,
    /// The digest of the objects listed, as the cache keeps its own (see [`share`]).
    digest: u64,
    pub resource_version: Option<String>,
}

/// Where one object's namespace and name are in [`Listed::text`] (each as start and end), and its
/// version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Packed([u32; 4], Rv);

/// One object of a [`Listed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub resource_version: Rv,
}

impl Version<'_> {
    pub fn key(&self) -> JobKey {
        JobKey::new(self.namespace, self.name)
    }
}

impl Listed {
    pub fn push(&mut self, namespace: &str, name: &str, resource_version: &str) {
        let mut bounds = [0u32; 4];
        for (i, part) in [namespace, name].into_iter().enumerate() {
            bounds[2 * i] = offset(self.text.len());
            self.text.push_str(part);
            bounds[2 * i + 1] = offset(self.text.len());
        }
        let rv = Rv::parse(resource_version);
        self.digest = self.digest.wrapping_add(share(namespace, name, rv));
        self.items.push(Packed(bounds, rv));
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = Version<'_>> {
        self.items.iter().map(|Packed(b, rv)| {
            let part = |i: usize| &self.text[b[2 * i] as usize..b[2 * i + 1] as usize];
            Version {
                namespace: part(0),
                name: part(1),
                resource_version: *rv,
            }
        })
    }
}

/// A buffer offset; a metadata list held in memory is far below 4 GiB.
fn offset(at: usize) -> u32 {
    u32::try_from(at).expect("a metadata list under 4 GiB")
}

/// Lists the metadata of every object under `url` (a collection URL as [`kube::Api::resource_url`]
/// gives it) that matches `selector` and the field selector `fields`, page by page.
pub async fn list_versions(
    client: &kube::Client,
    url: &str,
    selector: Option<&str>,
    fields: Option<&str>,
) -> Result<Listed, kube::Error> {
    let request = kube::core::Request::new(url);
    let mut listed = Listed::default();
    let mut params = ListParams::default().limit(PAGE);
    if let Some(s) = selector {
        params = params.labels(s);
    }
    if let Some(f) = fields {
        params = params.fields(f);
    }
    loop {
        let http = request
            .list_metadata(&params)
            .map_err(kube::Error::BuildRequest)?;
        let text = body(client, http).await?;
        let first = listed.resource_version.is_none();
        let page = listing::read(&text, |o| {
            listed.push(
                o.namespace.as_deref().unwrap_or_default(),
                o.name.as_deref().unwrap_or_default(),
                o.resource_version.as_deref().unwrap_or_default(),
            );
        })
        .map_err(|e| kube::Error::SerdeError(serde::de::Error::custom(e)))?;
        if first {
            // A paginated list is one snapshot: the first page's version.
            listed.resource_version = page.resource_version.map(String::from);
        }
        match page.continue_token.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(listed),
        }
    }
}

/// The body of a successful response, as bytes. Not [`kube::Client::request_text`]: that copies each
/// page once more and checks all of it for UTF-8 (27 MB a pass at 10,000 jobs), where the reader needs
/// bytes and checks only the few strings it keeps.
async fn body(
    client: &kube::Client,
    request: http::Request<Vec<u8>>,
) -> Result<impl std::ops::Deref<Target = [u8]> + use<>, kube::Error> {
    use http_body_util::BodyExt;
    let response = client.send(request.map(kube::client::Body::from)).await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    if status.is_client_error() || status.is_server_error() {
        // As kube reports an error status: the API's own `Status` when the body is one.
        let text = String::from_utf8_lossy(&bytes);
        let status = serde_json::from_str::<kube::core::Status>(&text).unwrap_or_else(|_| {
            kube::core::Status::failure(text.trim(), "Failed to parse error data")
                .with_code(status.as_u16())
        });
        return Err(kube::Error::Api(Box::new(status)));
    }
    Ok(bytes)
}

/// What the cache must show for a difference to be explained by a change the watch had not yet
/// delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// The object at this version or a later one.
    AtLeast(Rv),
    /// The object gone, or changed after the list (whose version this is) was taken.
    GoneAsOf(Rv),
}

/// An object whose cached version differs from the API's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspect {
    pub key: JobKey,
    pub expect: Expect,
}

impl Suspect {
    /// Whether the cache, holding `cached` for this object now, explains the difference.
    pub fn resolved(&self, cached: Option<Rv>) -> bool {
        match self.expect {
            Expect::AtLeast(rv) => cached.is_some_and(|c| c.at_least(rv)),
            Expect::GoneAsOf(list_rv) => cached.is_none_or(|c| c.later_than(list_rv)),
        }
    }
}

/// The differences between a metadata list and the cache of that kind.
///
/// `cached` looks one object up by namespace and name; `cached_count` is how many the cache holds,
/// `cached_digest` their digest, and `cached_all` lists them (called only when the cache holds objects
/// the list does not). When the count and the digest are the list's, the cache holds exactly what was
/// listed and nothing is looked up: the common case of a quiet cluster, and a pass's largest saving.
pub fn differences(
    listed: &Listed,
    cached: impl Fn(&str, &str) -> Option<Rv>,
    cached_count: usize,
    cached_digest: u64,
    cached_all: impl FnOnce() -> Vec<(JobKey, Rv)>,
) -> Vec<Suspect> {
    if listed.len() == cached_count && listed.digest == cached_digest {
        return Vec::new();
    }
    let mut suspects = Vec::new();
    let mut found = 0usize;
    for item in listed.iter() {
        let have = cached(item.namespace, item.name);
        if have.is_some() {
            found += 1;
        }
        // Equal, or the watch is already past the list: nothing to explain.
        let fine = have.is_some_and(|c| c.at_least(item.resource_version));
        if !fine {
            suspects.push(Suspect {
                key: item.key(),
                expect: Expect::AtLeast(item.resource_version),
            });
        }
    }
    if found < cached_count {
        let in_list: std::collections::HashSet<(&str, &str)> =
            listed.iter().map(|i| (i.namespace, i.name)).collect();
        let list_rv = Rv::from(listed.resource_version.as_deref());
        for (key, rv) in cached_all() {
            if in_list.contains(&(&*key.namespace, &*key.name)) || rv.later_than(list_rv) {
                continue;
            }
            suspects.push(Suspect {
                key,
                expect: Expect::GoneAsOf(list_rv),
            });
        }
    }
    suspects
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn key(name: &str) -> JobKey {
        JobKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn listed(rv: &str, items: &[(&str, &str)]) -> Listed {
        let mut listed = Listed {
            resource_version: Some(rv.into()),
            ..Listed::default()
        };
        for (n, v) in items {
            listed.push("ns", n, v);
        }
        listed
    }

    fn diff(list: &Listed, cache: &HashMap<JobKey, String>) -> Vec<Suspect> {
        let digest = cache.iter().fold(0u64, |d, (k, v)| {
            d.wrapping_add(share(&k.namespace, &k.name, rv(v)))
        });
        differences(
            list,
            |ns, name| cache.get(&key_in(ns, name)).map(|v| rv(v)),
            cache.len(),
            digest,
            || cache.iter().map(|(k, v)| (k.clone(), rv(v))).collect(),
        )
    }

    fn rv(v: &str) -> Rv {
        Rv::parse(v)
    }

    fn key_in(ns: &str, name: &str) -> JobKey {
        JobKey {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn cache(items: &[(&str, &str)]) -> HashMap<JobKey, String> {
        items.iter().map(|(n, v)| (key(n), (*v).into())).collect()
    }

    #[test]
    fn a_cache_equal_to_or_ahead_of_the_list_has_nothing_to_explain() {
        let list = listed("100", &[("a", "10"), ("b", "20")]);
        assert!(diff(&list, &cache(&[("a", "10"), ("b", "20")])).is_empty());
        // The watch delivered a change made after the list was taken.
        assert!(diff(&list, &cache(&[("a", "10"), ("b", "120")])).is_empty());
        // An object created after the list was taken.
        assert!(diff(&list, &cache(&[("a", "10"), ("b", "20"), ("c", "101")])).is_empty());
    }

    #[test]
    fn a_list_with_the_caches_count_and_digest_needs_no_lookup() {
        let list = listed("100", &[("a", "10"), ("b", "20")]);
        let c = cache(&[("b", "20"), ("a", "10")]);
        let digest = |c: &HashMap<JobKey, String>| {
            c.iter().fold(0u64, |d, (k, v)| {
                d.wrapping_add(share(&k.namespace, &k.name, rv(v)))
            })
        };
        let unused = |_: &str, _: &str| -> Option<Rv> { panic!("no object is looked up") };
        assert!(differences(&list, unused, c.len(), digest(&c), Vec::new).is_empty());
        // One version apart: the digest differs and the comparison finds the object.
        let behind = cache(&[("a", "10"), ("b", "19")]);
        assert_ne!(digest(&behind), digest(&c));
        assert_eq!(diff(&list, &behind).len(), 1);
        // The same versions under each other's names: the digest differs too (and only b is behind).
        let swapped = cache(&[("a", "20"), ("b", "10")]);
        assert_ne!(digest(&swapped), digest(&c));
        assert_eq!(diff(&list, &swapped).len(), 1);
    }

    #[test]
    fn a_version_that_is_not_a_number_is_never_proof_of_a_missed_change() {
        let list = listed("100", &[("a", "opaque-2")]);
        assert!(diff(&list, &cache(&[("a", "opaque-1")])).is_empty());
        let gone = Suspect {
            key: key("a"),
            expect: Expect::GoneAsOf(rv("opaque")),
        };
        assert!(!gone.resolved(Some(rv("101"))), "not provably later");
    }

    #[test]
    fn behind_missing_and_extra_objects_are_suspects() {
        let list = listed("100", &[("a", "10"), ("b", "20"), ("new", "90")]);
        let c = cache(&[("a", "10"), ("b", "15"), ("deleted", "50")]);
        let mut s = diff(&list, &c);
        s.sort_by(|x, y| x.key.name.cmp(&y.key.name));
        assert_eq!(
            s,
            vec![
                Suspect {
                    key: key("b"),
                    expect: Expect::AtLeast(rv("20"))
                },
                Suspect {
                    key: key("deleted"),
                    expect: Expect::GoneAsOf(rv("100"))
                },
                Suspect {
                    key: key("new"),
                    expect: Expect::AtLeast(rv("90"))
                },
            ]
        );
    }

    #[test]
    fn a_suspect_is_resolved_only_by_the_change_it_waits_for() {
        let behind = Suspect {
            key: key("b"),
            expect: Expect::AtLeast(rv("20")),
        };
        assert!(!behind.resolved(Some(rv("15"))));
        assert!(!behind.resolved(None));
        assert!(behind.resolved(Some(rv("20"))));
        assert!(behind.resolved(Some(rv("25"))));
        let gone = Suspect {
            key: key("d"),
            expect: Expect::GoneAsOf(rv("100")),
        };
        assert!(gone.resolved(None));
        assert!(!gone.resolved(Some(rv("50"))));
        // Recreated (or changed) after the list: the watch is alive and ahead of it.
        assert!(gone.resolved(Some(rv("101"))));
    }

    #[test]
    fn a_listed_object_reads_back_as_pushed() {
        let mut l = Listed::default();
        l.push("ns", "a", "5");
        l.push("", "bb", "");
        l.push("other", "c", "123");
        let read: Vec<(&str, &str, Rv)> = l
            .iter()
            .map(|v| (v.namespace, v.name, v.resource_version))
            .collect();
        assert_eq!(
            read,
            vec![
                ("ns", "a", rv("5")),
                ("", "bb", rv("")),
                ("other", "c", rv("123"))
            ]
        );
        assert_eq!(l.len(), 3);
    }
}
