//! Maintenance windows in the start-time replay ([`super::session`]): what they take away, and when.
//! Pure, like the replay.
//!
//! The replay follows what the runner and the scheduler do with a window
//! (`monitor::maintenance`, docs/ops.md "Maintenance windows"):
//! - a job that runs when a window covering one of its nodes (or every node) begins is ended at the
//!   window's start (`monitor::maintenance::cutting`): a running job, and a gang the replay starts, hold
//!   their resources until the window's start at the latest, and a job without a time limit that a
//!   window will cut gets an end;
//! - a gang held back whole by a window (its pods gated `<prefix>maintenance`, or not tolerating a
//!   window of every node not over whose taint is on a node: `monitor::maintenance::replay_hold`)
//!   starts only at an instant when no window is in the way of its time allocation, whatever nodes the
//!   window names (a window of some nodes whose taint is on no node holds nobody), since that is when
//!   the monitor lifts the gate or adds the toleration; the ends of the windows are the instants it is
//!   tried again;
//! - a gang not held whole that does not tolerate a window of some nodes whose taint is on a node is
//!   kept off that window's nodes while the window is in the way of its allocation
//!   ([`Maintenance::off_nodes`]): the scheduler may place it on other nodes;
//! - a gang that is not held (it tolerates every window whose taint is on a node) is not kept out of
//!   anything: the scheduler may start it into a window, which then cuts it (at once during the
//!   window).

use jiff::{SignedDuration, Timestamp};

use crate::cluster::Window;
use crate::forecast::snapshot::{Node, Resources};
use crate::interval::{Span, earliest};

/// The maintenance windows the replay looks at, and which waiting gangs they hold back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Maintenance {
    /// The windows as the monitor's watch has them; those over are ignored.
    pub windows: Vec<Window>,
    /// Per window (same order): it holds a held gang back (`monitor::maintenance::holds_anyone`: a
    /// window of some nodes whose taint is on no node holds nobody, though it still cuts what runs on
    /// its nodes). Missing entries count as holding.
    pub holds: Vec<bool>,
    /// Per waiting gang (the replay's `pending`, same order): it is held back by a window (the
    /// maintenance gate, or a window's taint it does not tolerate). Missing entries count as not held.
    pub held: Vec<bool>,
    /// Per waiting gang (same order as `held`), when it is not held: the windows (indices into
    /// `windows`) of some nodes whose taint is on a node and that it does not tolerate: each keeps it
    /// off its nodes while in the way of its allocation, and it may start elsewhere.
    pub kept_off: Vec<Vec<usize>>,
    /// Per running job (the replay's `running`, same order): not volcano-runner's, so no window ends it
    /// (the pods of other workloads). Missing entries count as the runner's.
    pub spared: Vec<bool>,
}

impl Maintenance {
    /// When running job `i`, holding `ranks`, ends at the latest ([`Self::end_of`], unless it is
    /// spared).
    pub(crate) fn end_of_running(
        &self,
        i: usize,
        nodes: &[Node],
        ranks: &[(usize, Resources)],
        now: Timestamp,
        ends_by: Option<Timestamp>,
    ) -> Option<Timestamp> {
        if self.spared.get(i).copied().unwrap_or(false) {
            return ends_by;
        }
        self.end_of(nodes, ranks, now, ends_by)
    }

    /// Whether waiting gang `i` is held back by a window.
    pub(crate) fn is_held(&self, i: usize) -> bool {
        self.held.get(i).copied().unwrap_or(false)
    }

    /// The window that keeps held gang `i`, with time allocation `runs_for`, from starting at `at`:
    /// the one the monitor would name (`None`: it may start).
    pub(crate) fn holding(
        &self,
        i: usize,
        at: Timestamp,
        runs_for: Option<SignedDuration>,
    ) -> Option<&Window> {
        if !self.is_held(i) {
            return None;
        }
        self.windows
            .iter()
            .enumerate()
            .filter(|(k, w)| {
                self.holds.get(*k).copied().unwrap_or(true) && w.in_the_way(at, runs_for)
            })
            .map(|(_, w)| w)
            .min_by(|a, b| (a.start, &a.id).cmp(&(b.start, &b.id)))
    }

    /// The nodes (by index in `nodes`) gang `i`, with time allocation `runs_for`, is kept off at `at`
    /// by the windows of `kept_off` in the way then, with the earliest-ending of them (for the basis);
    /// `None`: none is in the way.
    pub(crate) fn off_nodes(
        &self,
        i: usize,
        at: Timestamp,
        runs_for: Option<SignedDuration>,
        nodes: &[Node],
    ) -> Option<(Vec<bool>, &Window)> {
        let in_way: Vec<&Window> = self
            .kept_off
            .get(i)?
            .iter()
            .filter_map(|k| self.windows.get(*k))
            .filter(|w| w.in_the_way(at, runs_for))
            .collect();
        let first = in_way
            .iter()
            .copied()
            .min_by(|a, b| (a.end, &a.id).cmp(&(b.end, &b.id)))?;
        let off = nodes
            .iter()
            .map(|n| in_way.iter().any(|w| w.covers(&n.name)))
            .collect();
        Some((off, first))
    }

    /// When a job holding `ranks` from `from` on, that would end at `ends_by` (`None`: never), ends at
    /// the latest: at the start of the earliest window not over that covers one of its nodes and
    /// begins before its end (never before `from`). `None`: it holds its resources for good.
    pub(crate) fn end_of(
        &self,
        nodes: &[Node],
        ranks: &[(usize, Resources)],
        from: Timestamp,
        ends_by: Option<Timestamp>,
    ) -> Option<Timestamp> {
        let holds = Span::until(from, ends_by);
        let cut = self
            .windows
            .iter()
            .filter(|w| w.span().overlaps(&holds))
            .filter(|w| {
                w.all_nodes()
                    || ranks
                        .iter()
                        .any(|(n, _)| nodes.get(*n).is_some_and(|n| w.covers(&n.name)))
            })
            .map(|w| w.start.max(from))
            .min();
        earliest(cut, ends_by)
    }

    /// The earliest end of a window after `after`: an instant a held gang may be let go.
    pub(crate) fn next_end(&self, after: Timestamp) -> Option<Timestamp> {
        self.windows
            .iter()
            .map(|w| w.end)
            .filter(|e| *e > after)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forecast::session::{Estimate, estimate, estimate_with};
    use crate::forecast::snapshot::{Pending, Running};

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn cpus(n: u64) -> Resources {
        Resources {
            cpu_milli: n * 1000,
            memory_mib: n * 4096,
            gpu: 0,
        }
    }

    fn nodes(n: usize) -> Vec<Node> {
        (0..n)
            .map(|i| Node {
                name: format!("n{i}"),
                allocatable: cpus(16),
                reserved_for: None,
            })
            .collect()
    }

    fn gang(id: &str, replicas: u32, cpu: u64, secs: Option<i64>) -> Pending {
        Pending {
            job_id: id.into(),
            replicas,
            per_rank: cpus(cpu),
            runs_for: secs.map(SignedDuration::from_secs),
            exclusive: false,
            queue: "q".into(),
            fifo: false,
            reserved_from: None,
            inqueue: true,
            reserves: None,
            gives_up_at: None,
        }
    }

    fn window(id: &str, start: i64, end: i64, nodes: &[&str]) -> Window {
        Window {
            id: id.into(),
            start: t(start),
            end: t(end),
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            reason: None,
            created_at: Some(t(-10)),
            created_by: None,
        }
    }

    fn start(e: &Estimate) -> Timestamp {
        match e {
            Estimate::At { start, .. } => *start,
            other => panic!("not an estimate: {other:?}"),
        }
    }

    #[test]
    fn a_window_in_the_way_delays_a_held_gang_past_its_end_and_a_short_one_starts_at_once() {
        // An empty cluster; a window on every node from 100 s to 200 s.
        let jobs = [
            gang("long", 1, 4, Some(150)),
            gang("short", 1, 4, Some(60)),
            gang("no-limit", 1, 4, None),
            gang("not-held", 1, 4, Some(150)),
        ];
        let maintenance = Maintenance {
            windows: vec![window("w", 100, 200, &[])],
            held: vec![true, true, true, false],
            ..Maintenance::default()
        };
        let e = estimate_with(&nodes(2), &[], &jobs, &maintenance, t(0));
        assert_eq!(
            start(&e[0]),
            t(200),
            "its allocation would cross the window"
        );
        let Estimate::At { basis, .. } = &e[0] else {
            unreachable!()
        };
        assert!(
            basis.contains("held back by the maintenance window w"),
            "{basis}"
        );
        assert_eq!(start(&e[1]), t(0), "it ends before the window starts");
        assert_eq!(
            start(&e[2]),
            t(200),
            "without a limit any window is in the way"
        );
        assert_eq!(
            start(&e[3]),
            t(0),
            "a gang not held may start: the window cuts it instead"
        );
        // Without the windows, all start at once.
        let e = estimate(&nodes(2), &[], &jobs, t(0));
        assert!(e.iter().all(|e| start(e) == t(0)), "{e:?}");
    }

    #[test]
    fn a_nodes_window_cuts_only_the_jobs_on_its_nodes_and_holds_every_held_gang() {
        // Node 0 busy until 1000 s, node 1 for good; a window on node 0 from 100 s to 200 s.
        let running = [
            Running {
                ranks: vec![(0, cpus(16))],
                ends_by: Some(t(1000)),
            },
            Running {
                ranks: vec![(1, cpus(16))],
                ends_by: None,
            },
        ];
        let jobs = [gang("one", 1, 16, Some(50)), gang("two", 2, 16, Some(50))];
        let on_n0 = Maintenance {
            windows: vec![window("w", 100, 200, &["n0"])],
            held: vec![true, true],
            ..Maintenance::default()
        };
        let e = estimate_with(&nodes(2), &running, &jobs, &on_n0, t(0));
        // The job on node 0 is cut at 100 s; a held gang waits for the window's end all the same.
        assert_eq!(start(&e[0]), t(200));
        assert!(
            matches!(e[1], Estimate::Unbounded { .. }),
            "the job on node 1 is not cut: {:?}",
            e[1]
        );
        // A window on every node cuts both: the two-node gang starts after the one-node one.
        let everywhere = Maintenance {
            windows: vec![window("w", 100, 200, &[])],
            held: vec![true, true],
            ..Maintenance::default()
        };
        let e = estimate_with(&nodes(2), &running, &jobs, &everywhere, t(0));
        assert_eq!((start(&e[0]), start(&e[1])), (t(200), t(250)));
        // A window on a node nobody uses cuts nothing: the gang waits for node 0's job to end (1000 s),
        // held or not (a held one is let go after the window's end, long before that).
        for held in [false, true] {
            let elsewhere = Maintenance {
                windows: vec![window("w", 100, 200, &["n7"])],
                held: vec![held, held],
                ..Maintenance::default()
            };
            let e = estimate_with(&nodes(2), &running, &jobs, &elsewhere, t(0));
            assert_eq!(start(&e[0]), t(1000), "held: {held}");
        }
    }

    /// Review finding 4: a gang kept off only a window's nodes (the window's taint, not the gate) may
    /// start on the other nodes at once, and on the window's nodes once the window is no longer in
    /// the way of its allocation.
    #[test]
    fn a_gang_kept_off_a_nodes_window_starts_elsewhere() {
        let jobs = [gang("g", 1, 16, Some(150))];
        let kept = |held: bool| Maintenance {
            windows: vec![window("w", 100, 200, &["n0"])],
            held: vec![held],
            kept_off: vec![if held { vec![] } else { vec![0] }],
            ..Maintenance::default()
        };
        // Two free nodes: on n1 at once; held whole, after the window.
        let e = estimate_with(&nodes(2), &[], &jobs, &kept(false), t(0));
        assert_eq!(start(&e[0]), t(0));
        let Estimate::At { basis, .. } = &e[0] else {
            unreachable!()
        };
        assert!(
            basis.contains("not on the nodes of the maintenance window w before"),
            "{basis}"
        );
        let e = estimate_with(&nodes(2), &[], &jobs, &kept(true), t(0));
        assert_eq!(start(&e[0]), t(200));
        // n1 busy until 1000 s: not on n0 while the window is in its way, so at its end.
        let running = [Running {
            ranks: vec![(1, cpus(16))],
            ends_by: Some(t(1000)),
        }];
        let e = estimate_with(&nodes(2), &running, &jobs, &kept(false), t(0));
        assert_eq!(start(&e[0]), t(200));
        // Not kept off: at once on n0 (then cut by the window).
        let free = Maintenance {
            windows: vec![window("w", 100, 200, &["n0"])],
            ..Maintenance::default()
        };
        let e = estimate_with(&nodes(2), &running, &jobs, &free, t(0));
        assert_eq!(start(&e[0]), t(0));
    }

    #[test]
    fn a_job_cut_by_a_window_frees_its_node_at_the_windows_start() {
        // One node. A gang not held starts now and runs into the window (cut at 100 s); the held one
        // behind it waits for the window's end, not for the first one's allocation (500 s).
        let jobs = [
            gang("into", 1, 16, Some(500)),
            gang("held", 1, 16, Some(50)),
        ];
        let maintenance = Maintenance {
            windows: vec![window("w", 100, 200, &[])],
            held: vec![false, true],
            ..Maintenance::default()
        };
        let e = estimate_with(&nodes(1), &[], &jobs, &maintenance, t(0));
        assert_eq!((start(&e[0]), start(&e[1])), (t(0), t(200)));
        // A running job without a time limit that a window cuts ends then.
        let running = [Running {
            ranks: vec![(0, cpus(16))],
            ends_by: None,
        }];
        let not_held = Maintenance {
            windows: vec![window("w", 100, 200, &[])],
            ..Maintenance::default()
        };
        let e = estimate_with(&nodes(1), &running, &jobs[1..], &not_held, t(0));
        assert_eq!(
            start(&e[0]),
            t(100),
            "the node is free from the window's start"
        );
        // Unless it is not the runner's: no window ends another workload's pods.
        let spared = Maintenance {
            spared: vec![true],
            ..not_held
        };
        let e = estimate_with(&nodes(1), &running, &jobs[1..], &spared, t(0));
        assert!(matches!(e[0], Estimate::Unbounded { .. }), "{e:?}");
        assert!(matches!(
            estimate(&nodes(1), &running, &jobs[1..], t(0))[0],
            Estimate::Unbounded { .. }
        ));
    }
}
