//! Which Volcano Queues are `fifo`, from a watch of the Queues: in such a queue nothing behind a
//! waiting gang starts, so the replay must keep its order there, or a job behind a blocked gang is told
//! "its resources are free now" and waits for the gang (docs/estimates.md, *Queues*). Watched, not
//! assumed: an operator can switch a queue's `dequeueStrategy` while jobs wait.

use std::collections::BTreeSet;

use kube::runtime::watcher::Event;

use crate::volcano::Queue;

/// The `fifo` queues by name, kept from the watch's events.
#[derive(Debug, Default)]
pub struct FifoQueues {
    names: BTreeSet<String>,
    /// A full list in progress.
    listing: Option<BTreeSet<String>>,
}

/// What an event of the watch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The set of `fifo` queues is as before.
    Same,
    /// It changed: the estimates are stale.
    Changed,
    /// A full list is in (changed or not).
    Listed,
}

fn is_fifo(q: &Queue) -> bool {
    q.spec.dequeue_strategy.as_deref() == Some("fifo")
}

impl FifoQueues {
    /// The `fifo` queues now.
    pub fn names(&self) -> &BTreeSet<String> {
        &self.names
    }

    /// Takes one event of the Queue watch.
    pub fn on_event(&mut self, event: Event<Queue>) -> Seen {
        match event {
            Event::Init => {
                self.listing = Some(BTreeSet::new());
                Seen::Same
            }
            Event::InitApply(q) => {
                if let (Some(listing), true) = (&mut self.listing, is_fifo(&q)) {
                    listing.insert(q.metadata.name.unwrap_or_default());
                }
                Seen::Same
            }
            Event::InitDone => {
                if let Some(listing) = self.listing.take() {
                    self.names = listing;
                }
                Seen::Listed
            }
            Event::Apply(q) => {
                let fifo = is_fifo(&q);
                let name = q.metadata.name.unwrap_or_default();
                let changed = if fifo {
                    self.names.insert(name)
                } else {
                    self.names.remove(&name)
                };
                if changed { Seen::Changed } else { Seen::Same }
            }
            Event::Delete(q) => {
                let name = q.metadata.name.unwrap_or_default();
                if self.names.remove(&name) {
                    Seen::Changed
                } else {
                    Seen::Same
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volcano::QueueSpec;

    fn queue(name: &str, strategy: Option<&str>) -> Queue {
        let mut q = Queue::default();
        q.metadata.name = Some(name.into());
        q.spec = QueueSpec {
            dequeue_strategy: strategy.map(str::to_owned),
            ..QueueSpec::default()
        };
        q
    }

    #[test]
    fn follows_each_queues_dequeue_strategy_through_lists_and_changes() {
        let mut f = FifoQueues::default();
        assert_eq!(f.on_event(Event::Init), Seen::Same);
        f.on_event(Event::InitApply(queue("a", Some("fifo"))));
        f.on_event(Event::InitApply(queue("b", Some("traverse"))));
        f.on_event(Event::InitApply(queue("c", None)));
        assert!(f.names().is_empty(), "not before the list is in");
        assert_eq!(f.on_event(Event::InitDone), Seen::Listed);
        assert_eq!(f.names().iter().collect::<Vec<_>>(), ["a"]);
        assert_eq!(
            f.on_event(Event::Apply(queue("b", Some("fifo")))),
            Seen::Changed
        );
        assert_eq!(
            f.on_event(Event::Apply(queue("b", Some("fifo")))),
            Seen::Same
        );
        assert_eq!(
            f.on_event(Event::Apply(queue("a", Some("traverse")))),
            Seen::Changed
        );
        assert_eq!(f.on_event(Event::Delete(queue("b", None))), Seen::Changed);
        assert!(f.names().is_empty());
        // A new list replaces what was known.
        f.on_event(Event::Apply(queue("x", Some("fifo"))));
        f.on_event(Event::Init);
        f.on_event(Event::InitApply(queue("y", Some("fifo"))));
        f.on_event(Event::InitDone);
        assert_eq!(f.names().iter().collect::<Vec<_>>(), ["y"]);
    }
}
