//! The submissions a benchmark publishes: the figlet example of the message contract (one replica, one
//! parameter, the shape of most batch jobs), each under a job id of its own.

use crate::messages::v1::SubmitJob;
use crate::messages::{Format, decode, encode};

/// The example submission every benchmark job is a copy of.
const FIGLET: &str = include_str!("../../schemas/examples/submit-job.figlet.json");

/// The application's name, for the report.
pub const APPLICATION: &str = "figlet (schemas/examples/submit-job.figlet.json)";

/// N submissions, encoded once before anything is timed.
#[derive(Debug, Clone)]
pub struct Workload {
    /// `(job id, encoded SubmitJob)`, in publishing order.
    pub messages: Vec<(String, Vec<u8>)>,
    pub format: Format,
}

impl Workload {
    /// `count` submissions whose job ids start with `prefix` (unique per phase, so phases never see each
    /// other's jobs or events).
    pub fn new(prefix: &str, count: usize, format: Format) -> Workload {
        let template = template();
        let messages = (0..count)
            .map(|i| {
                let mut job = template.clone();
                job.job_id = job_id(prefix, i);
                let body = encode(format, &job).expect("the example submission encodes");
                (job.job_id, body)
            })
            .collect();
        Workload { messages, format }
    }

    /// The size of the first message (they differ only in the digits of the job id).
    pub fn message_bytes(&self) -> usize {
        self.messages.first().map_or(0, |(_, body)| body.len())
    }
}

/// The example submission, decoded.
pub fn template() -> SubmitJob {
    decode(Format::Json, FIGLET.as_bytes()).expect("the figlet example is a valid SubmitJob")
}

/// The job id of the `i`-th submission of a phase.
pub fn job_id(prefix: &str, i: usize) -> String {
    format!("{prefix}-{i}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_submission_is_valid_and_has_its_own_id() {
        let w = Workload::new("b7f3a1p2", 50, Format::Json);
        let config = crate::config::Config::default();
        let mut ids = std::collections::BTreeSet::new();
        for (id, body) in &w.messages {
            let job: SubmitJob = decode(Format::Json, body).unwrap();
            assert_eq!(&job.job_id, id);
            crate::validate::submit(&job, &config).unwrap();
            ids.insert(id.clone());
        }
        assert_eq!(ids.len(), 50);
        assert!(w.message_bytes() > 500, "{}", w.message_bytes());
        // The longest id of a 10,000-job phase still makes a valid VolcanoJob name.
        crate::validate::job_id(&job_id("b7f3a1p2", 9_999)).unwrap();
    }
}
