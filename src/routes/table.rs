//! [`RouteTable`]: every routed job, by job id, and the host names that lead to its ranks. Pure: it is
//! changed only by [`RouteTable::apply`] (one [`JobUpdate`], from an event or from the cluster) and
//! [`RouteTable::replace`] (a rebuild), and the result depends on the set of updates applied, never on
//! their order or on how often each was applied.
//!
//! # Ordering
//! Each job keeps the newest update it was given, by [`JobUpdate::stamp`]: the event's `sequence` (one
//! more per published change, persisted on the VolcanoJob), then a `REMOVE` over a `CREATE` or `UPDATE`
//! of the same sequence, then the timestamp (when the targets came to be), then the content itself, so
//! that two different updates are never equal and every instance picks the same one. An update that is
//! not newer than the job's current one changes nothing: a duplicate, or an event that arrives after a
//! newer one.
//!
//! A `REMOVE` leaves a tombstone (the job is kept, routeless, with the remove's stamp), so a `CREATE`
//! that arrives after its job's `REMOVE` does not bring the routes back. [`RouteTable::prune_removed`],
//! called once per retention period, lets go of the tombstones that were already there at its previous
//! call: each is kept between one and two periods, measured by the caller's clock, not by the events'
//! timestamps (which come from other machines' clocks).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use crate::messages::v1::{ProxyAction, ProxyEvent};
use crate::validate::{self, ValidationError};

/// Where a rank listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Backend {
    pub ip: IpAddr,
    /// 0: bridges only (see [`Backend::bridges_only`]).
    pub port: u16,
}

impl Backend {
    /// The rank offers no web or VNC interface (a terminal-only job, port 0): the proxy sends its hosts'
    /// `/.volcano-runner/` paths to the bridges and answers every other path 404, so nothing reaches the
    /// pod. The IP is still what the terminal bridge finds the pod by.
    pub fn bridges_only(&self) -> bool {
        self.port == 0
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

/// What a live job is routed to: each rank's backend and the job's public domains (served by rank 0).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct JobRoutes {
    /// By rank.
    pub ranks: BTreeMap<u32, Backend>,
    /// Public links, sorted, without duplicates.
    pub domains: Vec<String>,
}

/// An update's place in its job's history; the greater stamp wins. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp {
    /// The event's `sequence`.
    pub sequence: u64,
    /// A `REMOVE` outranks a `CREATE` or `UPDATE` of the same sequence.
    pub removed: bool,
    /// The event's timestamp, in milliseconds since the epoch (when the targets came to be).
    pub at_ms: i64,
}

/// One job's new state: its routes, or its removal, with the stamp that orders it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobUpdate {
    /// Compared first (the derived order compares fields in this order).
    pub stamp: Stamp,
    /// `None`: the job is gone.
    pub routes: Option<JobRoutes>,
    pub job_id: String,
}

impl JobUpdate {
    /// From a published event, checked first (an event that fails the contract's checks is refused with
    /// the field and the reason, and changes nothing).
    pub fn from_event(event: &ProxyEvent) -> Result<Self, ValidationError> {
        validate::proxy_event(event)?;
        let removed = event.action == ProxyAction::Remove as i32;
        let routes = (!removed)
            .then(|| -> Result<JobRoutes, ValidationError> {
                let mut ranks = BTreeMap::new();
                for (i, t) in event.targets.iter().enumerate() {
                    let field = |f: &str| format!("targets[{i}].{f}");
                    // Checked by the validation above; these only name the field if that ever changes.
                    let ip = t.pod_ip.parse().map_err(|_| {
                        ValidationError::new(
                            validate::ErrorKind::Invalid,
                            field("podIp"),
                            "is not an IP address",
                        )
                    })?;
                    let port = u16::try_from(t.port).map_err(|_| {
                        ValidationError::new(
                            validate::ErrorKind::Invalid,
                            field("port"),
                            "is outside 0..=65535",
                        )
                    })?;
                    if ranks.insert(t.rank, Backend { ip, port }).is_some() {
                        return Err(ValidationError::new(
                            validate::ErrorKind::Invalid,
                            field("rank"),
                            format!("rank {} has two targets", t.rank),
                        ));
                    }
                }
                if !ranks.contains_key(&0) {
                    return Err(ValidationError::new(
                        validate::ErrorKind::Invalid,
                        "targets",
                        "no target for rank 0",
                    ));
                }
                Ok(JobRoutes {
                    ranks,
                    domains: normalized(&event.domains),
                })
            })
            .transpose()?;
        let at_ms = event
            .timestamp
            .as_ref()
            .map(|t| t.seconds.saturating_mul(1000) + i64::from(t.nanos) / 1_000_000)
            .unwrap_or(0);
        Ok(Self {
            stamp: Stamp {
                sequence: event.sequence,
                removed,
                at_ms,
            },
            routes,
            job_id: event.job_id.clone(),
        })
    }
}

/// Domains sorted, lower-cased, without duplicates.
fn normalized(domains: &[String]) -> Vec<String> {
    let mut out: Vec<String> = domains.iter().map(|d| d.to_ascii_lowercase()).collect();
    out.sort();
    out.dedup();
    out
}

/// What [`RouteTable::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The update is the job's newest: the table changed.
    Changed,
    /// The job already has this very update (a duplicate).
    Same,
    /// The job has a newer update: this one is out of date and changed nothing.
    Stale,
}

/// How ranks are published: `<prefix><jobId>-<rank>.<domain>` (`[pipeline.proxy]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNaming {
    pub prefix: String,
    pub domain: String,
}

impl HostNaming {
    /// The host rank `rank` of `job_id` is published under.
    pub fn rank_host(&self, job_id: &str, rank: u32) -> String {
        format!("{}{job_id}-{rank}.{}", self.prefix, self.domain).to_ascii_lowercase()
    }
}

/// One host name and where it leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub host: String,
    pub job_id: String,
    pub rank: u32,
    pub backend: Backend,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    update: JobUpdate,
    /// A tombstone seen by the last [`RouteTable::prune_removed`]: the next one lets it go.
    aged: bool,
}

/// Every job the proxy knows, live or recently removed. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouteTable {
    jobs: HashMap<String, Entry>,
    live: usize,
}

impl RouteTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one update: it replaces the job's current one only if it is newer.
    pub fn apply(&mut self, update: JobUpdate) -> Applied {
        match self.jobs.get_mut(&update.job_id) {
            Some(entry) => match update.cmp(&entry.update) {
                std::cmp::Ordering::Greater => {
                    self.live -= usize::from(entry.update.routes.is_some());
                    self.live += usize::from(update.routes.is_some());
                    entry.update = update;
                    entry.aged = false;
                    Applied::Changed
                }
                std::cmp::Ordering::Equal => Applied::Same,
                std::cmp::Ordering::Less => Applied::Stale,
            },
            None => {
                self.live += usize::from(update.routes.is_some());
                self.jobs.insert(
                    update.job_id.clone(),
                    Entry {
                        update,
                        aged: false,
                    },
                );
                Applied::Changed
            }
        }
    }

    /// A rebuild: the live jobs become exactly those of `snapshot` (what the cluster runs now), each
    /// still subject to the ordering rule against the removals this table remembers. Returns whether
    /// anything changed.
    pub fn replace(&mut self, snapshot: impl IntoIterator<Item = JobUpdate>) -> bool {
        let before = self.clone();
        self.jobs.retain(|_, e| e.update.routes.is_none());
        self.live = 0;
        for update in snapshot {
            self.apply(update);
        }
        *self != before
    }

    /// Forgets the removals that were already remembered at the previous call (an event about those
    /// jobs still on its way after that long is not expected), and marks the others for the next call.
    /// Returns how many were forgotten.
    pub fn prune_removed(&mut self) -> usize {
        let n = self.jobs.len();
        self.jobs
            .retain(|_, e| e.update.routes.is_some() || !e.aged);
        for e in self.jobs.values_mut() {
            e.aged = e.update.routes.is_none();
        }
        n - self.jobs.len()
    }

    /// The routes of a live job.
    pub fn job(&self, job_id: &str) -> Option<&JobRoutes> {
        self.jobs.get(job_id)?.update.routes.as_ref()
    }

    /// The update a job is at (live or removed).
    pub fn update(&self, job_id: &str) -> Option<&JobUpdate> {
        self.jobs.get(job_id).map(|e| &e.update)
    }

    /// How many jobs are routed.
    pub fn live_jobs(&self) -> usize {
        self.live
    }

    /// How many removals are remembered.
    pub fn removed_jobs(&self) -> usize {
        self.jobs.len() - self.live
    }

    /// Every live job, sorted by id.
    pub fn live(&self) -> Vec<(&str, &JobRoutes)> {
        let mut out: Vec<_> = self
            .jobs
            .iter()
            .filter_map(|(id, e)| Some((id.as_str(), e.update.routes.as_ref()?)))
            .collect();
        out.sort_unstable_by(|a, b| a.0.cmp(b.0));
        out
    }

    /// Every host name and where it leads, sorted by host: each rank's `<prefix><jobId>-<rank>.<domain>`,
    /// and each public domain to rank 0. A host claimed twice (a public domain equal to another job's rank
    /// host, or bound to two jobs) goes to the rank host first, then to the job with the smaller id, so
    /// every instance routes it alike.
    pub fn routes(&self, naming: &HostNaming) -> Vec<Route> {
        let live = self.live();
        let mut hosts: BTreeMap<String, Route> = BTreeMap::new();
        for (job_id, routes) in &live {
            for (&rank, &backend) in &routes.ranks {
                let host = naming.rank_host(job_id, rank);
                hosts.entry(host.clone()).or_insert(Route {
                    host,
                    job_id: (*job_id).to_owned(),
                    rank,
                    backend,
                });
            }
        }
        for (job_id, routes) in &live {
            let Some(&backend) = routes.ranks.get(&0) else {
                continue;
            };
            for domain in &routes.domains {
                hosts.entry(domain.clone()).or_insert(Route {
                    host: domain.clone(),
                    job_id: (*job_id).to_owned(),
                    rank: 0,
                    backend,
                });
            }
        }
        hosts.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::plugins::proxy::target;
    use proptest::prelude::*;

    fn event(
        job: &str,
        action: ProxyAction,
        sequence: u64,
        at_s: i64,
        ips: &[&str],
        domains: &[&str],
    ) -> ProxyEvent {
        ProxyEvent {
            event_id: format!("{job}/proxy/x/{sequence}"),
            job_id: job.into(),
            action: action as i32,
            targets: (0..)
                .zip(ips)
                .map(|(rank, ip)| target(job, rank, *ip, 8888))
                .collect(),
            domains: domains.iter().map(|d| (*d).to_owned()).collect(),
            timestamp: Some(pbjson_types::Timestamp {
                seconds: at_s,
                nanos: 0,
            }),
            sequence,
        }
    }

    fn update(e: &ProxyEvent) -> JobUpdate {
        JobUpdate::from_event(e).unwrap()
    }

    fn naming() -> HostNaming {
        HostNaming {
            prefix: "app-".into(),
            domain: "cloud.sdu.dk".into(),
        }
    }

    fn backend(ip: &str) -> Backend {
        Backend {
            ip: ip.parse().unwrap(),
            port: 8888,
        }
    }

    #[test]
    fn ranks_get_their_hosts_and_public_domains_go_to_rank_zero() {
        let mut t = RouteTable::new();
        let e = event(
            "42",
            ProxyAction::Create,
            1,
            100,
            &["10.0.0.1", "10.0.0.2"],
            &["mylink.cloud.sdu.dk"],
        );
        assert_eq!(t.apply(update(&e)), Applied::Changed);
        let routes: Vec<(String, u32, Backend)> = t
            .routes(&naming())
            .into_iter()
            .map(|r| (r.host, r.rank, r.backend))
            .collect();
        assert_eq!(
            routes,
            vec![
                ("app-42-0.cloud.sdu.dk".into(), 0, backend("10.0.0.1")),
                ("app-42-1.cloud.sdu.dk".into(), 1, backend("10.0.0.2")),
                ("mylink.cloud.sdu.dk".into(), 0, backend("10.0.0.1")),
            ]
        );
        assert_eq!(t.live_jobs(), 1);
    }

    #[test]
    fn remove_drops_the_routes_and_an_older_create_does_not_bring_them_back() {
        let mut t = RouteTable::new();
        let create = event("7", ProxyAction::Create, 1, 100, &["10.0.0.1"], &[]);
        let remove = event("7", ProxyAction::Remove, 2, 200, &[], &[]);
        assert_eq!(t.apply(update(&create)), Applied::Changed);
        assert_eq!(t.apply(update(&remove)), Applied::Changed);
        assert!(t.job("7").is_none());
        assert!(t.routes(&naming()).is_empty());
        assert_eq!(t.apply(update(&create)), Applied::Stale);
        assert!(t.job("7").is_none());
        assert_eq!((t.live_jobs(), t.removed_jobs()), (0, 1));
        // A remove of the same sequence as an update outranks it, whatever their timestamps.
        let mut t = RouteTable::new();
        let late_update = event("8", ProxyAction::Update, 3, 900, &["10.0.0.9"], &[]);
        let remove = event("8", ProxyAction::Remove, 3, 100, &[], &[]);
        t.apply(update(&remove));
        assert_eq!(t.apply(update(&late_update)), Applied::Stale);
    }

    #[test]
    fn an_older_update_never_replaces_a_newer_one() {
        let mut t = RouteTable::new();
        let first = event("9", ProxyAction::Create, 1, 100, &["10.0.0.1"], &[]);
        let second = event("9", ProxyAction::Update, 2, 150, &["10.0.0.2"], &[]);
        assert_eq!(t.apply(update(&second)), Applied::Changed);
        assert_eq!(t.apply(update(&first)), Applied::Stale);
        assert_eq!(t.job("9").unwrap().ranks[&0], backend("10.0.0.2"));
        assert_eq!(t.apply(update(&second)), Applied::Same);
        // Same sequence (a re-run hook that saw other pods): the later targets win.
        let later = event("9", ProxyAction::Update, 2, 160, &["10.0.0.3"], &[]);
        assert_eq!(t.apply(update(&later)), Applied::Changed);
        assert_eq!(t.job("9").unwrap().ranks[&0], backend("10.0.0.3"));
    }

    #[test]
    fn replace_keeps_only_the_snapshot_and_the_remembered_removals() {
        let mut t = RouteTable::new();
        t.apply(update(&event(
            "a",
            ProxyAction::Create,
            1,
            1,
            &["10.0.0.1"],
            &[],
        )));
        t.apply(update(&event("b", ProxyAction::Remove, 2, 2, &[], &[])));
        let snapshot = vec![
            update(&event("c", ProxyAction::Create, 1, 3, &["10.0.0.3"], &[])),
            // The cluster still shows b (an old view): the remembered removal is newer.
            update(&event("b", ProxyAction::Create, 1, 1, &["10.0.0.2"], &[])),
        ];
        assert!(t.replace(snapshot.clone()));
        assert!(t.job("a").is_none(), "a stale route is gone");
        assert!(t.job("b").is_none());
        assert!(t.job("c").is_some());
        assert!(!t.replace(snapshot), "the same snapshot changes nothing");
        assert_eq!(t.prune_removed(), 0, "b is kept for one more period");
        t.apply(update(&event("d", ProxyAction::Remove, 1, 4, &[], &[])));
        assert_eq!(t.prune_removed(), 1, "b is let go");
        assert!(t.update("b").is_none() && t.update("d").is_some());
        assert_eq!(t.prune_removed(), 1, "then d");
        assert_eq!((t.live_jobs(), t.removed_jobs()), (1, 0));
    }

    #[test]
    fn bad_events_are_refused_naming_the_field() {
        let mut e = event("5", ProxyAction::Create, 1, 1, &["10.0.0.1"], &[]);
        e.targets[0].pod_ip = "nowhere".into();
        assert_eq!(
            JobUpdate::from_event(&e).unwrap_err().field(),
            "targets[0].podIp"
        );
        let mut e = event(
            "5",
            ProxyAction::Create,
            1,
            1,
            &["10.0.0.1", "10.0.0.2"],
            &[],
        );
        e.targets[1].rank = 0;
        assert_eq!(
            JobUpdate::from_event(&e).unwrap_err().field(),
            "targets[1].rank"
        );
        let mut e = event("5", ProxyAction::Create, 1, 1, &["10.0.0.1"], &[]);
        e.targets[0].rank = 1;
        assert_eq!(JobUpdate::from_event(&e).unwrap_err().field(), "targets");
        let e = event("5", ProxyAction::Create, 1, 1, &[], &[]);
        assert_eq!(JobUpdate::from_event(&e).unwrap_err().field(), "targets");
    }

    /// Events of a few jobs: creates, updates and removes with small sequences and timestamps, so that
    /// ties on every part of the stamp are common.
    fn events() -> impl Strategy<Value = Vec<ProxyEvent>> {
        let one = (
            0..3usize,
            0..3u8,
            0..4u64,
            0..3i64,
            proptest::collection::vec(0..4u8, 1..3),
            proptest::collection::vec(0..2u8, 0..2),
        )
            .prop_map(|(job, action, sequence, at, ips, domains)| {
                let action = match action {
                    0 => ProxyAction::Create,
                    1 => ProxyAction::Update,
                    _ => ProxyAction::Remove,
                };
                let ips: Vec<String> = if action == ProxyAction::Remove {
                    Vec::new()
                } else {
                    ips.iter().map(|i| format!("10.0.0.{i}")).collect()
                };
                let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
                let domains: Vec<String> = domains
                    .iter()
                    .map(|d| format!("d{d}.example.org"))
                    .collect();
                let domains: Vec<&str> = domains.iter().map(String::as_str).collect();
                event(&format!("j{job}"), action, sequence, at, &ips, &domains)
            });
        proptest::collection::vec(one, 0..24)
    }

    fn table_of(events: &[ProxyEvent]) -> RouteTable {
        let mut t = RouteTable::new();
        for e in events {
            t.apply(update(e));
        }
        t
    }

    proptest! {
        /// Duplicates and reordering change nothing: any order of the events, each applied any number
        /// of times, gives the table that applying each once in stamp order gives.
        #[test]
        fn order_and_duplicates_do_not_matter(
            events in events(),
            shuffle in any::<proptest::sample::Index>(),
            dups in proptest::collection::vec(any::<proptest::sample::Index>(), 0..12),
        ) {
            let mut sorted = events.clone();
            sorted.sort_by_key(update);
            let expected = table_of(&sorted);
            let mut messy = events.clone();
            for d in &dups {
                if !events.is_empty() {
                    messy.push(d.get(&events).clone());
                }
            }
            // A deterministic permutation picked by `shuffle`.
            let n = messy.len();
            if n > 1 {
                let mut i = shuffle.index(n);
                let mut permuted = Vec::with_capacity(n);
                while !messy.is_empty() {
                    i = (i * 7 + 3) % messy.len();
                    permuted.push(messy.remove(i));
                }
                messy = permuted;
            }
            let got = table_of(&messy);
            prop_assert_eq!(got.routes(&naming()), expected.routes(&naming()));
            prop_assert_eq!(got, expected);
        }

        /// Each job ends at its newest event: its routes if that is a create or update, none if a remove;
        /// and applying any of the events again afterwards changes nothing.
        #[test]
        fn each_job_is_at_its_newest_event(events in events()) {
            let mut t = table_of(&events);
            for job in ["j0", "j1", "j2"] {
                let newest = events.iter().filter(|e| e.job_id == job).map(update).max();
                prop_assert_eq!(t.update(job), newest.as_ref());
                prop_assert_eq!(t.job(job), newest.as_ref().and_then(|u| u.routes.as_ref()));
            }
            let before = t.clone();
            for e in &events {
                prop_assert_ne!(t.apply(update(e)), Applied::Changed);
            }
            prop_assert_eq!(t, before);
        }
    }
}
