//! The runner's own `[monitor] queue_timeout` (volcano-runner's, not Volcano's): a job that has not
//! started by its deadline is failed, its PodGroup leaves the queue, and a `fifo` queue behind it moves
//! on. The replay does the same at that instant, so a job is never told a start after its failure, and
//! the jobs behind it are told when they start once it is gone.

use jiff::Timestamp;

use crate::forecast::answer::Estimate;
use crate::forecast::session::Session;

/// What a job that the replay does not start before its deadline is told: when it fails, and why.
pub(crate) fn times_out(at: Timestamp, started_at: Option<Timestamp>) -> Estimate {
    let why = match started_at {
        Some(start) => format!(
            "the runner fails it at {at} ([monitor] queue_timeout), before {start}, when the replay \
             has its resources free"
        ),
        None => format!(
            "the runner fails it at {at} ([monitor] queue_timeout): the replay sees no room for it \
             before then"
        ),
    };
    Estimate::TimesOut { at, why }
}

impl<'a> Session<'a> {
    /// The deadlines of the waiting gangs, in order (called once, when the session opens).
    pub(crate) fn deadlines(&mut self) {
        self.gives_up = self
            .pending
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((p.gives_up_at?, i)))
            .collect();
        self.gives_up.sort_unstable();
        self.gone = vec![false; self.pending.len()];
    }

    /// The next deadline still to come after the cursor.
    pub(crate) fn next_deadline(&self) -> Option<Timestamp> {
        self.gives_up.get(self.next_give_up).map(|(at, _)| *at)
    }

    /// Gangs whose deadline has come and that still wait leave the queue (the runner fails them): no
    /// longer admitted, tried, or blocking a `fifo` queue. One that never fits stays told so (it is
    /// failed all the same); one that could have started later is told when it fails, and a `fifo`
    /// queue it was in promises nothing behind it (it could have started earlier than the replay
    /// foresaw, and held what the jobs behind it were promised).
    pub(crate) fn give_up_due(&mut self) {
        while let Some(&(at, i)) = self.gives_up.get(self.next_give_up)
            && at <= self.cursor
        {
            self.next_give_up += 1;
            if matches!(
                self.out[i],
                Some(Estimate::At { .. } | Estimate::TimesOut { .. })
            ) || self.gone[i]
            {
                continue;
            }
            self.gone[i] = true;
            let job = &self.pending[i];
            if self.inqueue[i] {
                let minimum = job.minimum();
                let admitted = &mut self.admitted;
                admitted.cpu_milli = admitted.cpu_milli.saturating_sub(minimum.cpu_milli);
                admitted.memory_mib = admitted.memory_mib.saturating_sub(minimum.memory_mib);
                admitted.gpu = admitted.gpu.saturating_sub(minimum.gpu);
            } else {
                self.to_admit = self.to_admit.saturating_sub(1);
            }
            if self.out[i].is_none() {
                self.out[i] = Some(times_out(at, None));
                self.left -= 1;
                if job.fifo {
                    self.fifo_unbound.insert(job.queue.as_str());
                }
            }
            for r in self.reserved.iter_mut().filter(|g| **g == Some(i)) {
                *r = None;
            }
        }
    }
}
