//! What a runner refuses of a submission on its own, as one check that `validate` and `submit` (the
//! CLI) make too: the validation of the message, then its rendering, the two checks the submit path
//! ([`super::handle::submit`]) makes before it asks the cluster anything. Here, not in
//! [`crate::validate`], because rendering needs the whole configuration, which validation must not
//! depend on.

use std::fmt;

use crate::config::Config;
use crate::messages::v1::SubmitJob;
use crate::validate;

/// Why a runner refuses a submission on its own, before the cluster is asked: a rule of the message
/// ([`validate::submit`]), or something rendering it refuses (a public IP under `attach = "refuse"` or without
/// open ports, whole nodes without a configured charge, ...). Display is `<field>: <message>`, the words
/// the runner's FAILURE event and dead letter carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub field: String,
    pub message: String,
    /// The reason code the runner gives it (`invalid_field`, `not_offered`, ...).
    pub reason: &'static str,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for Refusal {}

/// Everything a runner configured with `config` refuses of a submission on its own: [`validate::submit`], then
/// rendering ([`crate::pipeline::render`]), the two checks its submit path makes, in that order, before
/// it asks the cluster anything. `validate` and `submit` call this, so neither says ok to what a runner
/// dead-letters. What only the cluster can tell (a peer's owner or end, whole-node limits) is the
/// runner's alone.
pub fn submission(job: &SubmitJob, config: &Config, now: jiff::Timestamp) -> Result<(), Refusal> {
    validate::submit(job, config).map_err(|e| Refusal {
        field: e.field().to_owned(),
        message: e.message().to_owned(),
        reason: e.reason(),
    })?;
    crate::pipeline::render(job, config, now)
        .map(|_| ())
        .map_err(|e| Refusal {
            field: e.field(),
            message: e.message().to_owned(),
            reason: e.code(),
        })
}
