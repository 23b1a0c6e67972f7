//! Checks of the session messages: [`open_session`] (what a runner answers) and [`session_reply`] (what
//! it sends back).

use super::{ErrorKind, ValidationError, job_id, time_allocation};
use crate::messages::v1::{
    OpenSession, SessionKind, SessionReply, session_reply::Result as Outcome,
};

/// A session request: a valid job id, a kind (web, VNC or terminal), and a lifetime, when given, that is
/// positive and at most 100 years (the runner shortens it to `[sessions] max_lifetime`). Whether the rank
/// and kind exist for the job only the job can tell: the runner refuses those with their own reasons.
pub fn open_session(m: &OpenSession) -> Result<(), ValidationError> {
    job_id(&m.job_id)?;
    kind("kind", m.kind)?;
    if let Some(lifetime) = &m.lifetime {
        time_allocation("lifetime", lifetime)?;
    }
    Ok(())
}

/// A reply: either a session with the job id and kind of its request, a URL and an expiry, or a
/// refusal with a reason.
///
/// The refusal of a request that did not decode may have no job id and no kind (nothing readable to
/// echo); an id it has is a valid one.
pub fn session_reply(m: &SessionReply) -> Result<(), ValidationError> {
    match &m.result {
        None => Err(ValidationError::missing("opened")),
        Some(Outcome::Opened(o)) => {
            job_id(&m.job_id)?;
            kind("kind", m.kind)?;
            if o.url.is_empty() {
                return Err(ValidationError::missing("opened.url"));
            }
            // As the schema's pattern `^https?://[^\s]+$`: a scheme, then something, and no whitespace.
            let rest = o
                .url
                .strip_prefix("https://")
                .or_else(|| o.url.strip_prefix("http://"));
            if !rest.is_some_and(|r| !r.is_empty() && !r.chars().any(char::is_whitespace)) {
                return Err(ValidationError::invalid(
                    "opened.url",
                    "must be an http:// or https:// URL without whitespace",
                ));
            }
            match &o.expires_at {
                None => Err(ValidationError::missing("opened.expiresAt")),
                Some(t) => super::timestamp("opened.expiresAt", t),
            }
        }
        Some(Outcome::Refused(r)) => {
            if !m.job_id.is_empty() {
                job_id(&m.job_id)?;
            }
            if m.kind != 0 {
                kind("kind", m.kind)?;
            }
            if r.reason.is_empty() {
                return Err(ValidationError::missing("refused.reason"));
            }
            Ok(())
        }
    }
}

fn kind(field: &str, value: i32) -> Result<(), ValidationError> {
    match SessionKind::try_from(value) {
        Ok(SessionKind::Unspecified) => Err(ValidationError::missing(field)),
        Ok(_) => Ok(()),
        Err(_) => Err(ValidationError::new(
            ErrorKind::Invalid,
            field,
            format!(
                "{value} is not a session kind: expected SESSION_KIND_WEB, SESSION_KIND_VNC or SESSION_KIND_TERMINAL"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> OpenSession {
        OpenSession {
            job_id: "4818".into(),
            rank: 0,
            kind: SessionKind::Web as i32,
            lifetime: None,
        }
    }

    #[test]
    fn requests_are_checked_naming_the_field() {
        open_session(&request()).unwrap();
        let mut m = request();
        m.kind = 0;
        assert_eq!(open_session(&m).unwrap_err().field(), "kind");
        m.kind = 9;
        assert_eq!(open_session(&m).unwrap_err().field(), "kind");
        let mut m = request();
        m.job_id = "Not A Job".into();
        assert_eq!(open_session(&m).unwrap_err().field(), "jobId");
        let mut m = request();
        m.lifetime = Some(pbjson_types::Duration {
            seconds: -5,
            nanos: 0,
        });
        assert_eq!(open_session(&m).unwrap_err().field(), "lifetime");
    }
}
