//! The pure part of the shard leases: which shard a job is in, what a runner should hold, and when a
//! lease counts as abandoned. No I/O and no clock (instants come in as arguments).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// The shard of a job: FNV-1a (64-bit) of the job id, modulo the number of shards. Stable across
/// processes, versions and platforms, so every runner agrees on it without talking.
pub fn shard_of(job_id: &str, shards: u32) -> u32 {
    if shards <= 1 {
        return 0;
    }
    // The remainder is below `shards`, a u32, so the cast is lossless.
    (fnv1a(job_id.as_bytes()) % u64::from(shards)) as u32
}

fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(PRIME))
}

/// How much a runner prefers a shard (rendezvous hashing): runners rank shards differently, so when
/// several grab free shards at once they mostly go for different ones and few writes conflict.
fn preference(me: &str, shard: u32) -> u64 {
    fnv1a(format!("{me}/{shard}").as_bytes())
}

/// A runner's fair share: `ceil(shards / live runners)`.
pub fn fair_share(shards: usize, live_members: usize) -> usize {
    shards.div_ceil(live_members.max(1))
}

/// Who holds a shard, as this runner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// No lease yet, or released (empty holder).
    Free,
    /// This runner, and it is not handing the shard over.
    Me,
    /// Another runner, or this runner while it hands the shard over. `expired`: the lease has not been
    /// renewed for a whole lease duration.
    Other { expired: bool },
}

/// What to do with the leases in one round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Shards held and kept: renew them.
    pub renew: Vec<u32>,
    /// Free or abandoned shards to take.
    pub acquire: Vec<u32>,
    /// Shards held beyond the fair share: stop the duty now, release the lease next round.
    pub release: Vec<u32>,
}

/// Decides one round for runner `me`, given who holds each shard (indexed by shard) and how many
/// runners are alive (this one included), as [`decide_with`] when a live runner is short of its share.
#[cfg(test)]
pub fn decide(me: &str, holders: &[Holder], live_members: usize) -> Decision {
    decide_with(me, holders, live_members, true)
}

/// Decides one round for runner `me`. `short_member`: some live runner holds no shard (a newcomer) or
/// fewer than the floor of the fair share.
///
/// A shard whose holder stopped renewing is taken at once, beyond the fair share if need be: a dead
/// holder's jobs wait for nothing but the lease to lapse, whatever the churn. The fair share counts
/// the runners alive, and a runner killed and started again under a new name is counted twice until
/// the dead one's member lease lapses: bounding a takeover by the share would leave the shard without
/// a holder for that long (10 to 75 s were measured with a runner killed every 2 s). Shards beyond the
/// share are handed over only while a live runner is short (holds none, or fewer than the floor of the
/// share), which takes them: handing them over when every runner has its share already would leave them
/// free, or send them from one runner to the next; keeping them while one is short would leave it short
/// for good (4 shards held 3 and 1 by two runners). Free shards are taken within the share.
pub fn decide_with(
    me: &str,
    holders: &[Holder],
    live_members: usize,
    short_member: bool,
) -> Decision {
    let target = fair_share(holders.len(), live_members);
    let by_preference = |mut shards: Vec<u32>| {
        shards.sort_by_key(|s| std::cmp::Reverse(preference(me, *s)));
        shards
    };
    let indices = |pred: fn(&Holder) -> bool| -> Vec<u32> {
        holders
            .iter()
            .enumerate()
            .filter(|(_, h)| pred(h))
            .map(|(i, _)| i as u32)
            .collect()
    };
    let mut renew = by_preference(indices(|h| *h == Holder::Me));
    let release = if renew.len() > target && short_member {
        renew.split_off(target)
    } else {
        Vec::new()
    };
    let mut acquire = by_preference(indices(|h| *h == Holder::Other { expired: true }));
    let wanted = target.saturating_sub(renew.len() + acquire.len());
    let mut free = by_preference(indices(|h| *h == Holder::Free));
    free.truncate(wanted);
    acquire.extend(free);
    renew.sort_unstable();
    Decision {
        renew,
        acquire,
        release,
    }
}

/// When each lease last changed, by this runner's own clock.
///
/// Comparing a lease's `renewTime` with our clock would trust the holder's clock; instead (as
/// client-go's leader election does) a lease counts as abandoned when its resourceVersion has not
/// changed for a whole lease duration *as measured here*. That only assumes clocks run at about the
/// same rate, which the holder's safety margin covers.
#[derive(Debug, Default)]
pub struct Observations {
    seen: HashMap<String, (String, Instant)>,
}

impl Observations {
    /// Records the resourceVersion of lease `name` seen at `now`.
    pub fn observe(&mut self, name: &str, resource_version: &str, now: Instant) {
        match self.seen.get_mut(name) {
            Some((rv, _)) if rv == resource_version => {}
            _ => {
                self.seen
                    .insert(name.to_owned(), (resource_version.to_owned(), now));
            }
        }
    }

    /// Forgets leases that were not in the latest listing.
    pub fn retain(&mut self, present: impl Fn(&str) -> bool) {
        self.seen.retain(|name, _| present(name));
    }

    /// How long lease `name` has gone unchanged at `now` (zero if never seen).
    pub fn unchanged_for(&self, name: &str, now: Instant) -> Duration {
        self.seen
            .get(name)
            .map(|(_, since)| now.saturating_duration_since(*since))
            .unwrap_or_default()
    }

    /// Whether lease `name` has gone unchanged for `duration` at `now`.
    pub fn expired(&self, name: &str, duration: Duration, now: Instant) -> bool {
        self.seen.contains_key(name) && self.unchanged_for(name, now) >= duration
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_reference_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn shards_are_stable_and_spread() {
        assert_eq!(shard_of("anything", 1), 0);
        assert_eq!(shard_of("anything", 0), 0);
        assert_eq!(shard_of("42", 8), shard_of("42", 8));
        let mut counts = [0u32; 8];
        for id in 0..8000 {
            counts[shard_of(&id.to_string(), 8) as usize] += 1;
        }
        for (shard, count) in counts.iter().enumerate() {
            assert!(
                (800..1200).contains(count),
                "shard {shard} got {count} of 8000"
            );
        }
    }

    #[test]
    fn fair_shares_round_up() {
        assert_eq!(fair_share(8, 1), 8);
        assert_eq!(fair_share(8, 2), 4);
        assert_eq!(fair_share(8, 3), 3);
        assert_eq!(fair_share(1, 5), 1);
        assert_eq!(fair_share(8, 0), 8);
    }

    #[test]
    fn a_lone_runner_takes_everything() {
        let d = decide("a", &[Holder::Free; 4], 1);
        let mut acquired = d.acquire.clone();
        acquired.sort_unstable();
        assert_eq!(acquired, vec![0, 1, 2, 3]);
        assert!(d.renew.is_empty() && d.release.is_empty());
    }

    #[test]
    fn a_second_runner_makes_the_first_give_half_back() {
        let d = decide("a", &[Holder::Me; 8], 2);
        assert_eq!(d.renew.len(), 4);
        assert_eq!(d.release.len(), 4);
        assert!(d.acquire.is_empty());
        let mut all: Vec<u32> = d.renew.iter().chain(&d.release).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn only_free_or_abandoned_shards_are_taken() {
        let holders = [
            Holder::Other { expired: false },
            Holder::Other { expired: true },
            Holder::Free,
            Holder::Me,
        ];
        let d = decide("b", &holders, 2);
        assert_eq!(d.renew, vec![3]);
        assert_eq!(d.acquire.len(), 1);
        assert!(matches!(d.acquire[0], 1 | 2));
        let d = decide("b", &holders, 1);
        let mut acquired = d.acquire.clone();
        acquired.sort_unstable();
        assert_eq!(acquired, vec![1, 2], "shard 0 is held by a live runner");
    }

    /// A runner killed and started again under a new name is counted as alive twice for a while,
    /// which shrinks every runner's share: a shard whose holder died is taken all the same, at once.
    #[test]
    fn an_abandoned_shard_is_taken_beyond_the_fair_share() {
        let holders = [
            Holder::Me,
            Holder::Other { expired: true },
            Holder::Other { expired: false },
            Holder::Other { expired: false },
        ];
        // Three runners alive and a dead one still counted: a share of 1, held already.
        let d = decide_with("a", &holders, 4, false);
        assert_eq!(d.renew, vec![0]);
        assert_eq!(d.acquire, vec![1], "the dead holder's shard");
        assert!(d.release.is_empty());
        // Over the share afterwards, it is kept while no live runner is idle (a hand-over would leave
        // the shard free), and handed over once one is.
        let holders = [
            Holder::Me,
            Holder::Me,
            Holder::Other { expired: false },
            Holder::Other { expired: false },
        ];
        let d = decide_with("a", &holders, 4, false);
        assert_eq!(d.renew, vec![0, 1]);
        assert!(d.release.is_empty() && d.acquire.is_empty());
        let d = decide_with("a", &holders, 4, true);
        assert_eq!(d.renew.len(), 1);
        assert_eq!(d.release.len(), 1);
    }

    #[test]
    fn runners_prefer_different_shards() {
        let free = [Holder::Free; 16];
        let a = decide("runner-a", &free, 2).acquire;
        let b = decide("runner-b", &free, 2).acquire;
        let overlap = a.iter().filter(|s| b.contains(s)).count();
        assert!(overlap < 8, "a={a:?} b={b:?}");
    }

    #[test]
    fn leases_expire_by_our_own_observation() {
        let mut o = Observations::default();
        let t0 = Instant::now();
        let d = Duration::from_secs(10);
        assert!(
            !o.expired("l", d, t0),
            "never seen: not expired (not known)"
        );
        o.observe("l", "1", t0);
        assert!(!o.expired("l", d, t0 + Duration::from_secs(9)));
        o.observe("l", "1", t0 + Duration::from_secs(9));
        assert!(
            o.expired("l", d, t0 + d),
            "same resourceVersion does not refresh"
        );
        o.observe("l", "2", t0 + d);
        assert!(!o.expired("l", d, t0 + d + Duration::from_secs(9)));
        o.retain(|_| false);
        assert_eq!(o.unchanged_for("l", t0 + d * 5), Duration::ZERO);
    }
}
